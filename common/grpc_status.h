// absl::Status <-> grpc::Status. The code numbers are the same canonical codes in both.
#ifndef CLUSTERPROF_COMMON_GRPC_STATUS_H_
#define CLUSTERPROF_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
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

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_GRPC_STATUS_H_
