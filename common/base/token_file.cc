#include "common/base/token_file.h"

#include <cerrno>
#include <fstream>
#include <sstream>

#include "common/base/status.h"
#include "common/base/strings.h"

namespace clusterprof {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoToStatus(errno, "cannot read the token file", path);
  std::stringstream content;
  content << in.rdbuf();
  const std::string text = content.str();
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) {
    return absl::InvalidArgumentError(StrCat("the token file ", path, " is empty"));
  }
  const size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

}  // namespace clusterprof
