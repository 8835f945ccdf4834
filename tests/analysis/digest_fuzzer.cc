// Fuzzes the analysis of an untrusted .xplane.pb (what `clusterprof report` reads from a run
// directory): parse, digest by step_num and by a step pattern, and compare two hosts. Any input
// gives a Status or a result, never a crash or signed overflow, and the digest keeps its
// invariants.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "analysis/digest.h"
#include "analysis/stragglers.h"
#include "common/xspace/xspace_io.h"
#include "google/protobuf/stubs/logging.h"

namespace {

void Check(const clusterprof::analysis::HostDigest& digest) {
  for (size_t i = 0; i < digest.steps.size(); ++i) {
    const clusterprof::analysis::StepDigest& step = digest.steps[i];
    if (i > 0 && digest.steps[i - 1].step >= step.step) __builtin_trap();  // once, in order
    if (step.collective_ns < 0 || step.device_busy_ns < 0 || step.host_busy_ns < 0 ||
        step.input_ns < 0) {
      __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  [[maybe_unused]] static const bool kQuiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  auto loaded = clusterprof::xspace::ParseXSpace(
      std::string_view(reinterpret_cast<const char*>(data), size), "fuzz-input");
  if (!loaded.ok()) return 0;
  const tensorflow::profiler::XSpace& space = (*loaded)->space();
  auto by_stat = clusterprof::analysis::DigestXSpace(space, "a");
  auto by_name = clusterprof::analysis::DigestXSpace(space, "b", {.step_pattern = "step|train"});
  if (!by_stat.ok() || !by_name.ok()) __builtin_trap();  // valid patterns never fail
  Check(*by_stat);
  Check(*by_name);
  const clusterprof::analysis::Analysis analysis = clusterprof::analysis::FindStragglers(
      {{*by_stat, 0}, {*by_stat, INT64_MIN}, {*by_name, INT64_MAX}});
  if (analysis.hosts.size() + analysis.left_out.size() != 3) __builtin_trap();
  return 0;
}
