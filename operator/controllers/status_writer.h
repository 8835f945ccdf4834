// Writing a ProfileJob's status, with one retry policy: read-modify-write of the server's latest
// copy (retried on conflicts, as client-go's RetryOnConflict), only while it is the same object
// (uid); and, for a capture's final status, again after API errors with a jittered backoff until
// it lands, the job is gone, the time runs out or the capture is cancelled.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_STATUS_WRITER_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_STATUS_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/base/cancel.h"
#include "common/base/clock.h"
#include "common/retry/backoff.h"
#include "cpprest/json.h"
#include "operator/api/types.h"
#include "operator/kube/api_client.h"

namespace clusterprof::controllers {

// One ProfileJob object: a re-created job of the same name is another one.
struct JobRef {
  std::string namespace_;
  std::string name;
  std::string uid;
};

using StatusMutation = std::function<absl::Status(api::ProfileJobStatus& status)>;

class StatusWriter {
 public:
  // Both must outlive the writer.
  StatusWriter(kube::ApiClient* client, Clock* clock) : client_(client), clock_(clock) {}

  // Read-modify-write from the latest copy, retried on conflicts. NotFound when the job is gone
  // or was replaced (another uid); `mutate`'s error aborts and is returned.
  absl::Status Write(const JobRef& job, const StatusMutation& mutate);

  // Write, again after errors other than NotFound and `mutate`'s own (the API server down),
  // with `backoff` pauses, until `give_up_after_ns` has passed or `cancel` is cancelled (then
  // the last error). `cancel` may be null.
  absl::Status WriteUntilLanded(const JobRef& job, const StatusMutation& mutate,
                                int64_t give_up_after_ns, const CancelToken* cancel,
                                BackoffPolicy backoff = {.initial_ns = 500 * kNanosPerMilli,
                                                         .max_ns = 10 * kNanosPerSecond});

  // Writes `status` over the cached object `job` (optimistic: a Conflict is returned, and the
  // caller requeues). A job deleted meanwhile is OK.
  absl::Status Overwrite(const web::json::value& job, const api::ProfileJobStatus& status);

 private:
  kube::ApiClient* const client_;
  Clock* const clock_;
};

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_STATUS_WRITER_H_
