// ProfileJobs whose targets overlap are captured one after another, not against each other: a
// sidecar captures one run at a time, so a second job would only spend its attempts on
// ALREADY_EXISTS. This is the queue's rule, as a pure function over what the jobs' statuses say
// (so a restarted operator takes the same decisions): a job waits while another job holds any of
// its targets, or an older job already waits for any of them.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_TARGET_QUEUE_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_TARGET_QUEUE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "operator/api/types.h"

namespace clusterprof::controllers {

// The condition a waiting job carries (True while it waits).
inline constexpr std::string_view kQueued = "Queued";

// What the rule needs of a job.
struct JobClaim {
  std::string name;
  std::string uid;
  api::JobPhase phase = api::JobPhase::kPending;
  // metadata.creationTimestamp, as written (RFC 3339 sorts as time).
  std::string created;
  // Pending and waiting (its Queued condition is True).
  bool queued = false;
  // Its targets' addresses (host:port).
  std::vector<std::string> addresses;
};

// The job `self` waits for, and the targets they share.
struct Blocker {
  std::string job;
  api::JobPhase phase = api::JobPhase::kPending;  // kPending: an older job waiting before it
  std::vector<std::string> shared;                // addresses, sorted
};

// Whether a job's status claims its targets: while Scheduled or Capturing, or while Pending with
// the Queued condition True; nullopt for finished jobs and other Pending ones. The claim's
// addresses are the caller's to fill: the job's targets resolved from its spec (a status does not
// list the targets of a large job).
std::optional<JobClaim> ClaimOf(const std::string& name, const std::string& uid,
                                const std::string& created, const api::ProfileJobStatus& status);

// The first job that `self` (its addresses resolved now) must wait for among `others`: one that
// is Scheduled or Capturing with a shared target, else the oldest queued job older than `self`
// (creation time, then name) with a shared target. `others` may hold `self`: it is skipped.
std::optional<Blocker> FindBlocker(const JobClaim& self, const std::vector<JobClaim>& others);

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_TARGET_QUEUE_H_
