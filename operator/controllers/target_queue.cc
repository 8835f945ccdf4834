#include "operator/controllers/target_queue.h"

#include <algorithm>
#include <set>

namespace clusterprof::controllers {
namespace {

std::vector<std::string> Shared(const std::vector<std::string>& a,
                                const std::vector<std::string>& b) {
  const std::set<std::string> mine(a.begin(), a.end());
  std::set<std::string> shared;
  for (const std::string& address : b) {
    if (mine.count(address) > 0) shared.insert(address);
  }
  return {shared.begin(), shared.end()};
}

bool OlderThan(const JobClaim& a, const JobClaim& b) {
  if (a.created != b.created) return a.created < b.created;
  return a.name < b.name;
}

bool Active(api::JobPhase phase) {
  return phase == api::JobPhase::kScheduled || phase == api::JobPhase::kCapturing;
}

}  // namespace

std::optional<JobClaim> ClaimOf(const std::string& name, const std::string& uid,
                                const std::string& created, const api::ProfileJobStatus& status) {
  JobClaim claim{.name = name, .uid = uid, .phase = status.phase, .created = created};
  if (status.phase == api::JobPhase::kPending) {
    const api::Condition* queued = api::FindCondition(status.conditions, kQueued);
    claim.queued = queued != nullptr && queued->status == "True";
    if (!claim.queued) return std::nullopt;
  } else if (!Active(status.phase)) {
    return std::nullopt;
  }
  return claim;
}

std::optional<Blocker> FindBlocker(const JobClaim& self, const std::vector<JobClaim>& others) {
  const JobClaim* oldest_queued = nullptr;
  std::vector<std::string> queued_shared;
  for (const JobClaim& other : others) {
    if (other.uid == self.uid) continue;
    std::vector<std::string> shared = Shared(self.addresses, other.addresses);
    if (shared.empty()) continue;
    if (Active(other.phase)) return Blocker{other.name, other.phase, std::move(shared)};
    if (other.queued && OlderThan(other, self) &&
        (oldest_queued == nullptr || OlderThan(other, *oldest_queued))) {
      oldest_queued = &other;
      queued_shared = std::move(shared);
    }
  }
  if (oldest_queued == nullptr) return std::nullopt;
  return Blocker{oldest_queued->name, api::JobPhase::kPending, std::move(queued_shared)};
}

}  // namespace clusterprof::controllers
