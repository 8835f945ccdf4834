// Fuzzes the sidecar's reading of an annotation ring (docs/shm-format.md). The input is the whole
// content of a ring file (header, thread slots, records, string table) as a workload that writes
// garbage into its own shared memory could leave it. Two passes per input:
//
//  1. shm::RingReader on the file, checked against a model of the documented drain: the records
//     it hands out are exactly those of each claimed thread's ring from its read index to its
//     write index (clamped to one ring's worth), every string it returns is the string-table
//     entry the id names (empty when the id is out of the table), and the only bytes it writes in
//     the file are the read indices of the threads it drained.
//  2. A capture of AnnotationTracer, the sidecar's real path (the ring appears mid-capture, is
//     drained at the stop and turned into the /host:CPU plane), with this ring and, beside it, a
//     ring the SDK wrote for another workload: the events counted are the events in the plane, no
//     more than the records both rings hold, and the other workload's lines are exactly what a
//     capture without the hostile ring gives.
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

#include "sidecar/tracers/annotation_tracer.h"
#include "sidecar/tracers/ring_reader.h"
#include "sidecar/tracers/shm_transport.h"
#include "spdlog/spdlog.h"
#include "tests/sidecar/tracers/ring_fuzz_util.h"
#include "tests/support/fuzz_check.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace {

using clusterprof::fuzzing::FieldOffset;
using clusterprof::fuzzing::LoadAt;
using clusterprof::fuzzing::StoreAt;
using H = clusterprof::shm::RingHeader;
using Slot = clusterprof::shm::ThreadSlot;
namespace shm = clusterprof::shm;
namespace sidecar = clusterprof::sidecar;

// The file as the reader should leave it, and what it should hand out, from the header's
// geometry (valid: RingReader::Open accepted it).
class DrainModel {
 public:
  explicit DrainModel(std::string file) : file_(std::move(file)) {
    threads_ = LoadAt<uint32_t>(file_, FieldOffset(&H::max_threads));
    slots_ = LoadAt<uint32_t>(file_, FieldOffset(&H::slots_per_thread));
    slots_offset_ = LoadAt<uint64_t>(file_, FieldOffset(&H::slots_offset));
    records_offset_ = LoadAt<uint64_t>(file_, FieldOffset(&H::records_offset));
    strings_offset_ = LoadAt<uint64_t>(file_, FieldOffset(&H::strings_offset));
    strings_capacity_ = LoadAt<uint64_t>(file_, FieldOffset(&H::strings_capacity));
  }

  // The string-table entry `id` names: its offset + 1, a 4-byte length + 1, the bytes.
  std::string_view String(uint32_t id) const {
    if (id == 0 || (id - 1) % 4 != 0 || uint64_t{id} - 1 + 4 > strings_capacity_) return {};
    const uint64_t entry = strings_offset_ + id - 1;
    const uint32_t length_plus_one = LoadAt<uint32_t>(file_, entry);
    if (length_plus_one == 0 || length_plus_one - 1 > strings_capacity_ - (id - 1) - 4) return {};
    return std::string_view(file_).substr(entry + 4, length_plus_one - 1);
  }

  uint64_t SlotField(uint32_t thread, size_t field_offset) const {
    return LoadAt<uint64_t>(file_, slots_offset_ + uint64_t{thread} * sizeof(Slot) + field_offset);
  }
  uint32_t SlotField32(uint32_t thread, size_t field_offset) const {
    return LoadAt<uint32_t>(file_, slots_offset_ + uint64_t{thread} * sizeof(Slot) + field_offset);
  }
  std::string_view Record(uint32_t thread, uint64_t index) const {
    return std::string_view(file_).substr(
        records_offset_ +
            (uint64_t{thread} * slots_ + (index & (slots_ - 1))) * sizeof(shm::Record),
        sizeof(shm::Record));
  }
  void SetReadIndex(uint32_t thread, uint64_t value) {
    StoreAt(file_, slots_offset_ + uint64_t{thread} * sizeof(Slot) + FieldOffset(&Slot::read_index),
            value);
  }

  const std::string& file() const { return file_; }
  uint32_t threads() const { return threads_; }
  uint32_t slots() const { return slots_; }

 private:
  std::string file_;
  uint32_t threads_ = 0;
  uint32_t slots_ = 0;
  uint64_t slots_offset_ = 0;
  uint64_t records_offset_ = 0;
  uint64_t strings_offset_ = 0;
  uint64_t strings_capacity_ = 0;
};

// Walks the model through the threads in the order the reader drains them. While the reader is
// on a thread, the model's file holds the read indices of the threads before it only.
class DrainCursor {
 public:
  DrainCursor(DrainModel& model, uint32_t claimed) : model_(model), claimed_(claimed) {}

  // Finishes the threads before `index` (none may have records left) and opens `index`.
  void MoveTo(uint32_t index) {
    FUZZ_CHECK(index >= thread_);
    while (thread_ < index) {
      if (!open_) Open();
      if (tid_ != 0) {
        FUZZ_CHECK(next_ == end_);
        model_.SetReadIndex(thread_, end_);
      }
      open_ = false;
      ++thread_;
    }
    if (thread_ < claimed_ && !open_) Open();
  }

  // The next record the reader must hand out for the open thread.
  std::string_view Next() {
    FUZZ_CHECK(open_ && next_ < end_);
    return model_.Record(thread_, next_++);
  }

  uint32_t thread() const { return thread_; }
  uint32_t tid() const { return tid_; }

 private:
  void Open() {
    open_ = true;
    tid_ = model_.SlotField32(thread_, FieldOffset(&Slot::tid));
    next_ = end_ = 0;
    if (tid_ == 0) return;
    const uint64_t write = model_.SlotField(thread_, FieldOffset(&Slot::write_index));
    uint64_t read = model_.SlotField(thread_, FieldOffset(&Slot::read_index));
    // The documented clamp: more than one ring's worth, or a read index past the write index.
    if (write < read || write - read > model_.slots()) {
      read = write < read ? write : write - model_.slots();
    }
    next_ = read;
    end_ = write;
  }

  DrainModel& model_;
  const uint32_t claimed_;
  uint32_t thread_ = 0;
  bool open_ = false;
  uint32_t tid_ = 0;
  uint64_t next_ = 0;
  uint64_t end_ = 0;
};

// Pass 1: RingReader against the model. Returns whether the reader accepted the file.
bool CheckReader(const std::string& dir, const std::string& input) {
  clusterprof::fuzzing::PublishFile(dir, "ring-direct.shm", input);
  const std::string path = dir + "/ring-direct.shm";
  absl::StatusOr<std::unique_ptr<shm::RingReader>> reader = shm::RingReader::Open(path);
  if (!reader.ok()) return false;
  DrainModel model(input);
  const uint32_t claimed =
      std::min(LoadAt<uint32_t>(input, FieldOffset(&H::threads_claimed)), model.threads());
  DrainCursor cursor(model, claimed);
  uint64_t handed_out = 0;
  const shm::DrainStats stats =
      (*reader)->DrainSpans([&](const shm::ThreadInfo& info, std::span<const shm::Record> records) {
        FUZZ_CHECK(info.index < claimed && !records.empty());
        cursor.MoveTo(info.index);
        FUZZ_CHECK(info.tid == cursor.tid() && info.tid != 0);
        FUZZ_CHECK(info.name ==
                   model.String(model.SlotField32(info.index, FieldOffset(&Slot::name_id))));
        for (const shm::Record& record : records) {
          FUZZ_CHECK(std::memcmp(&record, cursor.Next().data(), sizeof(record)) == 0);
          FUZZ_CHECK((*reader)->String(record.name_id) == model.String(record.name_id));
          for (const shm::Arg& arg : record.args) {
            FUZZ_CHECK((*reader)->String(arg.key_id) == model.String(arg.key_id));
            if (arg.type == shm::ArgType::kString && arg.value <= UINT32_MAX) {
              const auto id = static_cast<uint32_t>(arg.value);
              FUZZ_CHECK((*reader)->String(id) == model.String(id));
            }
          }
        }
        handed_out += records.size();
      });
  cursor.MoveTo(claimed);
  FUZZ_CHECK(stats.records == handed_out);
  FUZZ_CHECK(handed_out <= uint64_t{claimed} * model.slots());
  // The drain wrote the read indices and nothing else (the mapping is shared with the file).
  reader->reset();
  FUZZ_CHECK(clusterprof::fuzzing::ReadFile(path) == model.file());
  return true;
}

size_t CountEvents(const tensorflow::profiler::XSpace& space) {
  size_t events = 0;
  for (const auto& plane : space.planes()) {
    for (const auto& line : plane.lines()) events += line.events_size();
  }
  return events;
}

// The sidecar side of pass 2: one tracer for the whole run, a capture per input.
class Capture {
 public:
  Capture() {
    std::filesystem::create_directories(proc_.path() + "/empty");
    // Liveness is read under an empty proc root and no writer holds a lock: every ring's writer
    // has exited, so the tracer removes each ring after its capture.
    auto shm =
        sidecar::ShmTransport::Create({.dir = dir_.path(), .proc_root = proc_.path() + "/empty"});
    if (!shm.ok()) clusterprof::fuzzing::Fail(std::string(shm.status().message()));
    shm_ = std::move(*shm);
    // The drainer thread never runs during a capture: the stop drains, deterministically. No
    // flight recorder: each capture opens the rings afresh and closes them after.
    auto tracer = sidecar::AnnotationTracer::Create(
        shm_.get(),
        {.drain_interval_ms = 3'600'000, .default_max_events = 4'000'000, .recorder_level = 0});
    if (!tracer.ok()) clusterprof::fuzzing::Fail(std::string(tracer.status().message()));
    tracer_ = std::move(*tracer);
  }

  // A capture during which the rings `files` (name, content) appear.
  tensorflow::profiler::XSpace Run(
      const std::vector<std::pair<std::string, std::string_view>>& files,
      sidecar::TracerStats* stats) {
    sidecar::CaptureConfig config;
    config.options.set_host_tracer_level(3);
    const sidecar::CaptureWindow window{clusterprof::fuzzing::kWindowStart,
                                        clusterprof::fuzzing::kWindowStop};
    FUZZ_CHECK(tracer_->Prepare(window, config).ok());
    FUZZ_CHECK(tracer_->Start(window, config).ok());
    for (const auto& [name, bytes] : files) {
      clusterprof::fuzzing::PublishFile(dir_.path(), name, bytes);
    }
    FUZZ_CHECK(tracer_->Stop(clusterprof::fuzzing::kWindowStop).ok());
    tensorflow::profiler::XSpace space;
    FUZZ_CHECK(tracer_->CollectInto(&space, stats).ok());
    // Rings the tracer could not open stay; the next input starts from an empty directory.
    for (const auto& [name, bytes] : files) std::filesystem::remove(dir_.path() + "/" + name);
    return space;
  }

 private:
  clusterprof::fuzzing::ScratchDir dir_;
  clusterprof::fuzzing::ScratchDir proc_;
  std::unique_ptr<sidecar::ShmTransport> shm_;
  std::unique_ptr<sidecar::AnnotationTracer> tracer_;
};

struct Fixture {
  clusterprof::fuzzing::ScratchDir direct;
  Capture capture;
  // Another workload of the pod: pid 1 in a container of its own, its main thread tid 1, like the
  // seeds' workload, but at other times (so that no hostile event can pass for one of its own).
  std::string other_ring =
      clusterprof::fuzzing::WriteSampleRing({.process_name = "other", .first_event_ns = 500'000});
  sidecar::TracerStats other_stats;
  tensorflow::profiler::XSpace other_alone =
      capture.Run({{"ring-5-5.shm", other_ring}}, &other_stats);
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  [[maybe_unused]] static const bool kQuiet = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  // Destroyed at exit, which removes its directories.
  static Fixture fixture;
  const std::string input(reinterpret_cast<const char*>(data), size);
  // Pass 2 bounds the events by the records the ring can hold when the reader accepts it.
  const uint64_t fits = CheckReader(fixture.direct.path(), input)
                            ? uint64_t{LoadAt<uint32_t>(input, FieldOffset(&H::max_threads))} *
                                  LoadAt<uint32_t>(input, FieldOffset(&H::slots_per_thread))
                            : 0;

  // Pass 2. The hostile ring sorts before the other workload's or after it (by the input's
  // length), so it gets the first pick of line ids or the second.
  sidecar::TracerStats stats;
  const tensorflow::profiler::XSpace space =
      fixture.capture.Run({{size % 2 == 0 ? "ring-1-1.shm" : "ring-9-9.shm", input},
                           {"ring-5-5.shm", fixture.other_ring}},
                          &stats);
  FUZZ_CHECK(stats.events == CountEvents(space));
  FUZZ_CHECK(stats.events <= fixture.other_stats.events + fits);
  // The annotation tracer gives every thread of every process a line of its own.
  FUZZ_CHECK(clusterprof::fuzzing::ContainsWorkload(space, fixture.other_alone,
                                                    [](std::string_view) { return true; }));
  return 0;
}
