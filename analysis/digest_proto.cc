#include "analysis/digest_proto.h"

#include <algorithm>
#include <limits>

#include "clusterprof/v1alpha1/sidecar.pb.h"
#include "common/base/strings.h"
#include "proto/profile_options.h"
#include "tsl/profiler/protos/profiler_options.pb.h"

namespace clusterprof::analysis {
namespace {

// StepDigest.collective_entry_offset_ns of a step without a collective.
constexpr int64_t kNoCollective = -1;

}  // namespace

absl::StatusOr<DigestOptions> DigestOptionsFromProfile(const tensorflow::ProfileOptions& options) {
  DigestOptions out;
  const struct {
    const char* key;
    std::string* pattern;
  } keys[] = {{proto::kStepPatternKey, &out.step_pattern},
              {proto::kCollectivePatternKey, &out.collective_pattern},
              {proto::kInputPatternKey, &out.input_pattern}};
  for (const auto& [key, pattern] : keys) {
    auto it = options.advanced_configuration().find(key);
    if (it == options.advanced_configuration().end()) continue;
    if (it->second.value_case() != tensorflow::ProfileOptions::AdvancedConfigValue::kStringValue) {
      return absl::InvalidArgumentError(
          StrCat("advanced_configuration[\"", key, "\"] must be a string (a regular expression)"));
    }
    *pattern = it->second.string_value();
  }
  absl::Status valid = ValidateDigestOptions(out);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(StrCat("advanced_configuration: ", valid.message()));
  }
  return out;
}

void DigestToProto(const HostDigest& digest, v1alpha1::HostDigest* proto) {
  proto->Clear();
  proto->set_host(digest.host);
  proto->set_events(digest.events);
  proto->set_step_source(digest.step_source);
  // The earliest start (steps are by number, and numbers need not follow time).
  int64_t base = digest.steps.empty() ? 0 : digest.steps.front().start_ns;
  for (const StepDigest& step : digest.steps) base = std::min(base, step.start_ns);
  proto->set_base_ns(base);
  for (const StepDigest& step : digest.steps) {
    v1alpha1::StepDigest* out = proto->add_steps();
    out->set_step(step.step);
    out->set_start_offset_ns(SaturatingSub(step.start_ns, base));
    out->set_duration_ns(step.duration_ns());
    out->set_collective_entry_offset_ns(
        step.collective_entry_ns == 0 ? kNoCollective
                                      : SaturatingSub(step.collective_entry_ns, step.start_ns));
    out->set_collective_ns(step.collective_ns);
    out->set_device_busy_ns(step.device_busy_ns);
    out->set_host_busy_ns(step.host_busy_ns);
    out->set_input_ns(step.input_ns);
  }
  for (const OpStat& op : digest.top_ops) {
    v1alpha1::OpStat* out = proto->add_top_ops();
    out->set_name(op.name);
    out->set_device(op.device);
    out->set_count(op.count);
    out->set_total_ns(op.total_ns);
  }
}

absl::StatusOr<HostDigest> DigestFromProto(const v1alpha1::HostDigest& proto) {
  auto invalid = [&](std::string_view what) {
    return absl::InvalidArgumentError(StrCat(
        "the digest of ", proto.host().empty() ? "a host" : proto.host(), " is corrupted: ", what));
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  // The bounds first, before anything is copied. The host name in the message is cut short: it
  // is outside input too.
  if (proto.host().size() > kMaxDigestNameBytes) {
    return absl::InvalidArgumentError(
        StrCat("the digest of ", proto.host().substr(0, 64), "... is corrupted: a host name of ",
               proto.host().size(), " bytes (at most ", kMaxDigestNameBytes, ")"));
  }
  if (const size_t bytes = proto.ByteSizeLong(); bytes > static_cast<size_t>(kMaxDigestBytes)) {
    return invalid(StrCat(bytes, " bytes, more than the ", kMaxDigestBytes >> 20,
                          " MiB a digest may take (", proto.steps_size(), " steps, ",
                          proto.top_ops_size(), " ops)"));
  }
  if (proto.steps_size() > kMaxDigestSteps) {
    return invalid(StrCat(proto.steps_size(), " steps, more than the ", kMaxDigestSteps,
                          " a digest may hold"));
  }
  if (proto.top_ops_size() > kMaxDigestOps) {
    return invalid(
        StrCat(proto.top_ops_size(), " ops, more than the ", kMaxDigestOps, " a digest may hold"));
  }
  HostDigest digest;
  digest.host = proto.host();
  digest.events = proto.events();
  digest.step_source = proto.step_source();
  if (proto.base_ns() < 0) return invalid("a negative base time");
  digest.steps.reserve(proto.steps_size());
  for (const v1alpha1::StepDigest& in : proto.steps()) {
    if (!digest.steps.empty() && in.step() <= digest.steps.back().step) {
      return invalid(StrCat("step ", in.step(), " comes after step ", digest.steps.back().step));
    }
    const bool has_collective = in.collective_entry_offset_ns() != kNoCollective;
    const int64_t durations[] = {in.start_offset_ns(),
                                 in.duration_ns(),
                                 in.collective_ns(),
                                 in.device_busy_ns(),
                                 in.host_busy_ns(),
                                 in.input_ns(),
                                 has_collective ? in.collective_entry_offset_ns() : 0};
    for (int64_t value : durations) {
      if (value < 0) return invalid(StrCat("step ", in.step(), " has a negative time"));
    }
    if (in.start_offset_ns() > kMax - proto.base_ns() ||
        in.duration_ns() > kMax - proto.base_ns() - in.start_offset_ns()) {
      return invalid(StrCat("step ", in.step(), " ends past the end of time"));
    }
    if (has_collective && in.collective_entry_offset_ns() >= in.duration_ns()) {
      return invalid(StrCat("step ", in.step(), " enters its collective after it ends"));
    }
    StepDigest step;
    step.step = in.step();
    step.start_ns = proto.base_ns() + in.start_offset_ns();
    step.end_ns = step.start_ns + in.duration_ns();
    if (has_collective) step.collective_entry_ns = step.start_ns + in.collective_entry_offset_ns();
    step.collective_ns = in.collective_ns();
    step.device_busy_ns = in.device_busy_ns();
    step.host_busy_ns = in.host_busy_ns();
    step.input_ns = in.input_ns();
    digest.steps.push_back(step);
  }
  for (const v1alpha1::OpStat& in : proto.top_ops()) {
    if (in.name().size() > kMaxDigestNameBytes) {
      return invalid(
          StrCat("an op name of ", in.name().size(), " bytes (at most ", kMaxDigestNameBytes, ")"));
    }
    if (in.count() < 0 || in.total_ns() < 0) {
      return invalid(StrCat("op ", in.name(), " has a negative count or time"));
    }
    digest.top_ops.push_back({in.name(), in.device(), in.count(), in.total_ns()});
  }
  return digest;
}

}  // namespace clusterprof::analysis
