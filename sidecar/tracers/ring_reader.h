// The sidecar's side of the shared-memory transport: maps a process's ring file and drains its
// thread rings. A ring file is written by a workload the sidecar does not trust, so every offset,
// index and string id read from it is bounds-checked; a corrupt file yields an error or fewer
// records, never a crash or a read outside the mapping.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_RING_READER_H_
#define CLUSTERPROF_SIDECAR_TRACERS_RING_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sdk/shm_format.h"
#include "sidecar/tracers/ring_file.h"

namespace clusterprof::shm {

struct ThreadInfo {
  uint32_t index = 0;  // slot index in the file
  uint32_t tid = 0;
  std::string_view name;  // empty when unnamed
};

struct DrainStats {
  uint64_t records = 0;
  // Records the producer dropped because a ring was full, since the last drain.
  uint64_t dropped = 0;
};

// Not thread-safe: one drainer per ring file.
class RingReader {
 public:
  static absl::StatusOr<std::unique_ptr<RingReader>> Open(const std::string& path);
  ~RingReader();
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  // Hands every record written since the last drain to `visit`, thread by thread in write
  // order, then marks them consumed (freeing room for the producer).
  DrainStats Drain(const std::function<void(const ThreadInfo&, const Record&)>& visit);
  // The same, a contiguous piece of a thread's ring at a time (at most two per thread): for
  // callers that copy records in bulk. The records live in memory the writer shares; copy them
  // before use.
  using SpanVisitor = std::function<void(const ThreadInfo&, std::span<const Record>)>;
  DrainStats DrainSpans(const SpanVisitor& visit);

  // Discards everything written so far (records from before a capture started).
  DrainStats Skip();

  // The string with id `id`, or empty when the id is 0, out of range or not written yet.
  std::string_view String(uint32_t id) const;

  uint32_t pid() const { return file_.pid(); }
  uint64_t process_start_ticks() const { return file_.process_start_ticks(); }
  std::string_view process_name() const { return file_.process_name(); }
  uint64_t dropped_strings() const;
  uint32_t dropped_threads() const;
  const std::string& path() const { return file_.path(); }

 private:
  RingReader(std::string path, MappedRing mapping);
  DrainStats DrainImpl(const SpanVisitor* visit);

  RingFile file_;
  RingHeader* header_;
  // Validated geometry, copied out of the header so a writer cannot change it under us.
  uint32_t max_threads_ = 0;
  uint32_t slots_ = 0;
  uint64_t slots_offset_ = 0;
  uint64_t records_offset_ = 0;
  std::vector<uint64_t> last_dropped_;  // per slot, to report drops since the last drain
};

// Ring files in `dir` (annotation rings by default; kGpuRingPrefix for GPU rings), sorted.
absl::StatusOr<std::vector<std::string>> ListRingFiles(const std::string& dir,
                                                       std::string_view prefix = kRingPrefix);

// Whether the process that wrote a ring is still running: its pid exists under `proc_root` with
// the same start time (a reused pid is not the same process).
bool ProcessAlive(const std::string& proc_root, uint32_t pid, uint64_t start_ticks);

// Whether the process that wrote the ring file at `path` still runs. A writer holds a shared
// flock(2) on its ring while it lives (shm::CreateTempShmFile), which tells even when the writer
// runs in another container of the pod, in a PID namespace where its pid means nothing here.
// Without that lock (a writer that has ended, or one of an SDK before the lock), ProcessAlive.
bool WriterAlive(const std::string& path, const std::string& proc_root, uint32_t pid,
                 uint64_t start_ticks);

// Deletes the ring file at `path` once the process that wrote it is gone (WriterAlive false; its
// records drained); `what` names the kind of ring in the log line.
void RemoveRingIfExited(const std::string& proc_root, const std::string& path, uint32_t pid,
                        uint64_t start_ticks, std::string_view what);

}  // namespace clusterprof::shm

#endif  // CLUSTERPROF_SIDECAR_TRACERS_RING_READER_H_
