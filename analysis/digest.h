// A host's capture reduced to what the cross-host analysis needs (docs/analysis.md): its steps,
// and per step when the host first entered a collective and where its time went (device work,
// host work, waiting on input, inside collectives). A digest of 1,000 steps is a few tens of
// KiB, so hosts can be compared without holding their traces.
#ifndef CLUSTERPROF_ANALYSIS_DIGEST_H_
#define CLUSTERPROF_ANALYSIS_DIGEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/saturating.h"

namespace tensorflow::profiler {
class XSpace;
}  // namespace tensorflow::profiler

namespace clusterprof::analysis {

// Collectives: NCCL's kernels (old and new names), XLA's collective ops, and host annotations
// named after all-reduce, all-gather, reduce-scatter, all-to-all (the exchange of mixture-of-
// experts layers) or NCCL.
inline constexpr char kDefaultCollectivePattern[] =
    "ncclKernel_|ncclDevKernel_|all-reduce|all-gather|reduce-scatter|all-to-all|"
    "collective-permute|allreduce|all_reduce|allgather|all_gather|reducescatter|reduce_scatter|"
    "alltoall|all_to_all|nccl";
// Waiting on the input pipeline: common data-loader and iterator names.
inline constexpr char kDefaultInputPattern[] =
    "data_?load|load_batch|dataloader|input_?pipeline|iterator::|GetNext|next_batch|"
    "infeed|prefetch";

struct DigestOptions {
  // Step markers: events whose name matches (ECMAScript, case-insensitive). Empty: events that
  // carry a step_num stat (the TF/JAX and clusterprof convention).
  std::string step_pattern;
  std::string collective_pattern = kDefaultCollectivePattern;
  std::string input_pattern = kDefaultInputPattern;
};

// INVALID_ARGUMENT naming the pattern that is not a regular expression.
absl::Status ValidateDigestOptions(const DigestOptions& options);

// One step of one host. Times are on the host's clock, ns since the Unix epoch; durations are
// the union of the intervals of that kind inside the step.
struct StepDigest {
  int64_t step = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  // The first collective that starts inside the step; 0 when there is none.
  int64_t collective_entry_ns = 0;
  int64_t collective_ns = 0;
  // Device planes (/device:*): work other than collectives.
  int64_t device_busy_ns = 0;
  // The threads that run the steps (those with step markers): annotated work other than the
  // step marker, collectives and input. Other threads and async lanes count only for input
  // and collectives.
  int64_t host_busy_ns = 0;
  int64_t input_ns = 0;

  int64_t duration_ns() const { return SaturatingSub(end_ns, start_ns); }
};

// The time one op (a kernel on a device, or an annotation on a step thread) took inside the steps.
struct OpStat {
  std::string name;
  bool device = false;
  int64_t count = 0;
  int64_t total_ns = 0;
};

// How many ops a digest keeps, those with the most time first.
inline constexpr int kMaxTopOps = 40;

struct HostDigest {
  std::string host;
  // By step number, each step once.
  std::vector<StepDigest> steps;
  // The kMaxTopOps ops with the most time inside the steps, most first (ties by name).
  std::vector<OpStat> top_ops;
  // Events read, and what marked the steps ("step_num stat" or the pattern).
  int64_t events = 0;
  std::string step_source;
};

// Reduces `space` to its digest. INVALID_ARGUMENT for a pattern that is not a regular
// expression; a space without steps is a digest without steps (the caller says which markers
// were looked for).
absl::StatusOr<HostDigest> DigestXSpace(const tensorflow::profiler::XSpace& space, std::string host,
                                        const DigestOptions& options = {});

}  // namespace clusterprof::analysis

#endif  // CLUSTERPROF_ANALYSIS_DIGEST_H_
