// Synthetic multi-host training runs for the analysis tests, built with the XSpace builder: every
// host starts a step together, reads its input, computes (host ops and a GPU kernel), and enters
// an all-reduce that ends for everyone once the last host has entered. Step times are therefore
// equal on every host, as in a real synchronized job; a slow host shows only in when it enters.
#ifndef CLUSTERPROF_TESTS_ANALYSIS_SYNTHETIC_RUN_H_
#define CLUSTERPROF_TESTS_ANALYSIS_SYNTHETIC_RUN_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::analysis::testing {

struct HostSpec {
  double compute_scale = 1.0;   // how much longer its compute takes
  int64_t extra_input_ns = 0;   // how much longer it waits on input each step
  int64_t clock_offset_ns = 0;  // its clock minus the reference clock
};

struct RunSpec {
  std::vector<HostSpec> hosts;
  int steps = 50;
  int64_t first_step = 100;
  int64_t input_ns = 2'000'000;
  int64_t compute_ns = 20'000'000;
  int64_t allreduce_ns = 5'000'000;
  double jitter = 0.05;  // each phase varies uniformly by +-jitter
  uint32_t seed = 1;
};

// One XSpace per host, in the order of spec.hosts.
inline std::vector<tensorflow::profiler::XSpace> MakeRun(const RunSpec& spec) {
  std::mt19937 rng(spec.seed);
  std::uniform_real_distribution<double> noise(1.0 - spec.jitter, 1.0 + spec.jitter);
  const size_t n = spec.hosts.size();
  std::vector<tensorflow::profiler::XSpace> spaces(n);
  std::vector<std::unique_ptr<xspace::XPlaneBuilder>> host_planes;
  std::vector<std::unique_ptr<xspace::XPlaneBuilder>> gpu_planes;
  const int64_t t0 = 1'767'225'600'000'000'000;
  for (size_t h = 0; h < n; ++h) {
    spaces[h].add_hostnames(StrCat("host-", h));
    host_planes.push_back(std::make_unique<xspace::XPlaneBuilder>(
        xspace::FindOrAddMutablePlaneWithName(&spaces[h], xspace::kHostThreadsPlaneName)));
    gpu_planes.push_back(std::make_unique<xspace::XPlaneBuilder>(
        xspace::FindOrAddMutablePlaneWithName(&spaces[h], StrCat(xspace::kGpuPlanePrefix, 0))));
    host_planes[h]->GetOrCreateLine(1).SetTimestampNs(t0 + spec.hosts[h].clock_offset_ns);
    gpu_planes[h]->GetOrCreateLine(7).SetTimestampNs(t0 + spec.hosts[h].clock_offset_ns);
  }
  auto add = [](xspace::XPlaneBuilder& plane, int64_t line_id, std::string_view name, int64_t start,
                int64_t end) {
    xspace::XEventBuilder event =
        plane.GetOrCreateLine(line_id).AddEvent(*plane.GetOrCreateEventMetadata(name));
    event.SetTimestampNs(start);
    event.SetEndTimestampNs(end);
    return event;
  };
  int64_t step_start = t0 + 1'000'000;
  for (int s = 0; s < spec.steps; ++s) {
    std::vector<int64_t> entry(n), input_end(n);
    for (size_t h = 0; h < n; ++h) {
      const int64_t input = static_cast<int64_t>(static_cast<double>(spec.input_ns) * noise(rng)) +
                            spec.hosts[h].extra_input_ns;
      const int64_t compute = static_cast<int64_t>(static_cast<double>(spec.compute_ns) *
                                                   spec.hosts[h].compute_scale * noise(rng));
      input_end[h] = step_start + input;
      entry[h] = input_end[h] + compute;
    }
    const int64_t end = *std::max_element(entry.begin(), entry.end()) +
                        static_cast<int64_t>(static_cast<double>(spec.allreduce_ns) * noise(rng));
    for (size_t h = 0; h < n; ++h) {
      const int64_t off = spec.hosts[h].clock_offset_ns;
      xspace::XPlaneBuilder& cpu = *host_planes[h];
      xspace::XEventBuilder step = add(cpu, 1, "train", step_start + off, end + off);
      step.AddStatValue(*cpu.GetOrCreateStatMetadata(xspace::kStepNum),
                        int64_t{spec.first_step + s});
      add(cpu, 1, "data_load", step_start + off, input_end[h] + off);
      const int64_t compute = entry[h] - input_end[h];
      add(cpu, 1, "forward", input_end[h] + off, input_end[h] + compute / 2 + off);
      add(cpu, 1, "backward", input_end[h] + compute / 2 + off, entry[h] + off);
      add(cpu, 1, "allreduce", entry[h] + off, end + off);
      xspace::XPlaneBuilder& gpu = *gpu_planes[h];
      add(gpu, 7, "volta_sgemm_128x64_nn", input_end[h] + compute / 4 + off, entry[h] + off);
      add(gpu, 7, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", entry[h] + off, end + off);
    }
    step_start = end + 200'000;
  }
  return spaces;
}

}  // namespace clusterprof::analysis::testing

#endif  // CLUSTERPROF_TESTS_ANALYSIS_SYNTHETIC_RUN_H_
