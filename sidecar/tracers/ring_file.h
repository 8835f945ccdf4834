// What both ring readers (ring_reader.h, gpu_ring_reader.h) do with a ring file before trusting
// it: map it, check its header's format and layout (the file is written by the workload's
// process, and may be from another version, truncated or hostile), and copy out the writer it
// names and its string table.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_RING_FILE_H_
#define CLUSTERPROF_SIDECAR_TRACERS_RING_FILE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace clusterprof::shm {

// Maps the ring file at `path` shared and read-write, refusing one smaller than `min_size`; `what`
// names the kind of file in errors ("ring", "GPU ring").
struct MappedRing {
  char* base = nullptr;
  size_t size = 0;
};
absl::StatusOr<MappedRing> MapRingFile(const std::string& path, size_t min_size,
                                       std::string_view what);

// Whether the header is of the format this build reads (magic, version, header and record
// sizes); `what` and `path` name the file in the error.
absl::Status CheckRingFormat(uint64_t magic, uint64_t expected_magic, uint32_t version,
                             uint64_t header_size, size_t expected_header_size,
                             uint32_t record_size, size_t expected_record_size,
                             std::string_view what, const std::string& path);
template <typename Header, typename Record>
absl::Status CheckRingFormat(const Header& h, uint64_t expected_magic, std::string_view what,
                             const std::string& path) {
  return CheckRingFormat(h.magic, expected_magic, h.version, h.header_size, sizeof(Header),
                         h.record_size, sizeof(Record), what, path);
}
// Whether [offset, offset + length) lies within a file of `size` bytes (no overflow).
inline bool FitsInFile(size_t size, uint64_t offset, uint64_t length) {
  return offset <= size && length <= size - offset;
}
// A string table 4-byte aligned and within the file.
inline bool StringTableFits(size_t size, uint64_t offset, uint64_t capacity) {
  return offset % 4 == 0 && FitsInFile(size, offset, capacity);
}
// The error for a header whose offsets and counts do not fit the file.
absl::Status InconsistentRingLayout(std::string_view what, const std::string& path);

// A mapped ring file (unmapped when destroyed), with what its checked header says of the process
// that writes it and of its string table. Not thread-safe.
class RingFile {
 public:
  RingFile(std::string path, MappedRing mapping) : path_(std::move(path)), mapping_(mapping) {}
  ~RingFile();
  RingFile(const RingFile&) = delete;
  RingFile& operator=(const RingFile&) = delete;

  // Copies the writer and the string table out of `h` (in this file), read once; false when
  // the string table does not fit the file.
  template <typename Header>
  bool TakeHeader(const Header& h) {
    const uint64_t strings_offset = h.strings_offset;
    const uint64_t strings_capacity = h.strings_capacity;
    if (!StringTableFits(mapping_.size, strings_offset, strings_capacity)) return false;
    pid_ = h.pid;
    start_ticks_ = h.process_start_ticks;
    process_name_.assign(h.process_name, strnlen(h.process_name, sizeof(h.process_name)));
    strings_offset_ = strings_offset;
    strings_capacity_ = strings_capacity;
    return true;
  }

  // The string with id `id`, or empty when the id is 0, out of range or not written yet.
  std::string_view String(uint32_t id) const;

  char* base() const { return mapping_.base; }
  size_t size() const { return mapping_.size; }
  const std::string& path() const { return path_; }
  uint32_t pid() const { return pid_; }
  uint64_t process_start_ticks() const { return start_ticks_; }
  std::string_view process_name() const { return process_name_; }

 private:
  std::string path_;
  MappedRing mapping_;
  uint32_t pid_ = 0;
  uint64_t start_ticks_ = 0;
  std::string process_name_;
  uint64_t strings_offset_ = 0;
  uint64_t strings_capacity_ = 0;
};

}  // namespace clusterprof::shm

#endif  // CLUSTERPROF_SIDECAR_TRACERS_RING_FILE_H_
