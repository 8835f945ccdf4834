#include "common/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/base/status.h"
#include "common/base/strings.h"

namespace clusterprof::io {

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int saved = errno;
    close(fd);
    return ErrnoToStatus(saved, "cannot stat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(StrCat(path, " is a directory, not a file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* base = nullptr;
  if (size > 0) {
    base = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
      const int saved = errno;
      close(fd);
      return ErrnoToStatus(saved, "cannot map", path);
    }
    madvise(base, size, MADV_SEQUENTIAL);
  }
  close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(path, base, size));
}

MappedFile::~MappedFile() {
  if (base_ != nullptr) munmap(base_, size_);
}

void MappedFile::ReleaseBelow(size_t offset) {
  if (base_ == nullptr) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t end = std::min(offset, size_) / page * page;
  if (end <= released_) return;
  madvise(static_cast<char*>(base_) + released_, end - released_, MADV_DONTNEED);
  released_ = end;
}

}  // namespace clusterprof::io
