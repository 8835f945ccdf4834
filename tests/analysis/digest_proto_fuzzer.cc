// Fuzzes the reading of an untrusted host digest (what the coordinator takes from a sidecar's
// GetSession answer): parse, check, compare with itself. Any input gives a Status or a digest
// that keeps its invariants and writes back to the same bytes' meaning, never a crash or signed
// overflow.
#include <cstddef>
#include <cstdint>

#include "analysis/digest_proto.h"
#include "analysis/stragglers.h"
#include "clusterprof/v1alpha1/sidecar.pb.h"
#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  [[maybe_unused]] static const bool kQuiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  clusterprof::v1alpha1::HostDigest proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto digest = clusterprof::analysis::DigestFromProto(proto);
  if (!digest.ok()) return 0;
  for (size_t i = 0; i < digest->steps.size(); ++i) {
    const clusterprof::analysis::StepDigest& step = digest->steps[i];
    if (i > 0 && digest->steps[i - 1].step >= step.step) __builtin_trap();
    if (step.end_ns < step.start_ns) __builtin_trap();
    if (step.collective_entry_ns != 0 &&
        (step.collective_entry_ns < step.start_ns || step.collective_entry_ns >= step.end_ns)) {
      __builtin_trap();
    }
  }
  // Written back and read again: the same digest.
  clusterprof::v1alpha1::HostDigest again;
  clusterprof::analysis::DigestToProto(*digest, &again);
  auto reread = clusterprof::analysis::DigestFromProto(again);
  if (!reread.ok() || reread->steps.size() != digest->steps.size()) __builtin_trap();
  for (size_t i = 0; i < digest->steps.size(); ++i) {
    if (reread->steps[i].start_ns != digest->steps[i].start_ns ||
        reread->steps[i].end_ns != digest->steps[i].end_ns ||
        reread->steps[i].collective_entry_ns != digest->steps[i].collective_entry_ns) {
      __builtin_trap();
    }
  }
  const clusterprof::analysis::Analysis analysis =
      clusterprof::analysis::FindStragglers({{*digest, 0}, {*reread, INT64_MIN}});
  if (analysis.hosts.size() + analysis.left_out.size() != 2) __builtin_trap();
  return 0;
}
