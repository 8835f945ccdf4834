#include "common/base/status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "common/base/strings.h"

namespace clusterprof {

absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), StrCat(context, ": ", status.message()));
}

absl::Status ErrnoToStatus(int errno_value, std::string_view operation, std::string_view path) {
  std::string message = StrCat(operation, " ", path, ": ", std::strerror(errno_value));
  switch (errno_value) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
      return absl::InvalidArgumentError(message);
    case EINTR:
    case EAGAIN:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace clusterprof
