// Bearer tokens kept in files (mounted Kubernetes Secrets): the sidecar's --auth-token-file, the
// operator's --sidecar-token-file, the CLI's --token-file.
#ifndef CLUSTERPROF_COMMON_BASE_TOKEN_FILE_H_
#define CLUSTERPROF_COMMON_BASE_TOKEN_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace clusterprof {

// The token in `path`, surrounding whitespace trimmed. Fails, naming the path, when the file
// cannot be read or holds no token.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_TOKEN_FILE_H_
