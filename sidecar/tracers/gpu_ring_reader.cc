#include "sidecar/tracers/gpu_ring_reader.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "sdk/shm_file.h"
#include "sidecar/tracers/ring_reader.h"

namespace clusterprof::shm {

absl::StatusOr<std::unique_ptr<GpuRingReader>> GpuRingReader::Open(const std::string& path) {
  CLUSTERPROF_ASSIGN_OR_RETURN(const MappedRing mapped,
                               MapRingFile(path, sizeof(GpuRingHeader), "GPU ring"));
  const size_t size = mapped.size;
  std::unique_ptr<GpuRingReader> reader(new GpuRingReader(path, mapped));

  const GpuRingHeader& h = *reader->header_;
  CLUSTERPROF_RETURN_IF_ERROR(
      (CheckRingFormat<GpuRingHeader, GpuRecord>(h, kGpuRingMagic, "GPU ring", path)));
  const uint64_t capacity = h.capacity;
  const uint64_t records_offset = h.records_offset;
  if (capacity == 0 || (capacity & (capacity - 1)) != 0 || capacity > (uint64_t{1} << 26) ||
      records_offset % alignof(GpuRecord) != 0 ||
      !FitsInFile(size, records_offset, capacity * sizeof(GpuRecord)) ||
      !reader->file_.TakeHeader(h)) {
    return InconsistentRingLayout("GPU ring", path);
  }
  reader->capacity_ = capacity;
  reader->records_offset_ = records_offset;
  return reader;
}

GpuRingReader::GpuRingReader(std::string path, MappedRing mapping)
    : file_(std::move(path), mapping), header_(reinterpret_cast<GpuRingHeader*>(mapping.base)) {}

GpuRingReader::~GpuRingReader() = default;

uint64_t GpuRingReader::DrainImpl(const std::function<void(std::span<const GpuRecord>)>* visit) {
  const uint64_t read = header_->read_index.load(std::memory_order_relaxed);
  uint64_t write = header_->write_index.load(std::memory_order_acquire);
  // A writer that claims more than a ring's worth is broken or hostile: take one ring's worth.
  if (write < read) return 0;
  uint64_t from = read;
  if (write - read > capacity_) from = write - capacity_;
  const auto* records = reinterpret_cast<const GpuRecord*>(file_.base() + records_offset_);
  if (visit != nullptr) {
    uint64_t r = from;
    while (r < write) {
      const uint64_t index = r & (capacity_ - 1);
      const uint64_t count = std::min(write - r, capacity_ - index);
      (*visit)(std::span<const GpuRecord>(records + index, count));
      r += count;
    }
  }
  header_->read_index.store(write, std::memory_order_release);
  return write - from;
}

uint64_t GpuRingReader::Drain(const std::function<void(std::span<const GpuRecord>)>& visit) {
  return DrainImpl(&visit);
}

uint64_t GpuRingReader::Skip() { return DrainImpl(nullptr); }

GpuRingStatus GpuRingReader::ReadStatus() const {
  GpuRingStatus status;
  const GpuRingHeader& h = *header_;
  const uint32_t state = h.state.load(std::memory_order_acquire);
  status.state = state <= static_cast<uint32_t>(GpuState::kFailed) ? static_cast<GpuState>(state)
                                                                   : GpuState::kFailed;
  status.armed_seq = h.armed_seq.load(std::memory_order_acquire);
  status.flushed_seq = h.flushed_seq.load(std::memory_order_acquire);
  status.armed_wall_ns = h.armed_wall_ns.load(std::memory_order_relaxed);
  status.capped_activity = h.capped_activity.load(std::memory_order_relaxed);
  status.capped_api = h.capped_api.load(std::memory_order_relaxed);
  status.cupti_dropped = h.cupti_dropped.load(std::memory_order_relaxed);
  status.ring_dropped = h.dropped.load(std::memory_order_relaxed);
  status.dropped_strings = h.dropped_strings.load(std::memory_order_relaxed);
  status.error_seq = h.error_seq.load(std::memory_order_acquire);
  if (status.error_seq != 0) status.error.assign(h.error, strnlen(h.error, sizeof(h.error)));
  return status;
}

std::vector<GpuDeviceInfo> GpuRingReader::Devices() const {
  const uint32_t count =
      std::min(header_->num_devices.load(std::memory_order_acquire), kMaxGpuDevices);
  std::vector<GpuDeviceInfo> devices(header_->devices, header_->devices + count);
  for (GpuDeviceInfo& device : devices) device.name[sizeof(device.name) - 1] = '\0';
  return devices;
}

std::string_view GpuRingReader::String(uint32_t id) const { return file_.String(id); }

}  // namespace clusterprof::shm
