#include "tests/support/xspace_samples.h"

#include <string>
#include <vector>

#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"

namespace clusterprof::testing {

using xspace::XEventBuilder;
using xspace::XLineBuilder;
using xspace::XPlaneBuilder;

namespace {
constexpr int64_t kBaseNs = 1'767'225'600'000'000'000;  // 2026-01-01T00:00:00Z
}

tensorflow::profiler::XSpace SmallXSpace() {
  tensorflow::profiler::XSpace space;
  space.add_hostnames("worker-0");
  space.add_warnings("sample warning");

  XPlaneBuilder host(space.add_planes());
  host.SetId(0);
  host.SetName(xspace::kHostThreadsPlaneName);
  {
    XLineBuilder line = host.GetOrCreateLine(100);
    line.SetName("python3");
    line.SetTimestampNs(kBaseNs);
    XEventBuilder step = line.AddEvent(*host.GetOrCreateEventMetadata("train_step"));
    step.SetTimestampNs(kBaseNs + 1000);
    step.SetDurationNs(5000);
    step.AddStatValue(*host.GetOrCreateStatMetadata(xspace::kStepNum), int64_t{7});
    step.AddStatValue(*host.GetOrCreateStatMetadata(xspace::kIsRoot), int64_t{1});
    XEventBuilder matmul = line.AddEvent(*host.GetOrCreateEventMetadata("matmul"));
    matmul.SetTimestampNs(kBaseNs + 2000);
    matmul.SetDurationNs(1000);
    matmul.ParseAndAddStatValue(*host.GetOrCreateStatMetadata("shape"), "[8,16]");
    matmul.AddStatValue(*host.GetOrCreateStatMetadata("flops"), uint64_t{123});
    XEventBuilder launch = line.AddEvent(*host.GetOrCreateEventMetadata("cudaLaunchKernel"));
    launch.SetTimestampNs(kBaseNs + 3000);
    launch.SetDurationNs(500);
    launch.AddStatValue(*host.GetOrCreateStatMetadata(xspace::kProducerId), uint64_t{42});
    launch.AddStatValue(*host.GetOrCreateStatMetadata(xspace::kCorrelationId), uint64_t{42});
  }
  {
    XLineBuilder line = host.GetOrCreateLine(101);
    line.SetName("loader \"io\"");
    line.SetTimestampNs(kBaseNs + 1000);
    XEventBuilder fetch = line.AddEvent(*host.GetOrCreateEventMetadata("fetch"));
    fetch.SetOffsetPs(1'500'500);  // 1500.5 ns after the line's start
    fetch.SetDurationPs(250'250);
    fetch.AddStatValue(*host.GetOrCreateStatMetadata("loss"), 0.25);
    fetch.AddStatValue(*host.GetOrCreateStatMetadata("blob"), xspace::Bytes{"\x01\x02"});
  }

  XPlaneBuilder gpu(space.add_planes());
  gpu.SetId(1);
  gpu.SetName(StrCat(xspace::kGpuPlanePrefix, 0));
  gpu.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kDevVendor), "Nvidia");
  gpu.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kDevCapCoreCount), int64_t{132});
  {
    XLineBuilder line = gpu.GetOrCreateLine(7);
    line.SetName("Stream #7(Kernel,MemcpyH2D)");
    line.SetTimestampNs(kBaseNs);
    XEventBuilder kernel = line.AddEvent(*gpu.GetOrCreateEventMetadata("gemm_kernel"));
    kernel.SetTimestampNs(kBaseNs + 4000);
    kernel.SetDurationNs(2000);
    kernel.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kConsumerId), uint64_t{42});
    kernel.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kCorrelationId), uint64_t{42});
    kernel.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kKernelDetails),
                        "grid:1,1,1 block:128,1,1");
    XEventBuilder memcpy = line.AddEvent(*gpu.GetOrCreateEventMetadata("MemcpyH2D"));
    memcpy.SetTimestampNs(kBaseNs + 7000);
    memcpy.SetDurationNs(300);
    memcpy.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kMemcpyDetails), "size:4096");
  }
  {
    XLineBuilder line = gpu.GetOrCreateLine(1000);
    line.SetName(xspace::kCounterLineName);
    line.SetTimestampNs(kBaseNs);
    const auto& util = *gpu.GetOrCreateEventMetadata("gpu_utilization");
    const auto& value = *gpu.GetOrCreateStatMetadata(xspace::kCounterValue);
    XEventBuilder s0 = line.AddEvent(util);
    s0.SetTimestampNs(kBaseNs);
    s0.AddStatValue(value, 12.5);
    XEventBuilder s1 = line.AddEvent(util);
    s1.SetTimestampNs(kBaseNs + 5000);
    s1.AddStatValue(value, int64_t{80});
  }

  XPlaneBuilder env(space.add_planes());
  env.SetId(2);
  env.SetName(xspace::kTaskEnvPlaneName);
  env.AddStatValue(*env.GetOrCreateStatMetadata(xspace::kProfileStartTime), uint64_t(kBaseNs));
  env.AddStatValue(*env.GetOrCreateStatMetadata(xspace::kProfileStopTime),
                   uint64_t(kBaseNs + 10000));
  return space;
}

tensorflow::profiler::XSpace SyntheticXSpace(int threads, int64_t events_per_thread) {
  tensorflow::profiler::XSpace space;
  space.add_hostnames("synthetic");
  XPlaneBuilder host(space.add_planes());
  host.SetName(xspace::kHostThreadsPlaneName);
  std::vector<const tensorflow::profiler::XEventMetadata*> names;
  for (int i = 0; i < 64; ++i) names.push_back(host.GetOrCreateEventMetadata(StrCat("op_", i)));
  const auto& step_num = *host.GetOrCreateStatMetadata(xspace::kStepNum);
  for (int t = 0; t < threads; ++t) {
    XLineBuilder line = host.GetOrCreateLine(1000 + t);
    line.SetName(StrCat("worker_", t));
    line.SetTimestampNs(kBaseNs);
    line.ReserveEvents(static_cast<int>(events_per_thread));
    int64_t parent_start_ps = 0;
    for (int64_t i = 0; i < events_per_thread; ++i) {
      const bool parent = i % 8 == 0;
      if (parent) parent_start_ps = i * 1'000'000;
      XEventBuilder event = line.AddEvent(*names[i % names.size()]);
      event.SetOffsetPs(parent ? parent_start_ps : i * 1'000'000 + 100'000);
      event.SetDurationPs(parent ? 8'000'000 - 1 : 800'000);
      if (parent) event.AddStatValue(step_num, i / 8);
    }
  }
  return space;
}

std::string WarningsOf(const tensorflow::profiler::XSpace& space) {
  std::string all;
  for (const std::string& warning : space.warnings()) all += warning + "\n";
  return all;
}

}  // namespace clusterprof::testing
