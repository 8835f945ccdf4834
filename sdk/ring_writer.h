// The producer side of the shared-memory transport: a process's ring file, its per-thread rings
// and its string table. Runs inside instrumented workloads, so it depends on nothing but the C++
// standard library and reports failures by return value, never by exception or abort.
#ifndef CLUSTERPROF_SDK_RING_WRITER_H_
#define CLUSTERPROF_SDK_RING_WRITER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sdk/shm_format.h"

namespace clusterprof::shm {

class StringInterner;

struct RingOptions {
  uint32_t max_threads = kDefaultMaxThreads;
  uint32_t slots_per_thread = kDefaultSlotsPerThread;  // rounded up to a power of two
  uint64_t strings_capacity = kDefaultStringsCapacity;
  std::string process_name;
};

// One thread's ring. Append is wait-free and allocation-free; only the owning thread may call it.
class ThreadRing {
 public:
  ThreadRing(ThreadSlot* slot, Record* records, uint32_t slots)
      : slot_(slot), records_(records), mask_(slots - 1) {}

  // Copies `record` into the ring. When the ring is full the record is dropped and counted;
  // returns false then.
  bool Append(const Record& record) {
    const uint64_t write = slot_->write_index.load(std::memory_order_relaxed);
    const uint64_t read = slot_->read_index.load(std::memory_order_acquire);
    if (write - read > mask_) {
      slot_->dropped.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    records_[write & mask_] = record;
    slot_->write_index.store(write + 1, std::memory_order_release);
    return true;
  }

  void SetName(uint32_t name_id) { slot_->name_id.store(name_id, std::memory_order_release); }
  uint64_t dropped() const { return slot_->dropped.load(std::memory_order_relaxed); }

  // The ring's memory, for a producer that appends inline with the same protocol (the
  // annotation SDK's fast path); only the owning thread may append.
  ThreadSlot* slot() const { return slot_; }
  Record* records() const { return records_; }
  uint32_t mask() const { return mask_; }

 private:
  ThreadSlot* slot_;
  Record* records_;
  uint32_t mask_;
};

// A process's ring file, mapped shared. Thread-safe: ClaimThread and Intern may be called from
// any thread. The file outlives the writer (and the process) until the sidecar has drained and
// removed it.
class RingWriter {
 public:
  // Creates <dir>/ring-<pid>-<start ticks>.shm. On failure returns nullptr and says why in
  // `error`.
  static std::unique_ptr<RingWriter> Create(const std::string& dir, const RingOptions& options,
                                            std::string* error);
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  // A ring for thread `tid`, or nullptr when every slot is taken (counted in the header). Slots
  // are never reused: a thread that exits leaves its records for the sidecar.
  ThreadRing* ClaimThread(uint32_t tid);

  // The id of `text` in the string table (the same id for the same text), or 0 when the table
  // is full (counted in the header).
  uint32_t Intern(std::string_view text);

  const std::string& path() const { return path_; }
  const RingHeader& header() const { return *header_; }

 private:
  RingWriter(std::string path, void* base, size_t size, int lock_fd);

  std::string path_;
  // Open with a shared flock(2) while this writer lives (shm::CreateTempShmFile).
  int lock_fd_;
  void* base_;
  size_t size_;
  RingHeader* header_;
  std::mutex mu_;  // guards threads_
  std::unique_ptr<std::unique_ptr<ThreadRing>[]> threads_;
  std::unique_ptr<StringInterner> strings_;
};

// The start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field 22), read
// under `proc_root` (normally "/proc"); 0 if it cannot be read.
uint64_t ProcessStartTicks(const std::string& proc_root, int pid);

// The ring file name for a process: ring-<pid>-<start ticks>.shm.
std::string RingFileName(int pid, uint64_t start_ticks);

}  // namespace clusterprof::shm

#endif  // CLUSTERPROF_SDK_RING_WRITER_H_
