// The workload's cost of GPU tracing: runs a CUDA program (tests' gpu_workload) with no
// injection, with libclusterprof_cupti loaded and no capture, with a capture armed around the
// whole run, and with bare CUPTI (bare_cupti_injection: the same activity kinds, buffers freed
// untouched), interleaved run by run, and prints each run and the medians, and our cost as a
// ratio to bare CUPTI's. With the capture on it also reports the records the sidecar side
// drained, and at what rate.
//
//   gpu_overhead --workload PATH --cupti PATH [--mode launch|gemm|mixed] [--iterations N]
//                [--runs R] [--size N] [--api runtime,driver|runtime|driver|none]
//                [--bare PATH]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "sdk/control_page.h"
#include "sidecar/tracers/gpu_tracer.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace {

int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Runs `command`; returns the per-iteration time it printed, or a negative value.
double RunWorkload(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char line[512];
  double per_iteration = -1;
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    if (const char* at = std::strstr(line, "per_iteration_us=")) {
      per_iteration = std::atof(at + std::strlen("per_iteration_us="));
    }
  }
  return pclose(pipe) == 0 ? per_iteration : -1;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = {
      {"--mode", "launch"}, {"--iterations", "2000"},    {"--runs", "7"},
      {"--size", "1024"},   {"--api", "runtime,driver"}, {"--bare", CLUSTERPROF_BARE_CUPTI}};
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  if (args.count("--workload") == 0 || args.count("--cupti") == 0) {
    std::fprintf(stderr,
                 "usage: gpu_overhead --workload PATH --cupti PATH [--mode M] "
                 "[--iterations N] [--runs R] [--size N]\n");
    return 2;
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("gpu_overhead." + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(dir);
  auto shm = clusterprof::sidecar::ShmTransport::Create({.dir = dir});
  if (!shm.ok()) {
    std::fprintf(stderr, "%s\n", shm.status().ToString().c_str());
    return 1;
  }
  clusterprof::sidecar::GpuTracer::Options options;
  options.max_records = 100'000'000;
  auto tracer = clusterprof::sidecar::GpuTracer::Create(shm->get(), options, nullptr);
  if (!tracer.ok()) return 1;

  const std::string workload = args["--workload"] + " --mode " + args["--mode"] + " --iterations " +
                               args["--iterations"] + " --size " + args["--size"];
  const std::string injected =
      "CLUSTERPROF_DIR=" + dir + " CUDA_INJECTION64_PATH=" + args["--cupti"] + " ";
  std::map<std::string, std::vector<double>> times;
  std::vector<double> drained_rates;
  const int runs = std::atoi(args["--runs"].c_str());
  std::printf("mode=%s iterations=%s runs=%d api=%s\n", args["--mode"].c_str(),
              args["--iterations"].c_str(), runs, args["--api"].c_str());
  const std::string bare =
      "BARE_CUPTI_API=" + args["--api"] + " CUDA_INJECTION64_PATH=" + args["--bare"] + " ";
  for (int run = 0; run < runs; ++run) {
    times["off"].push_back(RunWorkload(workload));
    times["loaded"].push_back(RunWorkload(injected + workload));
    times["bare"].push_back(RunWorkload(bare + workload));

    clusterprof::sidecar::CaptureWindow window;
    window.start_ns = WallNs();
    window.planned_stop_ns = window.start_ns + int64_t{3600} * 1'000'000'000;
    clusterprof::sidecar::CaptureConfig config;
    config.options.set_device_tracer_level(1);
    auto& advanced = *config.options.mutable_advanced_configuration();
    advanced[clusterprof::sidecar::kGpuMaxActivityEventsKey].set_int64_value(1'000'000'000);
    advanced[clusterprof::sidecar::kGpuMaxApiEventsKey].set_int64_value(1'000'000'000);
    const bool runtime = args["--api"].find("runtime") != std::string::npos;
    const bool driver = args["--api"].find("driver") != std::string::npos;
    advanced[clusterprof::sidecar::kGpuApiTracingKey].set_string_value(runtime && driver
                                                                           ? "runtime,driver"
                                                                       : runtime ? "runtime"
                                                                       : driver  ? "driver"
                                                                                 : "none");
    (void)(*tracer)->Prepare(window, config);
    (void)(*tracer)->Start(window, config);
    times["on"].push_back(RunWorkload(injected + workload));
    const int64_t stop = WallNs();
    (void)(*tracer)->Stop(stop);
    tensorflow::profiler::XSpace space;
    clusterprof::sidecar::TracerStats stats;
    (void)(*tracer)->CollectInto(&space, &stats);
    const double seconds = static_cast<double>(stop - window.start_ns) / 1e9;
    drained_rates.push_back(static_cast<double>(stats.events) / seconds);
    std::printf(
        "run %d: off %.2f us, loaded %.2f us, on %.2f us, bare CUPTI %.2f us per iteration; "
        "%llu events (%llu dropped) in %.2f s\n",
        run, times["off"].back(), times["loaded"].back(), times["on"].back(), times["bare"].back(),
        static_cast<unsigned long long>(stats.events),
        static_cast<unsigned long long>(stats.dropped_events), seconds);
    for (const std::string& warning : space.warnings()) std::printf("  %s\n", warning.c_str());
  }
  const double off = Median(times["off"]);
  const double loaded = Median(times["loaded"]);
  const double on = Median(times["on"]);
  const double bare_cupti = Median(times["bare"]);
  std::printf(
      "median per iteration: off %.2f us, loaded %.2f us (%+.2f%%), on %.2f us (%+.2f%%), bare "
      "CUPTI %.2f us (%+.2f%%); on / bare CUPTI %.3fx; events per second of capture (median) "
      "%.0f\n",
      off, loaded, (loaded / off - 1) * 100, on, (on / off - 1) * 100, bare_cupti,
      (bare_cupti / off - 1) * 100, on / bare_cupti, Median(drained_rates));
  std::filesystem::remove_all(dir);
  return 0;
}
