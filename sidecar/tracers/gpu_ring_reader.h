// The sidecar's side of a GPU ring (sdk/shm_format.h): maps the file a CUDA process's
// libclusterprof_cupti writes and drains its records. The file is untrusted input: its geometry
// is validated once at open and copied out, indices are clamped and string ids bounds-checked, so
// a corrupt file yields an error or fewer records, never a read outside the mapping.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_GPU_RING_READER_H_
#define CLUSTERPROF_SIDECAR_TRACERS_GPU_RING_READER_H_

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

// What the process reports about its GPU tracing, read from the header.
struct GpuRingStatus {
  GpuState state = GpuState::kIdle;
  uint64_t armed_seq = 0;
  uint64_t flushed_seq = 0;
  int64_t armed_wall_ns = 0;
  uint64_t capped_activity = 0;
  uint64_t capped_api = 0;
  uint64_t cupti_dropped = 0;
  uint64_t ring_dropped = 0;  // since the file was created
  uint64_t dropped_strings = 0;
  uint32_t error_seq = 0;
  std::string error;
};

// Not thread-safe: one drainer per file.
class GpuRingReader {
 public:
  static absl::StatusOr<std::unique_ptr<GpuRingReader>> Open(const std::string& path);
  ~GpuRingReader();
  GpuRingReader(const GpuRingReader&) = delete;
  GpuRingReader& operator=(const GpuRingReader&) = delete;

  // Hands the records written since the last drain to `visit` (at most two contiguous pieces,
  // in memory the writer shares: copy them), then frees their room. Returns the count.
  uint64_t Drain(const std::function<void(std::span<const GpuRecord>)>& visit);
  // Discards everything written so far.
  uint64_t Skip();

  GpuRingStatus ReadStatus() const;
  // The devices the process described (validated count).
  std::vector<GpuDeviceInfo> Devices() const;
  std::string_view String(uint32_t id) const;

  uint32_t pid() const { return file_.pid(); }
  uint64_t process_start_ticks() const { return file_.process_start_ticks(); }
  std::string_view process_name() const { return file_.process_name(); }
  const std::string& path() const { return file_.path(); }

 private:
  GpuRingReader(std::string path, MappedRing mapping);
  uint64_t DrainImpl(const std::function<void(std::span<const GpuRecord>)>* visit);

  RingFile file_;
  GpuRingHeader* header_;
  uint64_t capacity_ = 0;
  uint64_t records_offset_ = 0;
};

}  // namespace clusterprof::shm

#endif  // CLUSTERPROF_SIDECAR_TRACERS_GPU_RING_READER_H_
