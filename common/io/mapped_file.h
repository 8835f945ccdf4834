// A read-only memory map of a whole file, for readers that walk large files once (the streaming
// trace converter). Pages already walked can be handed back to keep the resident set small.
#ifndef CLUSTERPROF_COMMON_IO_MAPPED_FILE_H_
#define CLUSTERPROF_COMMON_IO_MAPPED_FILE_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace clusterprof::io {

// Not thread-safe.
class MappedFile {
 public:
  // NotFound / PermissionDenied name the path; a directory is InvalidArgument. An empty file maps
  // to empty data.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::string_view data() const { return {static_cast<const char*>(base_), size_}; }
  const std::string& path() const { return path_; }

  // Drops the mapped pages that lie wholly below `offset` from memory (they are reloaded from
  // the file if read again).
  void ReleaseBelow(size_t offset);

 private:
  MappedFile(std::string path, void* base, size_t size)
      : path_(std::move(path)), base_(base), size_(size) {}
  std::string path_;
  void* base_;
  size_t size_;
  size_t released_ = 0;
};

}  // namespace clusterprof::io

#endif  // CLUSTERPROF_COMMON_IO_MAPPED_FILE_H_
