// Fuzzes the sidecar's reading of a GPU ring (docs/shm-format.md), the file libclusterprof_cupti
// writes in a CUDA process. The input is the whole content of the file (header with its status
// and device table, records, string table) as a workload that writes garbage into its own shared
// memory could leave it. Two passes per input:
//
//  1. shm::GpuRingReader on the file, checked against the documented drain: the records it hands
//     out are exactly those from the read index to the write index (clamped to one ring's worth;
//     none when the read index is ahead), every string it returns is the string-table entry the
//     id names, the status and the device table are the header's (error and names cut at their
//     size), and the only bytes it writes in the file are the read index.
//  2. A capture of GpuTracer, the sidecar's real path (armed, the ring appears, drained at the
//     stop, converted to /device:GPU:<n>, /host:CPU and /host:NVTX-CUPTI), with this ring and,
//     beside it, a ring the SDK wrote for another CUDA process: the events counted are the
//     events in the planes, no more than the records both rings hold, and the other process's
//     GPU stream lines are exactly, and its other events all, what a capture without the hostile
//     ring gives.
//
// Any violation traps; ASan and UBSan catch the rest.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sidecar/tracers/gpu_ring_reader.h"
#include "sidecar/tracers/gpu_tracer.h"
#include "sidecar/tracers/shm_transport.h"
#include "spdlog/spdlog.h"
#include "tests/sidecar/tracers/ring_fuzz_util.h"
#include "tests/support/fuzz_check.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace {

using clusterprof::fuzzing::FieldOffset;
using clusterprof::fuzzing::LoadAt;
using H = clusterprof::shm::GpuRingHeader;
namespace shm = clusterprof::shm;
namespace sidecar = clusterprof::sidecar;

// The string-table entry `id` names in `file` (offset + 1; a 4-byte length + 1, the bytes), empty
// when the id is 0 or the entry is not inside the table.
std::string_view ExpectedString(std::string_view file, uint32_t id) {
  const auto offset = LoadAt<uint64_t>(file, FieldOffset(&H::strings_offset));
  const auto capacity = LoadAt<uint64_t>(file, FieldOffset(&H::strings_capacity));
  if (id == 0 || (id - 1) % 4 != 0 || uint64_t{id} - 1 + 4 > capacity) return {};
  const uint32_t length_plus_one = LoadAt<uint32_t>(file, offset + id - 1);
  if (length_plus_one == 0 || length_plus_one - 1 > capacity - (id - 1) - 4) return {};
  return file.substr(offset + id - 1 + 4, length_plus_one - 1);
}

// Pass 1: GpuRingReader against the documented drain. Returns whether the reader accepted the
// file.
bool CheckReader(const std::string& dir, const std::string& input) {
  clusterprof::fuzzing::PublishFile(dir, "gpu-direct.shm", input);
  const std::string path = dir + "/gpu-direct.shm";
  absl::StatusOr<std::unique_ptr<shm::GpuRingReader>> reader = shm::GpuRingReader::Open(path);
  if (!reader.ok()) return false;
  const std::string_view file = input;
  const auto capacity = LoadAt<uint64_t>(file, FieldOffset(&H::capacity));
  const auto records_offset = LoadAt<uint64_t>(file, FieldOffset(&H::records_offset));
  const auto write = LoadAt<uint64_t>(file, FieldOffset(&H::write_index));
  const auto read = LoadAt<uint64_t>(file, FieldOffset(&H::read_index));

  // The status and devices, as the header says them.
  const shm::GpuRingStatus status = (*reader)->ReadStatus();
  const auto state = LoadAt<uint32_t>(file, FieldOffset(&H::state));
  FUZZ_CHECK(static_cast<uint32_t>(status.state) == std::min(state, 2u));
  const size_t error_at = FieldOffset(&H::error);
  const std::string_view error = file.substr(error_at, sizeof(H::error));
  FUZZ_CHECK(status.error == (status.error_seq == 0
                                  ? std::string_view()
                                  : error.substr(0, strnlen(error.data(), error.size()))));
  const std::vector<shm::GpuDeviceInfo> devices = (*reader)->Devices();
  FUZZ_CHECK(devices.size() ==
             std::min(LoadAt<uint32_t>(file, FieldOffset(&H::num_devices)), shm::kMaxGpuDevices));
  for (size_t i = 0; i < devices.size(); ++i) {
    const size_t at = FieldOffset(&H::devices) + i * sizeof(shm::GpuDeviceInfo);
    FUZZ_CHECK(std::memcmp(&devices[i], file.data() + at, sizeof(shm::GpuDeviceInfo) - 1) == 0);
    FUZZ_CHECK(devices[i].name[sizeof(devices[i].name) - 1] == '\0');
  }

  // The records, then the read index (written only when the write index is not behind it).
  const uint64_t from = write < read ? write : (write - read > capacity ? write - capacity : read);
  uint64_t next = from;
  const uint64_t drained = (*reader)->Drain([&](std::span<const shm::GpuRecord> records) {
    FUZZ_CHECK(!records.empty() && records.size() <= capacity);
    for (const shm::GpuRecord& record : records) {
      FUZZ_CHECK(next < write);
      const uint64_t at = records_offset + (next++ & (capacity - 1)) * sizeof(shm::GpuRecord);
      FUZZ_CHECK(std::memcmp(&record, file.data() + at, sizeof(record)) == 0);
      FUZZ_CHECK((*reader)->String(record.name_id) == ExpectedString(file, record.name_id));
      FUZZ_CHECK((*reader)->String(record.nvtx.domain_id) ==
                 ExpectedString(file, record.nvtx.domain_id));
    }
  });
  FUZZ_CHECK(next == write && drained == write - from && drained <= capacity);
  std::string expected = input;
  if (write >= read) {
    clusterprof::fuzzing::StoreAt(expected, FieldOffset(&H::read_index), write);
  }
  reader->reset();
  FUZZ_CHECK(clusterprof::fuzzing::ReadFile(path) == expected);
  return true;
}

size_t CountEvents(const tensorflow::profiler::XSpace& space) {
  size_t events = 0;
  for (const auto& plane : space.planes()) {
    for (const auto& line : plane.lines()) events += line.events_size();
  }
  return events;
}

// Pass 2: a capture of a sidecar that has just started (a fresh control page, so this capture's
// device_seq is 1, the one the sample rings echo), during which the rings `files` (name, content)
// appear. Liveness is read under an empty proc root and no writer holds a lock: the processes
// have exited, so the stop waits for no flush and the rings are removed after the capture.
tensorflow::profiler::XSpace Capture(
    const std::string& dir, const std::string& proc_root,
    const std::vector<std::pair<std::string, std::string_view>>& files,
    sidecar::TracerStats* stats) {
  auto shm = sidecar::ShmTransport::Create({.dir = dir, .proc_root = proc_root});
  if (!shm.ok()) clusterprof::fuzzing::Fail(std::string(shm.status().message()));
  // The drainer drains once as the capture is armed (before or after the rings appear: the same
  // records are kept either way), then an hour later: the stop drains the rest.
  auto tracer = sidecar::GpuTracer::Create(
      shm->get(), {.drain_interval_ms = 3'600'000, .flush_timeout_ms = 0}, nullptr);
  if (!tracer.ok()) clusterprof::fuzzing::Fail(std::string(tracer.status().message()));
  sidecar::CaptureConfig config;
  config.options.set_device_tracer_level(1);
  const sidecar::CaptureWindow window{clusterprof::fuzzing::kWindowStart,
                                      clusterprof::fuzzing::kWindowStop};
  FUZZ_CHECK((*tracer)->Prepare(window, config).ok());
  for (const auto& [name, bytes] : files) clusterprof::fuzzing::PublishFile(dir, name, bytes);
  FUZZ_CHECK((*tracer)->Start(window, config).ok());
  FUZZ_CHECK((*tracer)->Stop(clusterprof::fuzzing::kWindowStop).ok());
  tensorflow::profiler::XSpace space;
  FUZZ_CHECK((*tracer)->CollectInto(&space, stats).ok());
  tracer->reset();
  // Rings the tracer could not open stay; the next input starts from an empty directory.
  for (const auto& [name, bytes] : files) std::filesystem::remove(dir + "/" + name);
  return space;
}

struct Fixture {
  Fixture() { std::filesystem::create_directories(proc_root); }

  clusterprof::fuzzing::ScratchDir direct;
  clusterprof::fuzzing::ScratchDir dir;
  std::string proc_root = direct.path() + "/empty-proc";
  // Another CUDA process of the pod: pid 1 in a container of its own, like the seeds' process,
  // but at other times (so that no hostile event can pass for one of its own).
  std::string other_ring = clusterprof::fuzzing::WriteSampleGpuRing(
      {.process_name = "other", .first_record_ns = 500'000});
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  [[maybe_unused]] static const bool kQuiet = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  // Destroyed at exit, which removes its directories.
  static Fixture fixture;
  static sidecar::TracerStats other_stats;
  static const tensorflow::profiler::XSpace other_alone = Capture(
      fixture.dir.path(), fixture.proc_root, {{"gpu-5-5.shm", fixture.other_ring}}, &other_stats);

  const std::string input(reinterpret_cast<const char*>(data), size);
  const uint64_t fits = CheckReader(fixture.direct.path(), input)
                            ? LoadAt<uint64_t>(input, FieldOffset(&H::capacity))
                            : 0;

  // The hostile ring sorts before the other process's or after it (by the input's length).
  sidecar::TracerStats stats;
  const tensorflow::profiler::XSpace space = Capture(
      fixture.dir.path(), fixture.proc_root,
      {{size % 2 == 0 ? "gpu-1-1.shm" : "gpu-9-9.shm", input}, {"gpu-5-5.shm", fixture.other_ring}},
      &stats);
  FUZZ_CHECK(stats.events == CountEvents(space));
  FUZZ_CHECK(stats.events <= other_stats.events + fits);
  // Streams of two processes get lines of their own (docs/gpu.md); host threads' lines are keyed
  // by thread id, which processes in two PID namespaces may share.
  FUZZ_CHECK(clusterprof::fuzzing::ContainsWorkload(space, other_alone, [](std::string_view plane) {
    return plane.starts_with("/device:GPU:");
  }));
  return 0;
}
