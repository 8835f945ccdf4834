#include "sidecar/tracers/ring_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "sdk/shm_file.h"
#include "sdk/shm_format.h"

namespace clusterprof::shm {

absl::StatusOr<MappedRing> MapRingFile(const std::string& path, size_t min_size,
                                       std::string_view what) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, StrCat("cannot open ", what), path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int saved = errno;
    close(fd);
    return ErrnoToStatus(saved, StrCat("cannot stat ", what), path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < min_size) {
    close(fd);
    return absl::InvalidArgumentError(StrCat(what, " ", path, " is too small (", size, " bytes)"));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return ErrnoToStatus(errno, StrCat("cannot map ", what), path);
  return MappedRing{static_cast<char*>(base), size};
}

absl::Status CheckRingFormat(uint64_t magic, uint64_t expected_magic, uint32_t version,
                             uint64_t header_size, size_t expected_header_size,
                             uint32_t record_size, size_t expected_record_size,
                             std::string_view what, const std::string& path) {
  if (magic == expected_magic && version == kVersion && header_size == expected_header_size &&
      record_size == expected_record_size) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      StrCat(what, " ", path,
             " has an unknown format (magic, version or record size differ); was it written by "
             "another clusterprof version?"));
}

absl::Status InconsistentRingLayout(std::string_view what, const std::string& path) {
  return absl::InvalidArgumentError(
      StrCat(what, " ", path, " has an inconsistent layout; ignoring it"));
}

RingFile::~RingFile() { munmap(mapping_.base, mapping_.size); }

std::string_view RingFile::String(uint32_t id) const {
  return ReadString(mapping_.base + strings_offset_, strings_capacity_, id);
}

}  // namespace clusterprof::shm
