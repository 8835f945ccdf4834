// The producer side of a GPU ring (shm_format.h): libclusterprof_cupti writes the CUPTI records
// of its process here for the sidecar. Depends on the C++ standard library only; failures are
// reported by return value, never by exception or abort (it runs inside the workload).
#ifndef CLUSTERPROF_SDK_GPU_RING_WRITER_H_
#define CLUSTERPROF_SDK_GPU_RING_WRITER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sdk/shm_format.h"

namespace clusterprof::shm {

class StringInterner;

// Thread-safe: CUPTI completes buffers on threads of its own, possibly several at once.
class GpuRingWriter {
 public:
  // Creates <dir>/gpu-<pid>-<start ticks>.shm with room for `capacity` records (rounded up to a
  // power of two). On failure returns nullptr and says why in `error`.
  static std::unique_ptr<GpuRingWriter> Create(const std::string& dir, uint64_t capacity,
                                               const std::string& process_name, std::string* error);
  ~GpuRingWriter();
  GpuRingWriter(const GpuRingWriter&) = delete;
  GpuRingWriter& operator=(const GpuRingWriter&) = delete;

  // Copies `records` into the ring. While it is full, waits for the sidecar to drain, calling
  // `sleep` between looks, for at most `max_wait` in all; what still does not fit is dropped and
  // counted. Returns the records written.
  using SleepFn = std::function<void(std::chrono::microseconds)>;
  size_t Append(std::span<const GpuRecord> records, std::chrono::microseconds max_wait,
                const SleepFn& sleep);

  // The id of `text` in the string table, or 0 when the table is full (counted).
  uint32_t Intern(std::string_view text);

  // Reports a failure: the message goes to the header, the state to kFailed.
  void SetError(std::string_view message);

  GpuRingHeader& header() { return *header_; }
  const std::string& path() const { return path_; }

 private:
  GpuRingWriter(std::string path, void* base, size_t size, int lock_fd);

  std::string path_;
  // Open with a shared flock(2) while this writer lives (shm::CreateTempShmFile).
  int lock_fd_;
  void* base_;
  size_t size_;
  GpuRingHeader* header_;
  GpuRecord* records_;
  std::mutex append_mu_;  // one producer at a time
  std::unique_ptr<StringInterner> strings_;
};

std::string GpuRingFileName(int pid, uint64_t start_ticks);

}  // namespace clusterprof::shm

#endif  // CLUSTERPROF_SDK_GPU_RING_WRITER_H_
