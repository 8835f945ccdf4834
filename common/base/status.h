// Status helpers used across clusterprof. Errors are absl::Status / absl::StatusOr inside the
// code; grpc::Status appears only at RPC boundaries (see sidecar/ and operator/).
#ifndef CLUSTERPROF_COMMON_BASE_STATUS_H_
#define CLUSTERPROF_COMMON_BASE_STATUS_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace clusterprof {

// Returns `status` with `context` prepended to its message ("context: message"), keeping the code.
// An OK status stays OK.
absl::Status Annotate(const absl::Status& status, std::string_view context);

// Maps an errno value from a failed system call on `path` to a status with a readable message,
// e.g. NotFound("open /x/y: No such file or directory").
absl::Status ErrnoToStatus(int errno_value, std::string_view operation, std::string_view path);

}  // namespace clusterprof

#define CLUSTERPROF_STATUS_CONCAT_INNER_(a, b) a##b
#define CLUSTERPROF_STATUS_CONCAT_(a, b) CLUSTERPROF_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define CLUSTERPROF_RETURN_IF_ERROR(expr)                     \
  do {                                                        \
    if (absl::Status _cp_status = (expr); !_cp_status.ok()) { \
      return _cp_status;                                      \
    }                                                         \
  } while (0)

// CLUSTERPROF_ASSIGN_OR_RETURN(auto x, MakeX()); assigns the value of an absl::StatusOr or
// returns its status.
#define CLUSTERPROF_ASSIGN_OR_RETURN(lhs, expr) \
  CLUSTERPROF_ASSIGN_OR_RETURN_IMPL_(CLUSTERPROF_STATUS_CONCAT_(_cp_statusor_, __LINE__), lhs, expr)

#define CLUSTERPROF_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                       \
  if (!statusor.ok()) {                                         \
    return std::move(statusor).status();                        \
  }                                                             \
  lhs = *std::move(statusor)

#endif  // CLUSTERPROF_COMMON_BASE_STATUS_H_
