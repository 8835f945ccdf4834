#include "common/base/file_stamp.h"

namespace clusterprof {

FileStamp FileStamp::Of(const struct stat& st) {
  return {static_cast<int64_t>(st.st_ino), static_cast<int64_t>(st.st_size),
          int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec};
}

std::optional<FileStamp> StampFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileStamp::Of(st);
}

}  // namespace clusterprof
