// Helpers for the ring fuzzers (ring_reader_fuzzer, gpu_ring_reader_fuzzer) and their seed writer
// (write_ring_fuzz_seeds): sample rings written by the SDK's real writers, repacked into compact
// files that the fuzzer can mutate well, a scratch directory, and a comparison of a workload's
// lines in two XSpaces.
//
// The sample workloads run inside a fixed capture window (kWindowStart, kWindowStop). Every
// helper aborts on an environment failure (a scratch directory that cannot be written): that is
// a broken fuzzing host, not a finding.
#ifndef CLUSTERPROF_TESTS_SIDECAR_TRACERS_RING_FUZZ_UTIL_H_
#define CLUSTERPROF_TESTS_SIDECAR_TRACERS_RING_FUZZ_UTIL_H_

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "sdk/gpu_ring_writer.h"
#include "sdk/ring_writer.h"
#include "sdk/shm_file.h"
#include "sdk/shm_format.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::fuzzing {

// The capture window of the fuzzers (wall clock ns: 2026-01-01T00:00:00Z, one second).
inline constexpr int64_t kWindowStart = 1'767'225'600'000'000'000;
inline constexpr int64_t kWindowStop = kWindowStart + 1'000'000'000;
// The CUPTI timestamp that the sample GPU rings pair with kWindowStart.
inline constexpr uint64_t kCuptiAtStart = 5'000'000'000;

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "ring fuzz setup: %s\n", what.c_str());
  std::abort();
}

// A directory removed with its contents when the object dies: under /dev/shm when it exists (the
// sidecar's rings live on tmpfs), else under $TMPDIR or /tmp.
class ScratchDir {
 public:
  ScratchDir() {
    std::string base = "/dev/shm";
    if (access(base.c_str(), W_OK) != 0) {
      const char* tmp = getenv("TMPDIR");
      base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
    std::string pattern = base + "/clusterprof-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) Fail("cannot create a directory under " + base);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `bytes` to `<dir>/<name>` as the writers publish a ring: complete under a temporary name,
// then renamed, so a tracer never sees half a file.
inline void PublishFile(const std::string& dir, const std::string& name, std::string_view bytes) {
  const std::string path = dir + "/" + name;
  {
    std::ofstream out(path + ".tmp", std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) Fail("cannot write " + path + ".tmp");
  }
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) Fail("cannot rename " + path);
}

// The only file in `dir`, read and removed (what a writer left there).
inline std::string TakeOnlyFile(const std::string& dir) {
  std::string found;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!found.empty()) Fail("more than one file in " + dir);
    found = entry.path();
  }
  if (found.empty()) Fail("no file in " + dir);
  std::string bytes = ReadFile(found);
  std::filesystem::remove(found);
  return bytes;
}

// The offset of `field` in a header (the headers hold atomics, so offsetof does not apply).
template <typename H, typename F>
size_t FieldOffset(F H::*field) {
  static const H* const header = new H();
  return reinterpret_cast<const char*>(&(header->*field)) - reinterpret_cast<const char*>(header);
}

// The value of type T at `offset` of `bytes` (a file's bytes carry no alignment).
template <typename T>
T LoadAt(std::string_view bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

template <typename T>
void StoreAt(std::string& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// An annotation ring file as RingWriter laid it out (sections at 4 KiB boundaries, mostly
// zeros), repacked with every section next to the previous one and the string table cut to what
// is used. The reader accepts both layouts.
inline std::string CompactRing(const std::string& file) {
  using H = shm::RingHeader;
  const auto threads = LoadAt<uint32_t>(file, FieldOffset(&H::max_threads));
  const auto slots = LoadAt<uint32_t>(file, FieldOffset(&H::slots_per_thread));
  const uint64_t slots_bytes = uint64_t{threads} * sizeof(shm::ThreadSlot);
  const uint64_t records_bytes = uint64_t{threads} * slots * sizeof(shm::Record);
  const uint64_t strings_bytes =
      shm::AlignUp(LoadAt<uint64_t>(file, FieldOffset(&H::strings_used)), 4);
  const uint64_t slots_offset = shm::AlignUp(sizeof(H), alignof(shm::ThreadSlot));
  const uint64_t records_offset = slots_offset + slots_bytes;
  const uint64_t strings_offset = records_offset + records_bytes;
  std::string out(strings_offset + strings_bytes, '\0');
  auto copy = [&](uint64_t to, uint64_t H::*from, uint64_t size) {
    std::memcpy(out.data() + to, file.data() + LoadAt<uint64_t>(file, FieldOffset(from)), size);
  };
  std::memcpy(out.data(), file.data(), sizeof(H));
  copy(slots_offset, &H::slots_offset, slots_bytes);
  copy(records_offset, &H::records_offset, records_bytes);
  copy(strings_offset, &H::strings_offset, strings_bytes);
  StoreAt(out, FieldOffset(&H::slots_offset), slots_offset);
  StoreAt(out, FieldOffset(&H::records_offset), records_offset);
  StoreAt(out, FieldOffset(&H::strings_offset), strings_offset);
  StoreAt(out, FieldOffset(&H::strings_capacity), strings_bytes);
  StoreAt(out, FieldOffset(&H::file_size), uint64_t{out.size()});
  return out;
}

// The same for a GPU ring (GpuRingWriter gives every ring a 4 MiB string table).
inline std::string CompactGpuRing(const std::string& file) {
  using H = shm::GpuRingHeader;
  const uint64_t records_bytes =
      LoadAt<uint64_t>(file, FieldOffset(&H::capacity)) * sizeof(shm::GpuRecord);
  const uint64_t strings_bytes =
      shm::AlignUp(LoadAt<uint64_t>(file, FieldOffset(&H::strings_used)), 4);
  const uint64_t records_offset = shm::AlignUp(sizeof(H), alignof(shm::GpuRecord));
  const uint64_t strings_offset = records_offset + records_bytes;
  std::string out(strings_offset + strings_bytes, '\0');
  auto copy = [&](uint64_t to, uint64_t H::*from, uint64_t size) {
    std::memcpy(out.data() + to, file.data() + LoadAt<uint64_t>(file, FieldOffset(from)), size);
  };
  std::memcpy(out.data(), file.data(), sizeof(H));
  copy(records_offset, &H::records_offset, records_bytes);
  copy(strings_offset, &H::strings_offset, strings_bytes);
  StoreAt(out, FieldOffset(&H::records_offset), records_offset);
  StoreAt(out, FieldOffset(&H::strings_offset), strings_offset);
  StoreAt(out, FieldOffset(&H::strings_capacity), strings_bytes);
  StoreAt(out, FieldOffset(&H::file_size), uint64_t{out.size()});
  return out;
}

// What a sample annotation workload looks like.
struct SampleRing {
  std::string process_name = "trainer";
  // The pid in the header: a workload in a container of its own is often pid 1.
  uint32_t pid = 1;
  uint32_t max_threads = 2;
  uint32_t slots_per_thread = 8;
  uint64_t strings_capacity = 1024;
  // Records written per thread before the simulated sidecar drain, and after it (a ring that
  // wraps around when the two add up to more than slots_per_thread).
  int before_drain = 0;
  int after_drain = 6;
  // Threads that ask for a slot beyond max_threads (counted as dropped threads).
  int extra_threads = 0;
  // false: the file as RingWriter laid it out, not repacked.
  bool compact = true;
  // When its first event starts, after kWindowStart (events are 1 us apart).
  int64_t first_event_ns = 1'000;
};

// Writes a sample annotation ring with the SDK's RingWriter: per thread, TraceMe-style names with
// stats, inline arguments of every type, and async begin/end pairs that cross threads. Returns the
// compact file.
inline std::string WriteSampleRing(const SampleRing& sample) {
  ScratchDir dir;
  {
    shm::RingOptions options;
    options.max_threads = sample.max_threads;
    options.slots_per_thread = sample.slots_per_thread;
    options.strings_capacity = sample.strings_capacity;
    options.process_name = sample.process_name;
    std::string error;
    std::unique_ptr<shm::RingWriter> writer = shm::RingWriter::Create(dir.path(), options, &error);
    if (writer == nullptr) Fail(error);
    const uint32_t threads = sample.max_threads + sample.extra_threads;
    int64_t now = kWindowStart + sample.first_event_ns;
    for (uint32_t t = 0; t < threads; ++t) {
      const uint32_t tid = sample.pid + t;
      shm::ThreadRing* ring = writer->ClaimThread(tid);
      if (ring == nullptr) continue;
      ring->SetName(writer->Intern(t == 0 ? "main" : "loader-" + std::to_string(t)));
      auto* slot = reinterpret_cast<shm::ThreadSlot*>(
                       reinterpret_cast<char*>(const_cast<shm::RingHeader*>(&writer->header())) +
                       writer->header().slots_offset) +
                   t;
      for (int i = 0; i < sample.before_drain + sample.after_drain; ++i) {
        if (i == sample.before_drain) {
          // The sidecar drained what was written so far.
          slot->read_index.store(slot->write_index.load());
        }
        shm::Record record{};
        record.start_ns = now;
        record.end_ns = now + 500;
        now += 1000;
        switch (i % 4) {
          case 0:
            record.kind = shm::RecordKind::kComplete;
            record.name_id = writer->Intern("train_step#step_num=" + std::to_string(i) + "#");
            record.num_args = 2;
            record.args[0] = {writer->Intern("batch"), shm::ArgType::kInt64, uint64_t(-3)};
            record.args[1] = {writer->Intern("phase"), shm::ArgType::kString,
                              writer->Intern("forward")};
            break;
          case 1:
            record.kind = shm::RecordKind::kComplete;
            record.name_id = writer->Intern("data_loader#shard=7,lr=0.25#");
            record.num_args = 2;
            record.args[0] = {writer->Intern("bytes"), shm::ArgType::kUint64, 1u << 20};
            record.args[1] = {writer->Intern("loss"), shm::ArgType::kDouble,
                              0x3FD0000000000000};  // 0.25
            break;
          case 2:
            // Begun on this thread, ended on the next one (or never, on the last).
            record.kind = shm::RecordKind::kAsyncBegin;
            record.name_id = writer->Intern("allreduce");
            record.async_id = 100 + t;
            record.end_ns = record.start_ns;
            break;
          default:
            record.kind = shm::RecordKind::kAsyncEnd;
            record.async_id = 100 + (t == 0 ? threads : t - 1);
            record.end_ns = record.start_ns;
            break;
        }
        ring->Append(record);
      }
    }
  }
  std::string file = TakeOnlyFile(dir.path());
  // The process as the sample says, and a fixed start time: the same file from every run.
  StoreAt(file, FieldOffset(&shm::RingHeader::pid), sample.pid);
  StoreAt(file, FieldOffset(&shm::RingHeader::process_start_ticks), uint64_t{4242});
  return sample.compact ? CompactRing(file) : file;
}

// What a sample CUDA process looks like.
struct SampleGpuRing {
  std::string process_name = "trainer";
  uint32_t pid = 1;
  uint64_t capacity = 16;
  // The device_seq the process armed for and flushed (1: the first capture of a sidecar).
  uint64_t armed_seq = 1;
  // Records written before a simulated sidecar drain (a ring that wraps with the rest).
  int before_drain = 0;
  // A CUPTI failure: the state becomes failed with this error.
  std::string error;
  // When its first record starts, after kWindowStart (records are 1 us apart).
  uint64_t first_record_ns = 1'000;
};

// Writes a sample GPU ring with the SDK's GpuRingWriter, as libclusterprof_cupti fills it for a
// capture: clock calibrations at arm and disarm, kernels, copies of every direction, a memset, a
// synchronization, runtime and driver calls that launch them, an NVTX range, and two devices.
// Returns the compact file.
inline std::string WriteSampleGpuRing(const SampleGpuRing& sample) {
  ScratchDir dir;
  {
    std::string error;
    std::unique_ptr<shm::GpuRingWriter> writer =
        shm::GpuRingWriter::Create(dir.path(), sample.capacity, sample.process_name, &error);
    if (writer == nullptr) Fail(error);
    shm::GpuRingHeader& h = writer->header();
    h.armed_seq.store(sample.armed_seq);
    h.armed_wall_ns.store(kWindowStart - 5'000'000);
    h.state.store(static_cast<uint32_t>(shm::GpuState::kArmed));
    for (uint32_t i = 0; i < 2; ++i) {
      shm::GpuDeviceInfo& device = h.devices[i];
      device.ordinal = i;
      device.compute_cap_major = 9;
      device.core_count = 132;
      device.clock_rate_khz = 1'980'000;
      device.memory_size = uint64_t{80} << 30;
      device.memory_bandwidth = uint64_t{3'350} << 30;
      std::memset(device.uuid, 0x10 + i, sizeof(device.uuid));
      std::snprintf(device.name, sizeof(device.name), "NVIDIA H100 80GB HBM3");
    }
    h.num_devices.store(2);

    std::vector<shm::GpuRecord> records;
    records.reserve(32);
    uint64_t at = kCuptiAtStart + sample.first_record_ns;
    uint32_t correlation = 1;
    auto add = [&](shm::GpuRecordKind kind, uint32_t name_id) -> shm::GpuRecord& {
      shm::GpuRecord& r = records.emplace_back();
      r.kind = kind;
      r.start = at;
      r.end = at + 400;
      at += 1'000;
      r.name_id = name_id;
      r.correlation_id = correlation;
      r.stream_id = 7;
      r.context_id = 1;
      return r;
    };
    shm::GpuRecord& clock = add(shm::GpuRecordKind::kClock, 0);
    clock.start = kCuptiAtStart;
    clock.end = static_cast<uint64_t>(kWindowStart);
    const uint32_t launch = writer->Intern("cudaLaunchKernel");
    add(shm::GpuRecordKind::kRuntimeApi, launch).stream_id = sample.pid;
    shm::GpuRecord& kernel = add(shm::GpuRecordKind::kKernel, writer->Intern("_Z6matmulPfS_S_i"));
    kernel.kernel.grid[0] = 128;
    kernel.kernel.block[0] = 256;
    kernel.kernel.registers = 32;
    ++correlation;
    add(shm::GpuRecordKind::kDriverApi, writer->Intern("cuMemcpyHtoDAsync_v2")).stream_id =
        sample.pid + 1;
    for (uint8_t kind = 0; kind <= 6; ++kind) {
      shm::GpuRecord& copy = add(shm::GpuRecordKind::kMemcpy, 0);
      copy.subkind = kind;
      copy.device_id = kind == 5 ? 1 : 0;
      copy.memcpy.bytes = uint64_t{1} << (10 + kind);
      copy.memcpy.src_kind = 2;
      copy.memcpy.dst_kind = 3;
      copy.memcpy.dst_device = 1;
    }
    shm::GpuRecord& memset = add(shm::GpuRecordKind::kMemset, 0);
    memset.memset.bytes = 4096;
    memset.memset.memory_kind = 3;
    shm::GpuRecord& sync = add(shm::GpuRecordKind::kSync, 0);
    sync.subkind = 3;
    sync.stream_id = 0xFFFFFFFF;
    shm::GpuRecord& range = add(shm::GpuRecordKind::kNvtxRange, writer->Intern("forward"));
    range.stream_id = sample.pid;
    range.nvtx.domain_id = writer->Intern("pytorch");
    shm::GpuRecord& last_clock = add(shm::GpuRecordKind::kClock, 0);
    last_clock.start = kCuptiAtStart + 900'000'000;
    last_clock.end = static_cast<uint64_t>(kWindowStart + 900'000'010);

    const auto no_sleep = [](std::chrono::microseconds) {};
    std::span<const shm::GpuRecord> rest(records);
    if (sample.before_drain > 0) {
      const size_t n = std::min<size_t>(sample.before_drain, rest.size());
      writer->Append(rest.first(n), std::chrono::microseconds(0), no_sleep);
      h.read_index.store(h.write_index.load());  // the sidecar drained them
      rest = rest.subspan(n);
    }
    writer->Append(rest, std::chrono::microseconds(0), no_sleep);
    if (!sample.error.empty()) writer->SetError(sample.error);
    h.flushed_seq.store(sample.armed_seq);
  }
  std::string file = TakeOnlyFile(dir.path());
  StoreAt(file, FieldOffset(&shm::GpuRingHeader::pid), sample.pid);
  StoreAt(file, FieldOffset(&shm::GpuRingHeader::process_start_ticks), uint64_t{4242});
  return CompactGpuRing(file);
}

// A line's events as (event name, absolute start ps, duration ps), in order.
using LineEvents = std::vector<std::tuple<std::string, int64_t, int64_t>>;

// Every line of `space` by (plane name, line name), for comparing what one workload contributed
// to a capture with and without another workload beside it.
inline std::multimap<std::pair<std::string, std::string>, LineEvents> Lines(
    const tensorflow::profiler::XSpace& space) {
  std::multimap<std::pair<std::string, std::string>, LineEvents> lines;
  for (const auto& plane : space.planes()) {
    for (const auto& line : plane.lines()) {
      LineEvents events;
      for (const auto& event : line.events()) {
        auto metadata = plane.event_metadata().find(event.metadata_id());
        events.emplace_back(
            metadata != plane.event_metadata().end() ? metadata->second.name() : "?",
            // Wrapping arithmetic: a hostile ring's times may be anywhere.
            static_cast<int64_t>(static_cast<uint64_t>(line.timestamp_ns()) * 1000 +
                                 static_cast<uint64_t>(event.offset_ps())),
            event.duration_ps());
      }
      lines.emplace(std::pair(plane.name(), line.name()), std::move(events));
    }
  }
  return lines;
}

// Whether what one workload contributed to a capture alone (`alone`) is unchanged in a capture
// beside another workload (`together`). On planes for which `separate_lines` is true, each of its
// lines must appear with the same name and exactly the same events; on the others (lines keyed by
// thread id alone, which two processes may share), each of its events must appear on the plane.
inline bool ContainsWorkload(const tensorflow::profiler::XSpace& together,
                             const tensorflow::profiler::XSpace& alone,
                             const std::function<bool(std::string_view)>& separate_lines) {
  const auto all = Lines(together);
  std::map<std::string, std::multiset<LineEvents::value_type>> events_by_plane;
  for (const auto& [key, events] : all) {
    events_by_plane[key.first].insert(events.begin(), events.end());
  }
  for (const auto& line : Lines(alone)) {
    const auto& [key, events] = line;
    if (separate_lines(key.first)) {
      auto [first, last] = all.equal_range(key);
      if (std::none_of(first, last,
                       [&line](const auto& entry) { return entry.second == line.second; })) {
        return false;
      }
      continue;
    }
    std::multiset<LineEvents::value_type>& plane = events_by_plane[key.first];
    for (const auto& event : events) {
      auto it = plane.find(event);
      if (it == plane.end()) return false;
      plane.erase(it);
    }
  }
  return true;
}

}  // namespace clusterprof::fuzzing

#endif  // CLUSTERPROF_TESTS_SIDECAR_TRACERS_RING_FUZZ_UTIL_H_
