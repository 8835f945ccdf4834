// Helpers shared by the writers of the shared-memory files (control page, annotation rings, GPU
// rings): files are built under a temporary name and renamed into place once complete, so a
// reader never maps a half-initialized file; and the string table that rings carry.
// Dependency-free like the rest of sdk.
#ifndef CLUSTERPROF_SDK_SHM_FILE_H_
#define CLUSTERPROF_SDK_SHM_FILE_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sdk/shm_format.h"

namespace clusterprof::shm {

// A new file of `size` zero bytes at `<path>.tmp`, mapped shared read-write. On failure returns
// nullptr, says why in `error` and leaves no file behind.
//
// With `lock_fd`, the file stays open there with a shared flock(2) on it, which the writer holds
// for as long as it writes (ring files): the sidecar's sign that the writer lives, which it can
// read from another container of the pod, where the writer's pid means nothing (another PID
// namespace). The kernel drops the lock when the process ends, however it ends.
void* CreateTempShmFile(const std::string& path, uint64_t size, std::string* error,
                        int* lock_fd = nullptr);
// Renames `<path>.tmp` to `path`; on failure unmaps `base`, removes the temporary file and says
// why in `error`.
bool PublishShmFile(const std::string& path, void* base, uint64_t size, std::string* error);

uint64_t AlignUp(uint64_t value, uint64_t alignment);
uint64_t RoundUpToPowerOfTwo(uint64_t value, uint64_t max);

// Appends `text` to the string table at `table` (`capacity` bytes, `used` of them handed out) and
// returns its id, or 0 when it does not fit (counted in `dropped`). Callers serialize appends and
// intern (one entry per distinct text).
inline uint32_t AppendString(char* table, uint64_t capacity, std::atomic<uint64_t>& used,
                             std::atomic<uint64_t>& dropped, std::string_view text) {
  const uint64_t entry_size = (sizeof(StringEntryHeader) + text.size() + 3) & ~uint64_t{3};
  const uint64_t offset = used.load(std::memory_order_relaxed);
  if (text.size() > 0xFFFF || offset + entry_size > capacity || offset >= UINT32_MAX) {
    dropped.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  char* entry = table + offset;
  if (!text.empty()) std::memcpy(entry + sizeof(StringEntryHeader), text.data(), text.size());
  auto* entry_header = new (entry) StringEntryHeader();
  // Length last: a reader that sees it sees the bytes. Stored as length + 1 so the empty string
  // is distinguishable from "not written yet".
  entry_header->length_plus_one.store(static_cast<uint32_t>(text.size()) + 1,
                                      std::memory_order_release);
  used.store(offset + entry_size, std::memory_order_release);
  return static_cast<uint32_t>(offset) + 1;
}

// Interns strings into a ring file's string table: one entry per distinct text. Thread-safe.
class StringInterner {
 public:
  StringInterner(char* table, uint64_t capacity, std::atomic<uint64_t>& used,
                 std::atomic<uint64_t>& dropped)
      : table_(table), capacity_(capacity), used_(used), dropped_(dropped) {}

  // The id of `text`, or 0 when the table is full (counted).
  uint32_t Intern(std::string_view text) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = ids_.find(std::string(text)); it != ids_.end()) return it->second;
    const uint32_t id = AppendString(table_, capacity_, used_, dropped_, text);
    if (id != 0) ids_.emplace(std::string(text), id);
    return id;
  }

 private:
  char* const table_;
  const uint64_t capacity_;
  std::atomic<uint64_t>& used_;
  std::atomic<uint64_t>& dropped_;
  std::mutex mu_;
  std::unordered_map<std::string, uint32_t> ids_;
};

// The string with `id` in a table another process writes: empty when the id is 0, out of range
// or not written yet. Never reads outside [table, table + capacity).
inline std::string_view ReadString(const char* table, uint64_t capacity, uint32_t id) {
  if (id == 0) return {};
  const uint64_t offset = id - 1;
  if (offset % 4 != 0 || offset + sizeof(StringEntryHeader) > capacity) return {};
  const char* entry = table + offset;
  const uint32_t length_plus_one =
      reinterpret_cast<const StringEntryHeader*>(entry)->length_plus_one.load(
          std::memory_order_acquire);
  if (length_plus_one == 0) return {};
  const uint64_t length = length_plus_one - 1;
  if (length > capacity - offset - sizeof(StringEntryHeader)) return {};
  return {entry + sizeof(StringEntryHeader), static_cast<size_t>(length)};
}

}  // namespace clusterprof::shm

#endif  // CLUSTERPROF_SDK_SHM_FILE_H_
