// absl::Status <-> grpc::Status (the code numbers are the same canonical codes in both), and
// relative gRPC deadlines.
#ifndef CLUSTERPROF_COMMON_BASE_GRPC_STATUS_H_
#define CLUSTERPROF_COMMON_BASE_GRPC_STATUS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "grpc/support/time.h"
#include "grpcpp/support/status.h"

namespace clusterprof {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// A deadline `timeout_ns` from now, for ClientContext::set_deadline and Server::Shutdown. gRPC
// reads a GPR_TIMESPAN deadline as relative to its own clock: callers compute timeouts from their
// injected Clock and never read the system clocks themselves.
inline gpr_timespec GrpcTimeout(int64_t timeout_ns) {
  return gpr_time_from_nanos(timeout_ns > 0 ? timeout_ns : 0, GPR_TIMESPAN);
}

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_GRPC_STATUS_H_
