#include "operator/controllers/status_writer.h"

#include "common/base/status.h"
#include "common/base/strings.h"
#include "operator/kube/object.h"
#include "operator/kube/retry.h"
#include "spdlog/spdlog.h"

namespace clusterprof::controllers {

absl::Status StatusWriter::Write(const JobRef& job, const StatusMutation& mutate) {
  return kube::RetryOnConflict(clock_, [&]() -> absl::Status {
    CLUSTERPROF_ASSIGN_OR_RETURN(web::json::value latest,
                                 client_->Get(api::ProfileJobs(), job.namespace_, job.name));
    CLUSTERPROF_ASSIGN_OR_RETURN(kube::ObjectMeta meta, kube::DecodeObjectMeta(latest));
    if (meta.uid != job.uid) {
      return absl::NotFoundError(
          StrCat("profilejob ", job.namespace_, "/", job.name, " was replaced by another object"));
    }
    const web::json::value null_value;
    CLUSTERPROF_ASSIGN_OR_RETURN(
        api::ProfileJobStatus status,
        api::ParseProfileJobStatus(latest.has_field("status") ? latest.at("status") : null_value));
    CLUSTERPROF_RETURN_IF_ERROR(mutate(status));
    status.observed_generation = meta.generation;
    for (api::Condition& condition : status.conditions) {
      if (condition.observed_generation == 0) condition.observed_generation = meta.generation;
    }
    latest["status"] = api::ProfileJobStatusToJson(status);
    return client_->UpdateStatus(api::ProfileJobs(), job.namespace_, latest).status();
  });
}

absl::Status StatusWriter::WriteUntilLanded(const JobRef& job, const StatusMutation& mutate,
                                            int64_t give_up_after_ns, const CancelToken* cancel,
                                            BackoffPolicy backoff_policy) {
  const int64_t give_up = clock_->MonotonicNs() + give_up_after_ns;
  // `mutate`'s own errors are final: only the API's are retried.
  bool refused = false;
  const StatusMutation checked = [&](api::ProfileJobStatus& status) {
    absl::Status mutated = mutate(status);
    refused = !mutated.ok();
    return mutated;
  };
  Backoff backoff(backoff_policy);
  while (true) {
    absl::Status written = Write(job, checked);
    if (written.ok() || refused || absl::IsNotFound(written) || clock_->MonotonicNs() >= give_up ||
        (cancel != nullptr && cancel->cancelled())) {
      return written;
    }
    spdlog::warn("profilejob {}/{}: the status is not written yet: {}", job.namespace_, job.name,
                 std::string(written.message()));
    const int64_t wake = clock_->MonotonicNs() + backoff.NextDelayNs();
    if (cancel == nullptr) {
      clock_->SleepUntilMonotonicNs(wake);
    } else if (!clock_->SleepUntilMonotonicNsUnless(wake, cancel->flag())) {
      return written;
    }
  }
}

absl::Status StatusWriter::Overwrite(const web::json::value& job,
                                     const api::ProfileJobStatus& status) {
  web::json::value updated = job;
  updated["status"] = api::ProfileJobStatusToJson(status);
  const std::string ns = job.at("metadata").at("namespace").as_string();
  absl::StatusOr<web::json::value> written = client_->UpdateStatus(api::ProfileJobs(), ns, updated);
  if (absl::IsNotFound(written.status())) return absl::OkStatus();  // deleted meanwhile
  return written.status();
}

}  // namespace clusterprof::controllers
