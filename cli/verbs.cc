#include "cli/verbs.h"

#include <algorithm>

#include "CLI/CLI.hpp"
#include "cli/commands.h"
#include "cli/completion.h"
#include "common/base/strings.h"

namespace clusterprof::cli {
namespace {

void AddKubeFlags(CLI::App* command, KubeFlags* flags) {
  command->add_option("-n,--namespace", flags->namespace_,
                      "The namespace (default: the context's, as kubectl)");
  command->add_option("--context", flags->context, "The kubeconfig context to use");
  command->add_option("--kubeconfig", flags->kubeconfig,
                      "Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)");
}

void AddTransportFlags(CLI::App* command, TransportFlags* flags) {
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
CLI::Option* AddDuration(CLI::App* command, const std::string& name, int64_t* ms,
                         const std::string& help) {
  return command
      ->add_option_function<std::string>(
          name,
          [ms, name](const std::string& text) {
            absl::StatusOr<int64_t> parsed = ParseDurationMs(text);
            if (!parsed.ok())
              throw CLI::ValidationError(name, std::string(parsed.status().message()));
            *ms = *parsed;
          },
          help)
      ->type_name("DURATION");
}

// A tracer level flag that sets a field of the ProfileOptions every host is sent.
void AddLevel(CLI::App* command, const std::string& name, int max,
              std::function<void(uint32_t)> set, uint32_t initial, const std::string& help) {
  command->add_option_function<uint32_t>(name, std::move(set), help)
      ->check(CLI::Range(0, max))
      ->default_str(std::to_string(initial));
}

}  // namespace

// What the verbs' flags are parsed into.
struct Verbs::Options {
  ConvertOptions convert;
  std::string convert_format = "json";
  bool legacy_perfetto = false;
  CLI::Option* format_option = nullptr;
  InspectOptions inspect;
  ReportOptions report;
  CaptureOptions capture;
  KubeCaptureOptions kube_capture;
  KubeJobOptions kube_report;
  KubeJobOptions kube_pull;
  std::string shell;
  TopOptions top;
};

Verbs::Verbs(CLI::App* app, bool plugin)
    : app_(app),
      plugin_(plugin),
      detached_(std::make_unique<CLI::App>()),
      options_(std::make_unique<Options>()) {
  // Verbs that talk to profiler servers or run directories directly; the plugin has its own
  // capture and report, on ProfileJobs, and leaves these out.
  CLI::App* local = plugin ? detached_.get() : app;
  verbs_.push_back(AddConvert(app));
  verbs_.push_back(AddInspect(app));
  verbs_.push_back(AddReport(local));
  verbs_.push_back(AddCapture(local));
  // The kubectl plugin's verbs, on ProfileJobs. As `clusterprof` they are `clusterprof kube ...`.
  CLI::App* kube =
      plugin ? app
             : app->add_subcommand("kube",
                                   "The kubectl plugin's verbs (capture, report, pull) on "
                                   "ProfileJobs");
  verbs_.push_back(AddKubeCapture(kube));
  verbs_.push_back(AddKubeReport(kube));
  verbs_.push_back(AddKubePull(kube));
  verbs_.push_back(AddCompletion(app));
  verbs_.push_back(AddTop(local));
  AddExamples();
}

Verbs::~Verbs() = default;

Verbs::Verb Verbs::AddConvert(CLI::App* parent) {
  ConvertOptions& convert = options_->convert;
  CLI::App* command = parent->add_subcommand(
      "convert", "Convert an .xplane.pb (or a run directory) into a trace for Perfetto");
  command->add_option("input", convert.input, "The .xplane.pb file (with --run: a run directory)")
      ->required();
  command->add_flag("--run", convert.run,
                    "One trace of every host of a run directory, on one clock (a process per "
                    "host and plane)");
  options_->format_option =
      command
          ->add_option("--format", options_->convert_format,
                       "json: Chrome trace JSON; perfetto: Perfetto's own protobuf format, "
                       "several times smaller and faster to load; perfetto-json: the JSON "
                       "without its top-level metadata key (perfetto_trace.json.gz shape)")
          ->check(CLI::IsMember({"json", "perfetto", "perfetto-json"}))
          ->capture_default_str();
  command->add_option("-o,--output", convert.output,
                      "Output file (default: <input>.trace.json.gz, or <input>.perfetto-trace "
                      "with --format perfetto; JSON ending in .json is written uncompressed, a "
                      "Perfetto trace ending in .gz gzipped; - writes to stdout)");
  // The old spelling of --format perfetto-json, kept for scripts.
  command->add_flag("--perfetto", options_->legacy_perfetto, "Same as --format perfetto-json")
      ->group("");
  command->add_option("--gzip-level", convert.gzip_level, "gzip level, 0-9")
      ->check(CLI::Range(0, 9))
      ->capture_default_str();
  auto run = [options = options_.get()](std::ostream& out, std::ostream& err) {
    const std::string& format = options->convert_format;
    if (options->legacy_perfetto && options->format_option->count() > 0 &&
        format != "perfetto-json") {
      err << "clusterprof convert: --perfetto means --format perfetto-json; give only --format "
          << format << "\n";
      return kExitUsage;
    }
    options->convert.format = options->legacy_perfetto || format == "perfetto-json"
                                  ? ConvertFormat::kPerfettoJson
                              : format == "perfetto" ? ConvertFormat::kPerfetto
                                                     : ConvertFormat::kJson;
    return RunConvert(options->convert, out, err);
  };
  return {command, "convert --format perfetto host-0.xplane.pb", run};
}

Verbs::Verb Verbs::AddInspect(CLI::App* parent) {
  InspectOptions& inspect = options_->inspect;
  CLI::App* command = parent->add_subcommand(
      "inspect", "Summarize a run directory, a logdir or an .xplane.pb file");
  command->add_option("path", inspect.path, "Run directory, logdir or .xplane.pb file")->required();
  command->add_option("--top", inspect.top, "How many top events to list")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  command->add_flag("--brief", inspect.brief, "For a run directory, only the table of hosts");
  command->add_option("--max-lines", inspect.max_lines, "Lines listed per plane")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  return {
      command, "inspect logs/plugins/profile/2026_11_26_10_00_00",
      [&inspect](std::ostream& out, std::ostream& err) { return RunInspect(inspect, out, err); }};
}

Verbs::Verb Verbs::AddReport(CLI::App* parent) {
  ReportOptions& report = options_->report;
  CLI::App* command = parent->add_subcommand(
      "report", "Which host holds the job back: step times and stragglers of a run directory");
  command->add_option("path", report.path, "Run directory (<logdir>/plugins/profile/<run>)")
      ->required();
  command->add_option("--json", report.json, "Also write the report as JSON to this file");
  command->add_option("--html", report.html,
                      "Also write the report as one self-contained HTML page to this file");
  command->add_option("--step-pattern", report.step_pattern,
                      "Regular expression for the step markers' names (default: events with a "
                      "step_num stat)");
  command->add_option("--collective-pattern", report.collective_pattern,
                      "Regular expression for collectives' names (default: NCCL kernels, XLA "
                      "collectives, allreduce annotations)");
  command->add_option("--input-pattern", report.input_pattern,
                      "Regular expression for input-pipeline events (default: data loaders, "
                      "iterators, infeed)");
  command->add_flag("!--no-progress", report.progress, "No progress lines");
  command->add_flag("--all", report.all,
                    "A row for every host (default: over 25 hosts, the 20 worst and one line for "
                    "the rest)");
  return {command, "report logs/plugins/profile/2026_11_26_10_00_00 --html r.html",
          [&report](std::ostream& out, std::ostream& err) { return RunReport(report, out, err); }};
}

Verbs::Verb Verbs::AddCapture(CLI::App* parent) {
  CaptureOptions& capture = options_->capture;
  CLI::App* command = parent->add_subcommand(
      "capture",
      "Capture one synchronized trace from profiler servers (clusterprof sidecars, or TF/JAX "
      "profiler servers), as tf.profiler.experimental.client.trace does");
  command
      ->add_option("--service-addr", capture.service_addr,
                   "host:port[,host:port...] (grpc:// prefixes are accepted)")
      ->required();
  command
      ->add_option("--logdir", capture.logdir,
                   "TensorBoard/XProf logdir: the run goes to <logdir>/plugins/profile/<run>")
      ->required();
  command->add_option("--duration-ms", capture.duration_ms, "Capture length")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--delay-ms", capture.delay_ms, "Start this long from now")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command
      ->add_option("--num-tracing-attempts", capture.num_tracing_attempts,
                   "Attempts per host for retryable failures")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  // The levels and --option go straight into the ProfileOptions every host is sent.
  tensorflow::ProfileOptions* profile = &capture.profile;
  AddLevel(
      command, "--host-tracer-level", 3,
      [profile](uint32_t level) { profile->set_host_tracer_level(level); },
      profile->host_tracer_level(), "Annotations: 0 off, 1 critical, 2 info, 3 verbose");
  command->add_option("--token-file", capture.token_file,
                      "File with the bearer token of sidecars started with --auth-token-file");
  AddTransportFlags(command, &capture.transport);
  AddLevel(
      command, "--device-tracer-level", 1,
      [profile](uint32_t level) { profile->set_device_tracer_level(level); },
      profile->device_tracer_level(), "GPU activity: 0 off, 1 on");
  AddLevel(
      command, "--python-tracer-level", 1,
      [profile](uint32_t level) { profile->set_python_tracer_level(level); },
      profile->python_tracer_level(), "Python function tracing in framework servers: 0 off, 1 on");
  command->add_option_function<std::vector<std::string>>(
      "--option",
      [profile](const std::vector<std::string>& options) {
        for (const std::string& option : options) {
          if (absl::Status set = proto::SetAdvancedOption(option, profile); !set.ok()) {
            throw CLI::ValidationError("--option", std::string(set.message()));
          }
        }
      },
      "KEY=VALUE for ProfileOptions.advanced_configuration, repeatable (true/false: a bool, an "
      "integer: an int64, else a string); e.g. --option gpu_enable_nvtx_tracking=true");
  command
      ->add_option_function<int64_t>(
          "--lookback-ms",
          [profile](int64_t lookback_ms) {
            (*profile->mutable_advanced_configuration())[proto::kLookbackMsKey].set_int64_value(
                lookback_ms);
          },
          "Reach back this long before the start: the annotations the sidecars' flight "
          "recorders kept (at most their --recorder-window-ms; docs/triggers.md)")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}));
  command->add_option("--run", capture.run,
                      "Run name (default: the capture's UTC time, YYYY_MM_DD_HH_MM_SS)");
  command->add_option("--host-names", capture.host_names,
                      "Comma list of host names, one per address (default: each sidecar's own "
                      "name, else the address)");
  command->add_flag("!--no-progress", capture.progress, "No live progress lines");
  command->add_flag("--all", capture.all,
                    "A summary row for every host (default: over 25 hosts, those that need "
                    "attention and one line for the rest)");
  return {
      command,
      "capture --service-addr 10.0.0.7:8466,10.0.0.8:8466 --logdir gs://b/logs "
      "--duration-ms 2000",
      [&capture](std::ostream& out, std::ostream& err) { return RunCapture(capture, out, err); }};
}

Verbs::Verb Verbs::AddKubeCapture(CLI::App* parent) {
  KubeCaptureOptions& options = options_->kube_capture;
  CLI::App* command = parent->add_subcommand(
      "capture",
      "Capture every pod a selector matches, at one instant: creates a ProfileJob, follows it, "
      "prints the verdict (non-zero exit when it fails)");
  AddKubeFlags(command, &options.kube);
  command->add_option("-l,--selector", options.selector,
                      "The pods, as kubectl get pods -l takes them (app=trainer)");
  AddDuration(command, "--duration", &options.duration_ms, "How long to capture (default 2s)");
  AddDuration(command, "--delay", &options.delay_ms,
              "Start this long after the job is scheduled (default 1s)");
  AddDuration(command, "--lookback", &options.lookback_ms,
              "Reach back this long before the start: what the sidecars' flight recorders kept");
  command->add_option("--logdir", options.logdir,
                      "Where the run goes (gs://bucket/prefix or a path the sidecars write); "
                      "default $CLUSTERPROF_LOGDIR");
  command->add_option("--name", options.name, "The ProfileJob's name (default: capture-<random>)");
  command
      ->add_option("--wait", options.wait_seconds,
                   "Seconds the job waits for pods still starting (spec.targets.waitSeconds; "
                   "default the CRD's, 120)")
      ->check(CLI::Range(0, 86400));
  command
      ->add_option("--host-tracer-level", options.host_tracer_level,
                   "Annotations: 0 off, 1 critical, 2 info, 3 verbose")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  command
      ->add_option("--device-tracer-level", options.device_tracer_level,
                   "GPU activity: 0 off, 1 on")
      ->check(CLI::Range(0, 2))
      ->capture_default_str();
  command
      ->add_option("--python-tracer-level", options.python_tracer_level,
                   "Python function tracing in framework servers: 0 off, 1 on")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  command->add_flag("--force", options.force, "Create the ProfileJob even when no pod matches yet");
  command->add_flag("!--no-progress", options.progress, "No live progress line");
  return {command,
          "capture -n training -l app=llama-trainer --duration 5s --logdir "
          "gs://my-bucket/tensorboard",
          [&options](std::ostream& out, std::ostream& err) {
            return RunKubeCapture(options, out, err);
          },
          /*kube=*/true};
}

Verbs::Verb Verbs::AddKubeReport(CLI::App* parent) {
  KubeJobOptions& options = options_->kube_report;
  CLI::App* command = parent->add_subcommand(
      "report", "The verdict of a ProfileJob, and its report files from the logdir");
  AddKubeFlags(command, &options.kube);
  command->add_option("profilejob", options.job, "The ProfileJob's name")->required();
  command->add_option("-o,--output", options.output,
                      "Folder for the report files (default <profilejob>-report)");
  return {
      command, "report capture-x7k2p",
      [&options](std::ostream& out, std::ostream& err) { return RunKubeReport(options, out, err); },
      /*kube=*/true};
}

Verbs::Verb Verbs::AddKubePull(CLI::App* parent) {
  KubeJobOptions& options = options_->kube_pull;
  CLI::App* command = parent->add_subcommand(
      "pull", "Copy a ProfileJob's run directory here: every host file, the manifest, the report");
  AddKubeFlags(command, &options.kube);
  command->add_option("profilejob", options.job, "The ProfileJob's name")->required();
  command->add_option("-o,--output", options.output,
                      "A local logdir (default <profilejob>); the run goes to "
                      "<output>/plugins/profile/<run>");
  return {
      command, "pull capture-x7k2p -o runs",
      [&options](std::ostream& out, std::ostream& err) { return RunKubePull(options, out, err); },
      /*kube=*/true};
}

Verbs::Verb Verbs::AddCompletion(CLI::App* parent) {
  CLI::App* command =
      parent->add_subcommand("completion",
                             "Print the shell completion script (bash or zsh); source it to "
                             "complete verbs, flags, namespaces and ProfileJob names");
  command->add_option("shell", options_->shell, "bash or zsh")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh"}));
  command->footer(plugin_ ? "\nkubectl completes the plugin's verbs itself once "
                            "kubectl_complete-clusterprof (installed beside it) is on PATH.\n"
                            "\nExample:\n  source <(kubectl clusterprof completion bash)"
                          : "\nExample:\n  source <(clusterprof completion bash)");
  return {command, "", [this](std::ostream& out, std::ostream&) {
            out << CompletionScript(options_->shell,
                                    plugin_ ? "kubectl-clusterprof" : "clusterprof");
            return 0;
          }};
}

Verbs::Verb Verbs::AddTop(CLI::App* parent) {
  TopOptions& top = options_->top;
  CLI::App* command = parent->add_subcommand(
      "top",
      "Every host's live step time, how late it enters the collectives, and the verdict, "
      "refreshing in place (the sidecars' live step telemetry; no capture)");
  command->add_option("--service-addr", top.service_addr,
                      "host:port[,host:port...] of clusterprof sidecars");
  command->add_option("--operator-addr", top.operator_addr,
                      "Or the operator's health port (host:port, e.g. kubectl port-forward to "
                      "the leading replica's 8081), with --profiletrigger");
  command->add_option("--profiletrigger", top.profile_trigger,
                      "NAMESPACE/NAME of the ProfileTrigger whose pods to show, as the operator "
                      "follows them");
  command->add_option("--token-file", top.token_file,
                      "File with the bearer token of sidecars started with --auth-token-file");
  AddTransportFlags(command, &top.transport);
  command->add_option("--steps", top.steps, "The last this many steps make each row")
      ->check(CLI::Range(2, 1000))
      ->capture_default_str();
  command->add_option("--interval-ms", top.interval_ms, "How often the table is drawn again")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}))
      ->capture_default_str();
  command->add_flag("--once", top.once,
                    "Print one table once every host has sent steps (or after --timeout-ms), "
                    "then exit (1 if a host could not be reached)");
  command->add_option("--timeout-ms", top.timeout_ms, "With --once: how long to wait for steps")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--seconds", top.seconds, "Stop after this long (0: until Ctrl-C)")
      ->check(CLI::NonNegativeNumber);
  return {command, "top --service-addr 10.0.0.7:8466,10.0.0.8:8466",
          [&top](std::ostream& out, std::ostream& err) { return RunTop(top, out, err); }};
}

void Verbs::AddExamples() {
  // The plugin's tool footer lists its own verbs first, then the local ones it keeps.
  std::string footer = "\nExamples:";
  std::vector<std::pair<std::string, std::string>> local;  // verb, example
  for (const Verb& verb : verbs_) {
    if (verb.example.empty()) continue;
    std::string example;
    if (verb.kube) {
      example = StrCat(plugin_ ? "kubectl clusterprof " : "clusterprof kube ", verb.example);
      if (plugin_) StrAppend(&footer, "\n  ", example);
    } else {
      if (plugin_ && verb.command->get_parent() != app_) continue;
      example = StrCat(plugin_ ? "kubectl clusterprof " : "clusterprof ", verb.example);
      local.emplace_back(verb.command->get_name(), example);
    }
    verb.command->footer("\nExample:\n  " + example);
  }
  // In the order people reach for them.
  constexpr std::string_view kOrder[] = {"capture", "inspect", "report", "convert", "top"};
  auto rank = [&kOrder](const std::pair<std::string, std::string>& verb) {
    return std::find(std::begin(kOrder), std::end(kOrder), verb.first) - std::begin(kOrder);
  };
  std::stable_sort(local.begin(), local.end(),
                   [&rank](const auto& a, const auto& b) { return rank(a) < rank(b); });
  for (const auto& [name, example] : local) StrAppend(&footer, "\n  ", example);
  app_->footer(footer);
}

bool Verbs::PrintHelp(std::string_view verb, std::ostream& out) const {
  for (const Verb& v : verbs_) {
    if (!v.example.empty() && v.command->get_name() == verb && v.command->get_parent() == app_) {
      out << v.command->help(app_->get_name());
      return true;
    }
  }
  return false;
}

int Verbs::Run(std::ostream& out, std::ostream& err) const {
  for (const Verb& verb : verbs_) {
    if (*verb.command) return verb.run(out, err);
  }
  return kExitUsage;
}

}  // namespace clusterprof::cli
