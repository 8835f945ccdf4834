// A host's steps packed for holding thousands of hosts at once (the run report of a 10,000-host
// job): each field a varint, times as differences from the step before, about 30 bytes a step
// where a StepDigest takes 64. Packing and unpacking give back exactly the steps given.
#ifndef CLUSTERPROF_ANALYSIS_DIGEST_PACK_H_
#define CLUSTERPROF_ANALYSIS_DIGEST_PACK_H_

#include <cstddef>
#include <string>
#include <vector>

#include "analysis/digest.h"

namespace clusterprof::analysis {

class PackedSteps {
 public:
  PackedSteps() = default;
  explicit PackedSteps(const std::vector<StepDigest>& steps);

  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  // The packed bytes held.
  size_t bytes() const { return packed_.size(); }
  // Replaces `*steps` with the steps, in the order given when packed.
  void Unpack(std::vector<StepDigest>* steps) const;
  std::vector<StepDigest> Unpack() const;

 private:
  std::string packed_;
  size_t count_ = 0;
};

// A host's whole digest with its steps packed: what a coordinator of 10,000 targets holds for each
// until the capture's report is made (about half the memory of a HostDigest).
class PackedDigest {
 public:
  explicit PackedDigest(HostDigest digest);

  const std::string& host() const { return host_; }
  size_t steps() const { return steps_.size(); }
  // The digest as it was given.
  HostDigest Unpack() const;

 private:
  std::string host_;
  PackedSteps steps_;
  std::vector<OpStat> top_ops_;
  int64_t events_ = 0;
  std::string step_source_;
};

}  // namespace clusterprof::analysis

#endif  // CLUSTERPROF_ANALYSIS_DIGEST_PACK_H_
