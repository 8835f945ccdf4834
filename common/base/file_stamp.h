// What stat() says of a file's content without reading it, to tell whether it changed since it
// was last read: a rewrite changes its size or mtime, a Secret's update (a symlink swapped to a
// new directory) its inode.
#ifndef CLUSTERPROF_COMMON_BASE_FILE_STAMP_H_
#define CLUSTERPROF_COMMON_BASE_FILE_STAMP_H_

#include <sys/stat.h>

#include <cstdint>
#include <optional>
#include <string>

namespace clusterprof {

struct FileStamp {
  int64_t inode = -1;
  int64_t size = -1;
  int64_t mtime_ns = -1;

  bool operator==(const FileStamp&) const = default;
  static FileStamp Of(const struct stat& st);
};

// The stamp of `path` (links followed); nullopt, with errno set, when it cannot be stat'ed.
std::optional<FileStamp> StampFile(const std::string& path);

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_FILE_STAMP_H_
