// Writes a sample multi-host capture into a logdir, shaped like what clusterprof's sidecars
// record for a data-parallel training job: per host a /host:CPU plane (a training thread with
// steps and nested ops annotated through the TraceMe codec, a data-loader thread), a
// /device:GPU:0 plane with kernels and copies linked to their launches, GPU counters, and the
// Task Environment plane. Used by scripts/demo and by benchmarks that need realistic files.
//
//   sample_capture --logdir /tmp/tb --run demo --hosts 4 --steps 50
#include <cstdio>
#include <random>
#include <string>

#include "CLI/CLI.hpp"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/storage/host_files.h"
#include "common/storage/local_storage.h"
#include "common/storage/storage_set.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "common/xspace/traceme.h"

namespace {

using namespace clusterprof;  // NOLINT(google-build-using-namespace): example program
using xspace::XEventBuilder;
using xspace::XLineBuilder;
using xspace::XPlaneBuilder;

// Adds an event from an annotation name as the annotation tracer does: decode the TraceMe
// metadata into typed stats.
XEventBuilder AddAnnotated(XPlaneBuilder& plane, XLineBuilder& line, const std::string& encoded,
                           int64_t start_ns, int64_t duration_ns) {
  const traceme::Annotation annotation = traceme::Decode(encoded);
  XEventBuilder event = line.AddEvent(*plane.GetOrCreateEventMetadata(annotation.name));
  event.SetTimestampNs(start_ns);
  event.SetDurationNs(duration_ns);
  for (const traceme::Stat& stat : annotation.stats) {
    const auto& md = *plane.GetOrCreateStatMetadata(stat.key);
    if (const auto* text = std::get_if<std::string_view>(&stat.value)) {
      event.AddStatValue(md, *plane.GetOrCreateStatMetadata(*text));
    } else {
      std::visit([&](auto v) { event.AddStatValue(md, v); }, stat.value);
    }
  }
  return event;
}

tensorflow::profiler::XSpace MakeHost(int host, int steps, int64_t start_ns, std::mt19937& rng) {
  tensorflow::profiler::XSpace space;
  const std::string host_name = StrCat("trainer-", host);
  space.add_hostnames(host_name);
  std::uniform_int_distribution<int64_t> jitter(0, 400'000);

  XPlaneBuilder cpu(space.add_planes());
  cpu.SetId(0);
  cpu.SetName(xspace::kHostThreadsPlaneName);
  XPlaneBuilder gpu(space.add_planes());
  gpu.SetId(1);
  gpu.SetName(StrCat(xspace::kGpuPlanePrefix, 0));
  gpu.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kDevVendor), xspace::kDeviceVendorNvidia);
  gpu.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kGpuDeviceName), "NVIDIA H100 80GB HBM3");
  gpu.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kDevCapCoreCount), int64_t{132});

  XLineBuilder train = cpu.GetOrCreateLine(1000 + host);
  train.SetName("python3 (train loop)");
  train.SetTimestampNs(start_ns);
  XLineBuilder loader = cpu.GetOrCreateLine(2000 + host);
  loader.SetName("data_loader");
  loader.SetTimestampNs(start_ns);
  XLineBuilder stream = gpu.GetOrCreateLine(7);
  stream.SetName("Stream #7(Kernel,MemcpyH2D)");
  stream.SetTimestampNs(start_ns);
  XLineBuilder counters = gpu.GetOrCreateLine(100);
  counters.SetName(xspace::kCounterLineName);
  counters.SetTimestampNs(start_ns);
  const auto& util = *gpu.GetOrCreateEventMetadata("gpu_utilization_percent");
  const auto& value = *gpu.GetOrCreateStatMetadata(xspace::kCounterValue);
  const auto& correlation = *gpu.GetOrCreateStatMetadata(xspace::kCorrelationId);
  const auto& consumer = *gpu.GetOrCreateStatMetadata(xspace::kConsumerId);
  const auto& kernel_details = *gpu.GetOrCreateStatMetadata(xspace::kKernelDetails);

  int64_t t = start_ns + 200'000;
  uint64_t correlation_id = 1;
  for (int step = 0; step < steps; ++step) {
    const int64_t step_start = t;
    const int64_t fetch = 1'000'000 + jitter(rng);
    AddAnnotated(cpu, loader, traceme::Encode("next_batch", {{"step_num", step}}), t, fetch);
    t += fetch;
    const int64_t forward = 6'000'000 + jitter(rng);
    const int64_t backward = 11'000'000 + jitter(rng);
    AddAnnotated(cpu, train, traceme::Encode("forward", {{"layers", 24}}), t, forward);
    for (int k = 0; k < 4; ++k) {
      const int64_t launch_at = t + k * 1'400'000;
      XEventBuilder launch = AddAnnotated(cpu, train, "cudaLaunchKernel", launch_at, 12'000);
      launch.AddStatValue(*cpu.GetOrCreateStatMetadata(xspace::kProducerId), correlation_id);
      launch.AddStatValue(*cpu.GetOrCreateStatMetadata(xspace::kCorrelationId), correlation_id);
      XEventBuilder kernel = stream.AddEvent(
          *gpu.GetOrCreateEventMetadata(k % 2 ? "sm90_xmma_gemm_bf16" : "flash_fwd"));
      kernel.SetTimestampNs(launch_at + 30'000);
      kernel.SetDurationNs(1'200'000);
      kernel.AddStatValue(consumer, correlation_id);
      kernel.AddStatValue(correlation, correlation_id);
      kernel.AddStatValue(kernel_details, "grid:132,1,1 block:256,1,1 regs:168 smem:227KB");
      ++correlation_id;
    }
    t += forward;
    AddAnnotated(cpu, train, traceme::Encode("backward", {{"grad_accum", false}}), t, backward);
    t += backward;
    const int64_t allreduce = 2'500'000 + jitter(rng) * 4;
    AddAnnotated(cpu, train,
                 traceme::Encode("all_reduce", {{"bytes", 268435456}, {"algo", "ring"}}), t,
                 allreduce);
    t += allreduce;
    // The step spans what came before it on the training thread; add it last and sort.
    AddAnnotated(cpu, train, traceme::Encode("train_step", {{"step_num", step}, {"_r", 1}}),
                 step_start, t - step_start);
    XEventBuilder sample = counters.AddEvent(util);
    sample.SetTimestampNs(step_start);
    sample.AddStatValue(value, 70.0 + static_cast<double>(jitter(rng)) / 20'000.0);
    t += 100'000;
  }
  xspace::SortXSpace(&space);

  XPlaneBuilder env(space.add_planes());
  env.SetId(2);
  env.SetName(xspace::kTaskEnvPlaneName);
  env.AddStatValue(*env.GetOrCreateStatMetadata(xspace::kProfileStartTime), uint64_t(start_ns));
  env.AddStatValue(*env.GetOrCreateStatMetadata(xspace::kProfileStopTime), uint64_t(t));
  return space;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Writes a sample multi-host capture into a logdir"};
  std::string logdir_text;
  std::string run;
  int hosts = 4;
  int steps = 50;
  app.add_option("--logdir", logdir_text, "Logdir to write into")->required();
  app.add_option("--run", run, "Run name (default: the current UTC time, YYYY_MM_DD_HH_MM_SS)");
  app.add_option("--hosts", hosts, "Number of hosts")->check(CLI::Range(1, 1024));
  app.add_option("--steps", steps, "Training steps per host")->check(CLI::Range(1, 1'000'000));
  CLI11_PARSE(app, argc, argv);

  RealClock clock;
  const int64_t start_ns = clock.WallNs();
  if (run.empty()) run = storage::DefaultRunName(start_ns);
  auto logdir = storage::ParseLogdir(logdir_text);
  if (!logdir.ok()) {
    std::fprintf(stderr, "sample_capture: %s\n", std::string(logdir.status().message()).c_str());
    return 2;
  }
  auto layout = storage::RunLayout::Create(*logdir, run);
  if (!layout.ok()) {
    std::fprintf(stderr, "sample_capture: %s\n", std::string(layout.status().message()).c_str());
    return 2;
  }
  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  auto store = storages.For(*logdir);
  if (!store.ok()) {
    std::fprintf(stderr, "sample_capture: %s\n", std::string(store.status().message()).c_str());
    return 2;
  }
  std::mt19937 rng(42);
  for (int h = 0; h < hosts; ++h) {
    const auto space = MakeHost(h, steps, start_ns, rng);
    auto files = storage::WriteHostFiles(**store, *layout, space.hostnames(0), space);
    if (!files.ok()) {
      std::fprintf(stderr, "sample_capture: %s\n", std::string(files.status().message()).c_str());
      return 1;
    }
    if (absl::Status committed = storage::CheckCommitted(files->xplane); !committed.ok()) {
      std::fprintf(stderr, "sample_capture: %s\n", std::string(committed.message()).c_str());
      return 1;
    }
    std::printf("wrote %s (%lld events)\n", files->xplane.uri.c_str(),
                static_cast<long long>(files->events));
  }
  std::printf("%s\n", layout->RunDir().c_str());
  return 0;
}
