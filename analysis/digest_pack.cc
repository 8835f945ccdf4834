#include "analysis/digest_pack.h"

#include <cstdint>

namespace clusterprof::analysis {
namespace {

// Differences are taken modulo 2^64, so that any two int64 values, however far apart, pack and
// unpack exactly; small differences of either sign stay short through the zigzag.
uint64_t Zigzag(int64_t from, int64_t to) {
  const uint64_t difference = static_cast<uint64_t>(to) - static_cast<uint64_t>(from);
  const int64_t signed_difference = static_cast<int64_t>(difference);
  return (difference << 1) ^ static_cast<uint64_t>(signed_difference >> 63);
}
int64_t Unzigzag(int64_t from, uint64_t zigzag) {
  const uint64_t difference = (zigzag >> 1) ^ (~(zigzag & 1) + 1);
  return static_cast<int64_t>(static_cast<uint64_t>(from) + difference);
}

void PutVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}
uint64_t GetVarint(const char*& p) {
  uint64_t value = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(*p++);
    value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return value;
  }
}

constexpr uint8_t kHasCollective = 1;

}  // namespace

PackedSteps::PackedSteps(const std::vector<StepDigest>& steps) : count_(steps.size()) {
  packed_.reserve(steps.size() * 32);
  int64_t previous_step = 0;
  int64_t previous_end = 0;
  for (const StepDigest& step : steps) {
    // The entry as a flag and a difference, not 0 for none: 0 is a valid difference.
    packed_.push_back(static_cast<char>(step.collective_entry_ns != 0 ? kHasCollective : 0));
    PutVarint(Zigzag(previous_step, step.step), &packed_);
    PutVarint(Zigzag(previous_end, step.start_ns), &packed_);
    PutVarint(Zigzag(step.start_ns, step.end_ns), &packed_);
    if (step.collective_entry_ns != 0) {
      PutVarint(Zigzag(step.start_ns, step.collective_entry_ns), &packed_);
    }
    PutVarint(Zigzag(0, step.collective_ns), &packed_);
    PutVarint(Zigzag(0, step.device_busy_ns), &packed_);
    PutVarint(Zigzag(0, step.host_busy_ns), &packed_);
    PutVarint(Zigzag(0, step.input_ns), &packed_);
    previous_step = step.step;
    previous_end = step.end_ns;
  }
  packed_.shrink_to_fit();
}

void PackedSteps::Unpack(std::vector<StepDigest>* steps) const {
  steps->resize(count_);
  const char* p = packed_.data();
  int64_t previous_step = 0;
  int64_t previous_end = 0;
  for (StepDigest& step : *steps) {
    const uint8_t flags = static_cast<uint8_t>(*p++);
    step.step = Unzigzag(previous_step, GetVarint(p));
    step.start_ns = Unzigzag(previous_end, GetVarint(p));
    step.end_ns = Unzigzag(step.start_ns, GetVarint(p));
    step.collective_entry_ns =
        (flags & kHasCollective) != 0 ? Unzigzag(step.start_ns, GetVarint(p)) : 0;
    step.collective_ns = Unzigzag(0, GetVarint(p));
    step.device_busy_ns = Unzigzag(0, GetVarint(p));
    step.host_busy_ns = Unzigzag(0, GetVarint(p));
    step.input_ns = Unzigzag(0, GetVarint(p));
    previous_step = step.step;
    previous_end = step.end_ns;
  }
}

std::vector<StepDigest> PackedSteps::Unpack() const {
  std::vector<StepDigest> steps;
  Unpack(&steps);
  return steps;
}

PackedDigest::PackedDigest(HostDigest digest)
    : host_(std::move(digest.host)),
      steps_(digest.steps),
      top_ops_(std::move(digest.top_ops)),
      events_(digest.events),
      step_source_(std::move(digest.step_source)) {}

HostDigest PackedDigest::Unpack() const {
  HostDigest digest;
  digest.host = host_;
  steps_.Unpack(&digest.steps);
  digest.top_ops = top_ops_;
  digest.events = events_;
  digest.step_source = step_source_;
  return digest;
}

}  // namespace clusterprof::analysis
