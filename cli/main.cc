// clusterprof: the command line tool. Parses flags and runs a subcommand from commands.h.
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/commands.h"
#include "cli/completion.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "common/base/strings.h"
#include "common/grpc/log_bridge.h"
#include "google/protobuf/stubs/logging.h"
#include "pplx/threadpool.h"
#include "spdlog/spdlog.h"

namespace {

// The kubectl plugin: `kubectl clusterprof VERB` runs this binary as kubectl-clusterprof.
bool RunsAsKubectlPlugin(const char* argv0) {
  const std::string name = std::filesystem::path(argv0).filename().string();
  return name == "kubectl-clusterprof" || name == "kubectl_complete-clusterprof";
}

// kubectl's completion of a plugin runs kubectl_complete-<plugin> with the words.
bool RunsAsPluginCompletion(const char* argv0) {
  return std::filesystem::path(argv0).filename().string() == "kubectl_complete-clusterprof";
}

void AddKubeFlags(CLI::App* command, clusterprof::cli::KubeFlags& flags) {
  command->add_option("-n,--namespace", flags.namespace_,
                      "The namespace (default: the context's, as kubectl)");
  command->add_option("--context", flags.context, "The kubeconfig context to use");
  command->add_option("--kubeconfig", flags.kubeconfig,
                      "Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)");
}

void AddTransportFlags(CLI::App* command, clusterprof::cli::TransportFlags* flags) {
  command->add_option("--tls-ca", flags->tls_ca,
                      "Reach the sidecars over TLS, verifying their certificate against this CA "
                      "file (the chart's: the ca.crt of the Secret clusterprof-sidecar-tls)");
  command
      ->add_option("--tls-server-name", flags->tls_server_name,
                   "The name verified in the sidecars' certificate (the chart's "
                   "sidecar.tls.serverName)")
      ->capture_default_str();
  command->add_flag("--insecure", flags->insecure,
                    "Reach the sidecars in plaintext (without --tls-ca or this, only targets on "
                    "loopback are dialled, in plaintext: local sidecars, kubectl port-forward)");
}

// A duration flag taking kubectl's form (5s, 500ms, 1m30s).
CLI::Option* AddDuration(CLI::App* command, const std::string& name, int64_t& ms,
                         const std::string& help) {
  return command
      ->add_option_function<std::string>(
          name,
          [&ms, name](const std::string& text) {
            absl::StatusOr<int64_t> parsed = clusterprof::cli::ParseDurationMs(text);
            if (!parsed.ok())
              throw CLI::ValidationError(name, std::string(parsed.status().message()));
            ms = *parsed;
          },
          help)
      ->type_name("DURATION");
}

}  // namespace

int main(int argc, char** argv) {
  clusterprof::ApplyProcessSettings();
  // cpprestsdk's HTTP clients (gs:// uploads) run on its thread pool, 40 threads by default; our
  // callers block on them from threads of their own, so 2 do: a 1 GiB upload then holds half the
  // memory, with fewer handoffs between threads (bench/RESULTS.md).
  crossplat::threadpool::initialize_with_threads(2);
  const bool plugin = RunsAsKubectlPlugin(argv[0]);
  CLI::App app{plugin
                   ? "Profile ML jobs on Kubernetes: one synchronized capture of every pod, "
                     "with the verdict on who holds the job back"
                   : "clusterprof: synchronized profiles of ML jobs, and tools for their traces"};
  app.name(plugin ? "kubectl clusterprof" : "clusterprof");
  // Verbs that talk to profiler servers or run directories directly; the plugin has its own
  // capture and report, on ProfileJobs, and leaves these out.
  CLI::App detached;
  CLI::App* local = plugin ? &detached : &app;
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("clusterprof 0.1.0"));

  clusterprof::cli::ConvertOptions convert;
  CLI::App* convert_cmd = app.add_subcommand(
      "convert", "Convert an .xplane.pb (or a run directory) into a trace for Perfetto");
  convert_cmd
      ->add_option("input", convert.input, "The .xplane.pb file (with --run: a run directory)")
      ->required();
  convert_cmd->add_flag("--run", convert.run,
                        "One trace of every host of a run directory, on one clock (a process per "
                        "host and plane)");
  std::string convert_format = "json";
  CLI::Option* format_option =
      convert_cmd
          ->add_option("--format", convert_format,
                       "json: Chrome trace JSON; perfetto: Perfetto's own protobuf format, "
                       "several times smaller and faster to load; perfetto-json: the JSON "
                       "without its top-level metadata key (perfetto_trace.json.gz shape)")
          ->check(CLI::IsMember({"json", "perfetto", "perfetto-json"}))
          ->capture_default_str();
  convert_cmd->add_option("-o,--output", convert.output,
                          "Output file (default: <input>.trace.json.gz, or <input>.perfetto-trace "
                          "with --format perfetto; JSON ending in .json is written uncompressed, "
                          "a Perfetto trace ending in .gz gzipped; - writes to stdout)");
  // The old spelling of --format perfetto-json, kept for scripts.
  bool legacy_perfetto = false;
  convert_cmd->add_flag("--perfetto", legacy_perfetto, "Same as --format perfetto-json")->group("");
  convert_cmd->add_option("--gzip-level", convert.gzip_level, "gzip level, 0-9")
      ->check(CLI::Range(0, 9))
      ->capture_default_str();

  clusterprof::cli::InspectOptions inspect;
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect", "Summarize a run directory, a logdir or an .xplane.pb file");
  inspect_cmd->add_option("path", inspect.path, "Run directory, logdir or .xplane.pb file")
      ->required();
  inspect_cmd->add_option("--top", inspect.top, "How many top events to list")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  inspect_cmd->add_flag("--brief", inspect.brief, "For a run directory, only the table of hosts");
  inspect_cmd->add_option("--max-lines", inspect.max_lines, "Lines listed per plane")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();

  clusterprof::cli::ReportOptions report;
  CLI::App* report_cmd = local->add_subcommand(
      "report", "Which host holds the job back: step times and stragglers of a run directory");
  report_cmd->add_option("path", report.path, "Run directory (<logdir>/plugins/profile/<run>)")
      ->required();
  report_cmd->add_option("--json", report.json, "Also write the report as JSON to this file");
  report_cmd->add_option("--html", report.html,
                         "Also write the report as one self-contained HTML page to this file");
  report_cmd->add_option("--step-pattern", report.step_pattern,
                         "Regular expression for the step markers' names (default: events with "
                         "a step_num stat)");
  report_cmd->add_option("--collective-pattern", report.collective_pattern,
                         "Regular expression for collectives' names (default: NCCL kernels, XLA "
                         "collectives, allreduce annotations)");
  report_cmd->add_option("--input-pattern", report.input_pattern,
                         "Regular expression for input-pipeline events (default: data loaders, "
                         "iterators, infeed)");
  report_cmd->add_flag("!--no-progress", report.progress, "No progress lines");
  report_cmd->add_flag("--all", report.all,
                       "A row for every host (default: over 25 hosts, the 20 worst and one "
                       "line for the rest)");

  clusterprof::cli::CaptureOptions capture;
  CLI::App* capture_cmd = local->add_subcommand(
      "capture",
      "Capture one synchronized trace from profiler servers (clusterprof sidecars, or TF/JAX "
      "profiler servers), as tf.profiler.experimental.client.trace does");
  capture_cmd
      ->add_option("--service-addr", capture.service_addr,
                   "host:port[,host:port...] (grpc:// prefixes are accepted)")
      ->required();
  capture_cmd
      ->add_option("--logdir", capture.logdir,
                   "TensorBoard/XProf logdir: the run goes to <logdir>/plugins/profile/<run>")
      ->required();
  capture_cmd->add_option("--duration-ms", capture.duration_ms, "Capture length")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  capture_cmd->add_option("--delay-ms", capture.delay_ms, "Start this long from now")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  capture_cmd
      ->add_option("--num-tracing-attempts", capture.num_tracing_attempts,
                   "Attempts per host for retryable failures")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  // The levels and --option go straight into the ProfileOptions every host is sent.
  tensorflow::ProfileOptions& profile = capture.profile;
  capture_cmd
      ->add_option_function<uint32_t>(
          "--host-tracer-level",
          [&profile](uint32_t level) { profile.set_host_tracer_level(level); },
          "Annotations: 0 off, 1 critical, 2 info, 3 verbose")
      ->check(CLI::Range(0, 3))
      ->default_str(std::to_string(profile.host_tracer_level()));
  capture_cmd->add_option("--token-file", capture.token_file,
                          "File with the bearer token of sidecars started with --auth-token-file");
  AddTransportFlags(capture_cmd, &capture.transport);
  capture_cmd
      ->add_option_function<uint32_t>(
          "--device-tracer-level",
          [&profile](uint32_t level) { profile.set_device_tracer_level(level); },
          "GPU activity: 0 off, 1 on")
      ->check(CLI::Range(0, 1))
      ->default_str(std::to_string(profile.device_tracer_level()));
  capture_cmd
      ->add_option_function<uint32_t>(
          "--python-tracer-level",
          [&profile](uint32_t level) { profile.set_python_tracer_level(level); },
          "Python function tracing in framework servers: 0 off, 1 on")
      ->check(CLI::Range(0, 1))
      ->default_str(std::to_string(profile.python_tracer_level()));
  capture_cmd->add_option_function<std::vector<std::string>>(
      "--option",
      [&profile](const std::vector<std::string>& options) {
        for (const std::string& option : options) {
          if (absl::Status set = clusterprof::proto::SetAdvancedOption(option, &profile);
              !set.ok()) {
            throw CLI::ValidationError("--option", std::string(set.message()));
          }
        }
      },
      "KEY=VALUE for ProfileOptions.advanced_configuration, repeatable (true/false: a bool, an "
      "integer: an int64, else a string); e.g. --option gpu_enable_nvtx_tracking=true");
  capture_cmd
      ->add_option_function<int64_t>(
          "--lookback-ms",
          [&profile](int64_t lookback_ms) {
            (*profile.mutable_advanced_configuration())[clusterprof::proto::kLookbackMsKey]
                .set_int64_value(lookback_ms);
          },
          "Reach back this long before the start: the annotations the sidecars' flight "
          "recorders kept (at most their --recorder-window-ms; docs/triggers.md)")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}));
  capture_cmd->add_option("--run", capture.run,
                          "Run name (default: the capture's UTC time, YYYY_MM_DD_HH_MM_SS)");
  capture_cmd->add_option("--host-names", capture.host_names,
                          "Comma list of host names, one per address (default: each sidecar's "
                          "own name, else the address)");
  capture_cmd->add_flag("!--no-progress", capture.progress, "No live progress lines");
  capture_cmd->add_flag("--all", capture.all,
                        "A summary row for every host (default: over 25 hosts, those that need "
                        "attention and one line for the rest)");

  // The kubectl plugin's verbs, on ProfileJobs. As `clusterprof` they are `clusterprof kube ...`.
  CLI::App* kube_parent = plugin ? &app
                                 : app.add_subcommand("kube",
                                                      "The kubectl plugin's verbs (capture, "
                                                      "report, pull) on ProfileJobs");
  clusterprof::cli::KubeCaptureOptions kube_capture;
  CLI::App* kube_capture_cmd = kube_parent->add_subcommand(
      "capture",
      "Capture every pod a selector matches, at one instant: creates a ProfileJob, follows it, "
      "prints the verdict (non-zero exit when it fails)");
  AddKubeFlags(kube_capture_cmd, kube_capture.kube);
  kube_capture_cmd->add_option("-l,--selector", kube_capture.selector,
                               "The pods, as kubectl get pods -l takes them (app=trainer)");
  AddDuration(kube_capture_cmd, "--duration", kube_capture.duration_ms,
              "How long to capture (default 2s)");
  AddDuration(kube_capture_cmd, "--delay", kube_capture.delay_ms,
              "Start this long after the job is scheduled (default 1s)");
  AddDuration(kube_capture_cmd, "--lookback", kube_capture.lookback_ms,
              "Reach back this long before the start: what the sidecars' flight recorders kept");
  kube_capture_cmd->add_option("--logdir", kube_capture.logdir,
                               "Where the run goes (gs://bucket/prefix or a path the sidecars "
                               "write); default $CLUSTERPROF_LOGDIR");
  kube_capture_cmd->add_option("--name", kube_capture.name,
                               "The ProfileJob's name (default: capture-<random>)");
  kube_capture_cmd
      ->add_option("--wait", kube_capture.wait_seconds,
                   "Seconds the job waits for pods still starting (spec.targets.waitSeconds; "
                   "default the CRD's, 120)")
      ->check(CLI::Range(0, 86400));
  kube_capture_cmd
      ->add_option("--host-tracer-level", kube_capture.host_tracer_level,
                   "Annotations: 0 off, 1 critical, 2 info, 3 verbose")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  kube_capture_cmd
      ->add_option("--device-tracer-level", kube_capture.device_tracer_level,
                   "GPU activity: 0 off, 1 on")
      ->check(CLI::Range(0, 2))
      ->capture_default_str();
  kube_capture_cmd
      ->add_option("--python-tracer-level", kube_capture.python_tracer_level,
                   "Python function tracing in framework servers: 0 off, 1 on")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  kube_capture_cmd->add_flag("--force", kube_capture.force,
                             "Create the ProfileJob even when no pod matches yet");
  kube_capture_cmd->add_flag("!--no-progress", kube_capture.progress, "No live progress line");

  clusterprof::cli::KubeJobOptions kube_report;
  CLI::App* kube_report_cmd = kube_parent->add_subcommand(
      "report", "The verdict of a ProfileJob, and its report files from the logdir");
  AddKubeFlags(kube_report_cmd, kube_report.kube);
  kube_report_cmd->add_option("profilejob", kube_report.job, "The ProfileJob's name")->required();
  kube_report_cmd->add_option("-o,--output", kube_report.output,
                              "Folder for the report files (default <profilejob>-report)");

  clusterprof::cli::KubeJobOptions kube_pull;
  CLI::App* kube_pull_cmd = kube_parent->add_subcommand(
      "pull", "Copy a ProfileJob's run directory here: every host file, the manifest, the report");
  AddKubeFlags(kube_pull_cmd, kube_pull.kube);
  kube_pull_cmd->add_option("profilejob", kube_pull.job, "The ProfileJob's name")->required();
  kube_pull_cmd->add_option("-o,--output", kube_pull.output,
                            "A local logdir (default <profilejob>); the run goes to "
                            "<output>/plugins/profile/<run>");

  std::string shell;
  CLI::App* completion_cmd =
      app.add_subcommand("completion",
                         "Print the shell completion script (bash or zsh); source it to complete "
                         "verbs, flags, namespaces and ProfileJob names");
  completion_cmd->add_option("shell", shell, "bash or zsh")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh"}));
  completion_cmd->footer(plugin ? "\nkubectl completes the plugin's verbs itself once "
                                  "kubectl_complete-clusterprof (installed beside it) is on PATH.\n"
                                  "\nExample:\n  source <(kubectl clusterprof completion bash)"
                                : "\nExample:\n  source <(clusterprof completion bash)");

  clusterprof::cli::TopOptions top;
  CLI::App* top_cmd = local->add_subcommand(
      "top",
      "Every host's live step time, how late it enters the collectives, and the verdict, "
      "refreshing in place (the sidecars' live step telemetry; no capture)");
  top_cmd->add_option("--service-addr", top.service_addr,
                      "host:port[,host:port...] of clusterprof sidecars");
  top_cmd->add_option("--operator-addr", top.operator_addr,
                      "Or the operator's health port (host:port, e.g. kubectl port-forward to "
                      "the leading replica's 8081), with --profiletrigger");
  top_cmd->add_option("--profiletrigger", top.profile_trigger,
                      "NAMESPACE/NAME of the ProfileTrigger whose pods to show, as the operator "
                      "follows them");
  top_cmd->add_option("--token-file", top.token_file,
                      "File with the bearer token of sidecars started with --auth-token-file");
  AddTransportFlags(top_cmd, &top.transport);
  top_cmd->add_option("--steps", top.steps, "The last this many steps make each row")
      ->check(CLI::Range(2, 1000))
      ->capture_default_str();
  top_cmd->add_option("--interval-ms", top.interval_ms, "How often the table is drawn again")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}))
      ->capture_default_str();
  top_cmd->add_flag("--once", top.once,
                    "Print one table once every host has sent steps (or after --timeout-ms), "
                    "then exit (1 if a host could not be reached)");
  top_cmd->add_option("--timeout-ms", top.timeout_ms, "With --once: how long to wait for steps")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  top_cmd->add_option("--seconds", top.seconds, "Stop after this long (0: until Ctrl-C)")
      ->check(CLI::NonNegativeNumber);

  // One example per subcommand: in the tool's help, and in each subcommand's.
  std::vector<std::pair<CLI::App*, std::string>> examples = {
      {capture_cmd,
       "clusterprof capture --service-addr 10.0.0.7:8466,10.0.0.8:8466 --logdir gs://b/logs "
       "--duration-ms 2000"},
      {inspect_cmd, "clusterprof inspect logs/plugins/profile/2026_11_26_10_00_00"},
      {report_cmd, "clusterprof report logs/plugins/profile/2026_11_26_10_00_00 --html r.html"},
      {convert_cmd, "clusterprof convert --format perfetto host-0.xplane.pb"},
      {top_cmd, "clusterprof top --service-addr 10.0.0.7:8466,10.0.0.8:8466"},
  };
  const std::vector<std::pair<CLI::App*, std::string>> kube_examples = {
      {kube_capture_cmd,
       clusterprof::StrCat(plugin ? "kubectl clusterprof" : "clusterprof kube",
                           " capture -n training -l app=llama-trainer --duration 5s --logdir "
                           "gs://my-bucket/tensorboard")},
      {kube_report_cmd, clusterprof::StrCat(plugin ? "kubectl clusterprof" : "clusterprof kube",
                                            " report capture-x7k2p")},
      {kube_pull_cmd, clusterprof::StrCat(plugin ? "kubectl clusterprof" : "clusterprof kube",
                                          " pull capture-x7k2p -o runs")},
  };
  for (const auto& [command, example] : kube_examples) {
    command->footer("\nExample:\n  " + example);
  }
  std::string footer = "\nExamples:";
  if (plugin) {
    for (const auto& [command, example] : kube_examples) footer += "\n  " + example;
  }
  for (auto& [command, example] : examples) {
    if (plugin && command->get_parent() != &app) continue;
    if (plugin) example = "kubectl " + example;
    footer += "\n  " + example;
    command->footer("\nExample:\n  " + example);
  }
  app.footer(footer);
  if (RunsAsPluginCompletion(argv[0])) {
    return clusterprof::cli::Complete(app, std::vector<std::string>(argv + 1, argv + argc),
                                      std::cout);
  }
  if (argc >= 2 && std::string_view(argv[1]) == "__complete") {
    return clusterprof::cli::Complete(app, std::vector<std::string>(argv + 2, argv + argc),
                                      std::cout);
  }
  // As kubectl does: the tool, or a subcommand, given no arguments at all prints its help.
  if (argc == 1) {
    std::cout << app.help();
    return 0;
  }
  if (argc == 2) {
    for (const auto& list : {examples, kube_examples}) {
      for (const auto& [command, example] : list) {
        if (command->get_name() == argv[1] && command->get_parent() == &app) {
          std::cout << command->help(app.get_name());
          return 0;
        }
      }
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other flag error is a usage error (exit 2).
    const int code = app.exit(e);
    return code == 0 ? 0 : clusterprof::cli::kExitUsage;
  }
  (void)clusterprof::InitLogging(clusterprof::LogFormat::kText, "warn");
  // gRPC's own lines (a sidecar's certificate refused, as this client sees it) as ours,
  // rate-limited, instead of raw lines on stderr; the capture's own message names the cause.
  clusterprof::grpclog::LogBridge grpc_log({});
  (void)grpc_log.Install();
  // protobuf explains parse failures (e.g. invalid UTF-8 in a string field) through its log;
  // show that as a warning next to our own error instead of a raw "[libprotobuf ERROR ...]".
  google::protobuf::SetLogHandler(
      +[](google::protobuf::LogLevel level, const char* file, int line, const std::string& msg) {
        spdlog::warn("protobuf: {}", msg);
      });

  if (*completion_cmd) {
    std::cout << clusterprof::cli::CompletionScript(shell,
                                                    plugin ? "kubectl-clusterprof" : "clusterprof");
    return 0;
  }
  if (*kube_capture_cmd) {
    return clusterprof::cli::RunKubeCapture(kube_capture, std::cout, std::cerr);
  }
  if (*kube_report_cmd) return clusterprof::cli::RunKubeReport(kube_report, std::cout, std::cerr);
  if (*kube_pull_cmd) return clusterprof::cli::RunKubePull(kube_pull, std::cout, std::cerr);
  if (*capture_cmd) return clusterprof::cli::RunCapture(capture, std::cout, std::cerr);
  if (*convert_cmd) {
    using clusterprof::cli::ConvertFormat;
    if (legacy_perfetto && format_option->count() > 0 && convert_format != "perfetto-json") {
      std::cerr << "clusterprof convert: --perfetto means --format perfetto-json; give only "
                   "--format "
                << convert_format << "\n";
      return clusterprof::cli::kExitUsage;
    }
    convert.format = legacy_perfetto || convert_format == "perfetto-json"
                         ? ConvertFormat::kPerfettoJson
                     : convert_format == "perfetto" ? ConvertFormat::kPerfetto
                                                    : ConvertFormat::kJson;
    return clusterprof::cli::RunConvert(convert, std::cout, std::cerr);
  }
  if (*inspect_cmd) return clusterprof::cli::RunInspect(inspect, std::cout, std::cerr);
  if (*report_cmd) return clusterprof::cli::RunReport(report, std::cout, std::cerr);
  if (*top_cmd) return clusterprof::cli::RunTop(top, std::cout, std::cerr);
  return clusterprof::cli::kExitUsage;
}
