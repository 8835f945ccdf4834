#include "sdk/cupti/cupti_recorder.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/control_page.h"
#include "sdk/cupti/injection_watcher.h"
#include "sdk/gpu_ring_writer.h"
#include "sidecar/tracers/gpu_ring_reader.h"
#include "tests/sdk/cupti/mock_cupti_api.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::cupti {
namespace {

using testing::ActivityBuffer;
using ::testing::AllOf;
using testing::ApiRecord;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::KernelRecord;
using testing::MarkerRecord;
using testing::MemcpyRecord;
using testing::MemsetRecord;
using testing::MockCuptiApi;
using testing::SyncRecord;

// Wall clock = CUPTI clock + this offset in these tests.
constexpr int64_t kWallOffset = 1'700'000'000'000'000'000 - 1'000'000'000;

class CuptiRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    ring_ = shm::GpuRingWriter::Create(dir_.path(), 1024, "trainer", &error);
    ASSERT_NE(ring_, nullptr) << error;
    recorder_ = std::make_unique<CuptiRecorder>(
        api_, *ring_, [this] { return static_cast<int64_t>(api_.cupti_now.load()) + kWallOffset; },
        [](std::chrono::microseconds) {});
    auto reader = shm::GpuRingReader::Open(ring_->path());
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = std::move(*reader);
  }

  std::vector<shm::GpuRecord> Drain() {
    std::vector<shm::GpuRecord> records;
    reader_->Drain([&](std::span<const shm::GpuRecord> span) {
      records.insert(records.end(), span.begin(), span.end());
    });
    return records;
  }
  static std::vector<shm::GpuRecord> Without(std::vector<shm::GpuRecord> records,
                                             shm::GpuRecordKind kind) {
    std::erase_if(records, [kind](const shm::GpuRecord& r) { return r.kind == kind; });
    return records;
  }

  clusterprof::testing::TempDir dir_;
  MockCuptiApi api_;
  std::unique_ptr<shm::GpuRingWriter> ring_;
  std::unique_ptr<CuptiRecorder> recorder_;
  std::unique_ptr<shm::GpuRingReader> reader_;
};

TEST_F(CuptiRecorderTest, EnablesTheActivityKindsAndFlushesAtDisable) {
  ASSERT_TRUE(recorder_->Enable(7, RecorderConfig()));
  EXPECT_TRUE(api_.callbacks_registered());
  EXPECT_THAT(api_.enabled(), ::testing::UnorderedElementsAre(
                                  CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_MEMSET,
                                  CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, CUPTI_ACTIVITY_KIND_RUNTIME,
                                  CUPTI_ACTIVITY_KIND_DRIVER))
      << "NVTX only when asked";
  const shm::GpuRingStatus armed = reader_->ReadStatus();
  EXPECT_EQ(armed.state, shm::GpuState::kArmed);
  EXPECT_EQ(armed.armed_seq, 7u);
  EXPECT_EQ(armed.flushed_seq, 0u);

  recorder_->Disable();
  EXPECT_THAT(api_.enabled(), IsEmpty());
  EXPECT_EQ(api_.calls().back(), "FlushAll forced");
  const shm::GpuRingStatus done = reader_->ReadStatus();
  EXPECT_EQ(done.state, shm::GpuState::kIdle);
  EXPECT_EQ(done.flushed_seq, 7u);
  // Clock calibrations at both ends, pairing CUPTI time with the wall clock.
  const std::vector<shm::GpuRecord> records = Drain();
  ASSERT_EQ(records.size(), 2u);
  for (const shm::GpuRecord& r : records) {
    EXPECT_EQ(r.kind, shm::GpuRecordKind::kClock);
    EXPECT_EQ(static_cast<int64_t>(r.end) - static_cast<int64_t>(r.start), kWallOffset);
  }
}

TEST_F(CuptiRecorderTest, NvtxRangesWhenAsked) {
  RecorderConfig config;
  config.nvtx = true;
  ASSERT_TRUE(recorder_->Enable(1, config));
  EXPECT_TRUE(api_.enabled().contains(CUPTI_ACTIVITY_KIND_MARKER));
  api_.Produce(ActivityBuffer()
                   .Add(MarkerRecord(5, 100, /*start=*/true, "forward", 42))
                   .Add(MarkerRecord(5, 300, /*start=*/false, nullptr, 42)));
  recorder_->Disable();
  const auto records = Without(Drain(), shm::GpuRecordKind::kClock);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, shm::GpuRecordKind::kNvtxRange);
  EXPECT_EQ(records[0].start, 100u);
  EXPECT_EQ(records[0].end, 300u);
  EXPECT_EQ(records[0].stream_id, 42u);
  EXPECT_EQ(reader_->String(records[0].name_id), "forward");
}

TEST_F(CuptiRecorderTest, ConvertsEveryActivityKind) {
  ASSERT_TRUE(recorder_->Enable(1, RecorderConfig()));
  api_.Produce(ActivityBuffer()
                   .Add(ApiRecord(CUPTI_ACTIVITY_KIND_RUNTIME, 211, 100, 150, 11, 4242))
                   .Add(KernelRecord(200, 900, 11, 7, "_Z5saxpyifPfS_"))
                   .Add(MemcpyRecord(1000, 1500, 12, 7, CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, 1 << 20))
                   .Add(MemsetRecord(1600, 1700, 13, 7, 4096))
                   .Add(SyncRecord(1800, 1900, 14, 7))
                   .Add(ApiRecord(CUPTI_ACTIVITY_KIND_DRIVER, 307, 120, 140, 15, 4242)));
  recorder_->Disable();
  const auto records = Without(Drain(), shm::GpuRecordKind::kClock);
  ASSERT_EQ(records.size(), 6u);

  EXPECT_EQ(records[0].kind, shm::GpuRecordKind::kRuntimeApi);
  EXPECT_EQ(reader_->String(records[0].name_id), "cudaLaunchKernel");
  EXPECT_EQ(records[0].stream_id, 4242u) << "API records carry the thread id";
  EXPECT_EQ(records[0].correlation_id, 11u);

  const shm::GpuRecord& kernel = records[1];
  EXPECT_EQ(kernel.kind, shm::GpuRecordKind::kKernel);
  EXPECT_EQ(reader_->String(kernel.name_id), "_Z5saxpyifPfS_");
  EXPECT_EQ(kernel.start, 200u);
  EXPECT_EQ(kernel.end, 900u);
  EXPECT_EQ(kernel.correlation_id, 11u);
  EXPECT_EQ(kernel.stream_id, 7u);
  EXPECT_EQ(kernel.kernel.grid[0], 128);
  EXPECT_EQ(kernel.kernel.block[0], 256);
  EXPECT_EQ(kernel.kernel.registers, 32);
  EXPECT_EQ(kernel.kernel.static_shared, 1024);
  EXPECT_EQ(kernel.kernel.dynamic_shared, 2048);

  EXPECT_EQ(records[2].kind, shm::GpuRecordKind::kMemcpy);
  EXPECT_EQ(records[2].subkind, static_cast<uint8_t>(shm::GpuCopyKind::kHtoD));
  EXPECT_EQ(records[2].memcpy.bytes, uint64_t{1} << 20);
  EXPECT_EQ(records[2].memcpy.async, 1);

  EXPECT_EQ(records[3].kind, shm::GpuRecordKind::kMemset);
  EXPECT_EQ(records[3].memset.bytes, 4096u);
  EXPECT_EQ(records[4].kind, shm::GpuRecordKind::kSync);
  EXPECT_EQ(records[4].subkind, CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE);
  EXPECT_EQ(records[5].kind, shm::GpuRecordKind::kDriverApi);
  EXPECT_EQ(reader_->String(records[5].name_id), "cuLaunchKernel");
  EXPECT_EQ(recorder_->records_written(), 6u);
}

TEST_F(CuptiRecorderTest, UnknownApiNamesGetTheirCallbackId) {
  ASSERT_TRUE(recorder_->Enable(1, RecorderConfig()));
  api_.Produce(ActivityBuffer().Add(ApiRecord(CUPTI_ACTIVITY_KIND_RUNTIME, 9999, 1, 2, 3, 4)));
  recorder_->Disable();
  const auto records = Without(Drain(), shm::GpuRecordKind::kClock);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(reader_->String(records[0].name_id), "cuda runtime call 9999");
}

TEST_F(CuptiRecorderTest, CapsCountWhatTheyDrop) {
  RecorderConfig config;
  config.max_activity_events = 2;
  config.max_api_events = 1;
  ASSERT_TRUE(recorder_->Enable(1, config));
  ActivityBuffer buffer;
  for (uint32_t i = 0; i < 5; ++i) buffer.Add(KernelRecord(100 * i, 100 * i + 50, i, 7, "k"));
  for (uint32_t i = 0; i < 3; ++i) {
    buffer.Add(ApiRecord(CUPTI_ACTIVITY_KIND_RUNTIME, 211, 10 * i, 10 * i + 5, i, 1));
  }
  api_.dropped_per_buffer = 4;
  api_.Produce(buffer);
  recorder_->Disable();
  EXPECT_EQ(Without(Drain(), shm::GpuRecordKind::kClock).size(), 3u);
  const shm::GpuRingStatus status = reader_->ReadStatus();
  EXPECT_EQ(status.capped_activity, 3u);
  EXPECT_EQ(status.capped_api, 2u);
  EXPECT_EQ(status.cupti_dropped, 4u);

  // A new capture starts counting afresh.
  api_.dropped_per_buffer = 0;
  ASSERT_TRUE(recorder_->Enable(2, config));
  EXPECT_EQ(reader_->ReadStatus().capped_activity, 0u);
  recorder_->Disable();
}

TEST_F(CuptiRecorderTest, PeriodicFlushHandsRecordsOverDuringTheCapture) {
  ASSERT_TRUE(recorder_->Enable(1, RecorderConfig()));
  api_.Produce(ActivityBuffer().Add(KernelRecord(10, 20, 1, 7, "k")));
  EXPECT_THAT(Without(Drain(), shm::GpuRecordKind::kClock), IsEmpty());
  recorder_->Flush();
  EXPECT_EQ(Drain().size(), 1u);
  EXPECT_EQ(api_.calls().back(), "FlushAll");
  EXPECT_TRUE(recorder_->armed());
  recorder_->Disable();
}

TEST_F(CuptiRecorderTest, AnEnableErrorUndoesWhatWasEnabledAndSaysHowToFixIt) {
  api_.enable_results[CUPTI_ACTIVITY_KIND_MEMSET] = CUPTI_ERROR_INSUFFICIENT_PRIVILEGES;
  EXPECT_FALSE(recorder_->Enable(3, RecorderConfig()));
  EXPECT_TRUE(recorder_->failed());
  EXPECT_FALSE(recorder_->armed());
  EXPECT_THAT(api_.enabled(), IsEmpty()) << "kernel and memcpy tracing were turned off again";
  // Undone newest first.
  const std::vector<std::string> calls = api_.calls();
  const std::vector<std::string> tail(calls.end() - 3, calls.end());
  EXPECT_THAT(tail,
              ElementsAre("Disable " + std::to_string(CUPTI_ACTIVITY_KIND_MEMCPY2),
                          "Disable " + std::to_string(CUPTI_ACTIVITY_KIND_MEMCPY),
                          "Disable " + std::to_string(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)));
  const shm::GpuRingStatus status = reader_->ReadStatus();
  EXPECT_EQ(status.state, shm::GpuState::kFailed);
  EXPECT_THAT(status.error, HasSubstr("memset tracing"));
  EXPECT_THAT(status.error, HasSubstr("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"));
  EXPECT_THAT(status.error, HasSubstr("NVreg_RestrictProfilingToAdminUsers=0"));
  EXPECT_THAT(status.error, HasSubstr("CAP_SYS_ADMIN"));

  // Off for good: the next capture does not touch CUPTI.
  const size_t calls_before = api_.calls().size();
  EXPECT_FALSE(recorder_->Enable(4, RecorderConfig()));
  EXPECT_EQ(api_.calls().size(), calls_before);
}

TEST_F(CuptiRecorderTest, AnotherProfilerHoldingCuptiIsNamed) {
  api_.enable_results[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] =
      CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  EXPECT_FALSE(recorder_->Enable(1, RecorderConfig()));
  EXPECT_THAT(reader_->ReadStatus().error, HasSubstr("Nsight Systems"));
}

TEST_F(CuptiRecorderTest, AFailedFlushTurnsTracingOff) {
  ASSERT_TRUE(recorder_->Enable(1, RecorderConfig()));
  api_.flush_result = CUPTI_ERROR_UNKNOWN;
  recorder_->Disable();
  EXPECT_TRUE(recorder_->failed());
  const shm::GpuRingStatus status = reader_->ReadStatus();
  EXPECT_EQ(status.state, shm::GpuState::kFailed);
  EXPECT_THAT(status.error, HasSubstr("flushing its activity buffers"));
  EXPECT_EQ(status.flushed_seq, 1u) << "the sidecar must not wait for a flush that cannot come";
}

TEST_F(CuptiRecorderTest, ACuptiOlderThanCuda12IsRefusedNamingTheVersionsThatWork) {
  api_.version = 17;  // CUDA 11.7
  api_.library_path = "/usr/local/cuda-11.7/lib64/libcupti.so.11.7.101";
  EXPECT_FALSE(recorder_->Enable(1, RecorderConfig()));
  EXPECT_THAT(reader_->ReadStatus().error,
              AllOf(HasSubstr("API version 17"), HasSubstr("CUDA 12.0 to 13.x"),
                    HasSubstr("CLUSTERPROF_CUPTI_LIBRARY")));
  EXPECT_THAT(api_.enabled(), IsEmpty());
}

TEST_F(CuptiRecorderTest, CudaElevenPointEightIsToldFromTwelveByItsLibraryFile) {
  // CUDA 11.8, 12.0 and 12.1 all report API version 18.
  api_.version = 18;
  api_.library_path = "/usr/lib/x86_64-linux-gnu/libcupti.so.11.8.87";
  EXPECT_FALSE(recorder_->Enable(1, RecorderConfig()));
  EXPECT_THAT(reader_->ReadStatus().error,
              AllOf(HasSubstr("libcupti.so.11.8.87"), HasSubstr("API version 18")));
}

TEST_F(CuptiRecorderTest, DescribesTheDevices) {
  api_.device_count = 2;
  ASSERT_TRUE(recorder_->Enable(1, RecorderConfig()));
  recorder_->Disable();
  const std::vector<shm::GpuDeviceInfo> devices = reader_->Devices();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_STREQ(devices[1].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(devices[1].ordinal, 1u);
  EXPECT_EQ(devices[1].core_count, 132u);
  EXPECT_EQ(devices[1].compute_cap_major, 9u);
  EXPECT_EQ(devices[1].clock_rate_khz, 1'980'000u);
  // 2 x 2619 MHz x 5120 bits / 8 = 3.35 TB/s.
  EXPECT_EQ(devices[1].memory_bandwidth, uint64_t{2} * 2'619'000 * 1000 * 5120 / 8);
  EXPECT_EQ(devices[1].uuid[0], 0x10);
  // The limits occupancy follows from.
  EXPECT_EQ(devices[1].max_threads_per_block, 1024u);
  EXPECT_EQ(devices[1].max_threads_per_sm, 2048u);
  EXPECT_EQ(devices[1].regs_per_block, 65536u);
  EXPECT_EQ(devices[1].regs_per_sm, 65536u);
  EXPECT_EQ(devices[1].warp_size, 32u);
  EXPECT_EQ(devices[1].shared_per_block, 48u * 1024);
  EXPECT_EQ(devices[1].shared_per_sm, 228u * 1024);
  EXPECT_EQ(devices[1].shared_per_block_optin, 227u * 1024);
  EXPECT_EQ(devices[1].reserved_shared_per_block, 1024u);
}

// A recorder over the mock, for a CUPTI of one version.
struct VersionRig {
  VersionRig(uint32_t version, const std::string& library) {
    api.version = version;
    api.library_path = library;
    std::string error;
    ring = shm::GpuRingWriter::Create(dir.path(), 1024, "trainer", &error);
    EXPECT_NE(ring, nullptr) << error;
    recorder = std::make_unique<CuptiRecorder>(
        api, *ring, [this] { return static_cast<int64_t>(api.cupti_now.load()) + kWallOffset; },
        [](std::chrono::microseconds) {});
    auto opened = shm::GpuRingReader::Open(ring->path());
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (opened.ok()) reader = std::move(*opened);
  }
  clusterprof::testing::TempDir dir;
  MockCuptiApi api;
  std::unique_ptr<shm::GpuRingWriter> ring;
  std::unique_ptr<CuptiRecorder> recorder;
  std::unique_ptr<shm::GpuRingReader> reader;
};

// A buffer as the CUPTI of `version` fills it, each record in the struct that version writes
// (back to back, at that struct's size), read and converted like CUDA 13's.
template <typename Kernel, typename Memcpy, typename Sync>
void ExpectEveryKindConverted(uint32_t version, const std::string& library) {
  SCOPED_TRACE("CUPTI API version " + std::to_string(version) + ", " + library);
  VersionRig rig(version, library);
  ASSERT_NE(rig.reader, nullptr);
  ASSERT_TRUE(rig.recorder->Enable(1, RecorderConfig())) << rig.reader->ReadStatus().error;
  rig.api.Produce(
      ActivityBuffer(version)
          .Add(KernelRecord<Kernel>(200, 900, 11, 7, "_Z5saxpyifPfS_"))
          .Add(MemcpyRecord<Memcpy>(1000, 1500, 12, 8, CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, 1 << 20))
          .Add(SyncRecord<Sync>(1800, 1900, 14, 9))
          .Add(MemsetRecord(1600, 1700, 13, 7, 4096)));
  rig.recorder->Disable();
  std::vector<shm::GpuRecord> records;
  rig.reader->Drain([&](std::span<const shm::GpuRecord> span) {
    for (const shm::GpuRecord& r : span) {
      if (r.kind != shm::GpuRecordKind::kClock) records.push_back(r);
    }
  });
  ASSERT_EQ(records.size(), 4u);
  const shm::GpuRecord& kernel = records[0];
  EXPECT_EQ(kernel.kind, shm::GpuRecordKind::kKernel);
  EXPECT_EQ(rig.reader->String(kernel.name_id), "_Z5saxpyifPfS_");
  EXPECT_EQ(kernel.start, 200u);
  EXPECT_EQ(kernel.end, 900u);
  EXPECT_EQ(kernel.correlation_id, 11u);
  EXPECT_EQ(kernel.stream_id, 7u);
  EXPECT_EQ(kernel.context_id, 1u);
  EXPECT_EQ(kernel.kernel.grid[0], 128);
  EXPECT_EQ(kernel.kernel.block[0], 256);
  EXPECT_EQ(kernel.kernel.registers, 32);
  EXPECT_EQ(kernel.kernel.static_shared, 1024);
  EXPECT_EQ(kernel.kernel.dynamic_shared, 2048);
  const shm::GpuRecord& copy = records[1];
  EXPECT_EQ(copy.kind, shm::GpuRecordKind::kMemcpy);
  EXPECT_EQ(copy.subkind, static_cast<uint8_t>(shm::GpuCopyKind::kDtoH));
  EXPECT_EQ(copy.start, 1000u);
  EXPECT_EQ(copy.correlation_id, 12u);
  EXPECT_EQ(copy.stream_id, 8u);
  EXPECT_EQ(uint64_t{copy.memcpy.bytes}, uint64_t{1} << 20);
  EXPECT_EQ(copy.memcpy.src_kind, CUPTI_ACTIVITY_MEMORY_KIND_PINNED);
  EXPECT_EQ(copy.memcpy.async, 1);
  const shm::GpuRecord& sync = records[2];
  EXPECT_EQ(sync.kind, shm::GpuRecordKind::kSync);
  EXPECT_EQ(sync.subkind, CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE);
  EXPECT_EQ(sync.end, 1900u);
  EXPECT_EQ(sync.correlation_id, 14u);
  EXPECT_EQ(sync.stream_id, 9u);
  EXPECT_EQ(records[3].kind, shm::GpuRecordKind::kMemset);
  EXPECT_EQ(uint64_t{records[3].memset.bytes}, 4096u);
}

TEST(CuptiVersionsTest, TheRecordsOfEveryCuda12And13CuptiAreRead) {
  // 12.0 and 12.1 (libcupti.so.12, API version 18) to 12.6 (24): Kernel9, Memcpy5 and the first
  // Synchronization record.
  ExpectEveryKindConverted<CUpti_ActivityKernel9, CUpti_ActivityMemcpy5,
                           CUpti_ActivitySynchronization>(18, "/usr/lib/libcupti.so.12");
  ExpectEveryKindConverted<CUpti_ActivityKernel9, CUpti_ActivityMemcpy5,
                           CUpti_ActivitySynchronization>(22, "/usr/lib/libcupti.so.12.4.127");
  // 12.8 and 12.9 (26 to 28): Memcpy6 and Synchronization2.
  ExpectEveryKindConverted<CUpti_ActivityKernel9, CUpti_ActivityMemcpy6,
                           CUpti_ActivitySynchronization2>(28, "/usr/lib/libcupti.so.12.9.79");
  // 13.0 (130000, and 130001 for its first update): Kernel10.
  ExpectEveryKindConverted<CUpti_ActivityKernel10, CUpti_ActivityMemcpy6,
                           CUpti_ActivitySynchronization2>(130000, "/usr/lib/libcupti.so.13");
  ExpectEveryKindConverted<CUpti_ActivityKernel10, CUpti_ActivityMemcpy6,
                           CUpti_ActivitySynchronization2>(130001, "/usr/lib/libcupti.so.13");
}

TEST(GpuRingWriterTest, AFullRingWaitsForTheReaderThenDropsAndCounts) {
  clusterprof::testing::TempDir dir;
  std::string error;
  auto ring = shm::GpuRingWriter::Create(dir.path(), 4, "p", &error);
  ASSERT_NE(ring, nullptr) << error;
  auto reader = shm::GpuRingReader::Open(ring->path());
  ASSERT_TRUE(reader.ok());
  std::vector<shm::GpuRecord> records(6);
  int sleeps = 0;
  // The reader drains once while the writer waits: all six fit.
  const size_t written =
      ring->Append(records, std::chrono::microseconds(1000), [&](std::chrono::microseconds) {
        if (++sleeps == 1) (*reader)->Skip();
      });
  EXPECT_EQ(written, 6u);
  EXPECT_EQ((*reader)->ReadStatus().ring_dropped, 0u);
  // Nobody drains now: it waits its budget out, then drops.
  const size_t second =
      ring->Append(records, std::chrono::microseconds(1000), [](std::chrono::microseconds) {});
  EXPECT_EQ(second, 2u);
  EXPECT_EQ((*reader)->ReadStatus().ring_dropped, 4u);
}

TEST(GpuRingReaderTest, RejectsAFileOfAnotherFormat) {
  clusterprof::testing::TempDir dir;
  clusterprof::testing::WriteFileOrDie(dir.Join("gpu-1-2.shm"), std::string(1 << 16, 'x'));
  auto reader = shm::GpuRingReader::Open(dir.Join("gpu-1-2.shm"));
  ASSERT_FALSE(reader.ok());
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("unknown format"));
}

TEST(GpuRingReaderTest, ClampsAWriterThatClaimsMoreThanARing) {
  clusterprof::testing::TempDir dir;
  std::string error;
  auto ring = shm::GpuRingWriter::Create(dir.path(), 4, "p", &error);
  ASSERT_NE(ring, nullptr) << error;
  auto reader = shm::GpuRingReader::Open(ring->path());
  ASSERT_TRUE(reader.ok());
  ring->header().write_index.store(1'000'000);
  uint64_t seen = 0;
  (*reader)->Drain([&](std::span<const shm::GpuRecord> span) { seen += span.size(); });
  EXPECT_EQ(seen, 4u);
}

// The watcher, as the injection's thread drives it.
class InjectionWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    control_ = shm::ControlWriter::Create(dir_.path(), &error);
    ASSERT_NE(control_, nullptr) << error;
  }
  std::unique_ptr<InjectionWatcher> MakeWatcher(std::unique_ptr<CuptiApi> api,
                                                std::string load_error = "") {
    InjectionWatcher::Options options;
    options.dir = dir_.path();
    options.ring_records = 1024;
    options.process_name = "trainer";
    options.flush_every_polls = 3;
    options.wall_ns = [] { return int64_t{1'700'000'000'000'000'000}; };
    options.sleep = [](std::chrono::microseconds) {};
    options.log = [this](const std::string& message) { logged_.push_back(message); };
    return std::make_unique<InjectionWatcher>(std::move(options), std::move(api),
                                              std::move(load_error));
  }

  clusterprof::testing::TempDir dir_;
  std::unique_ptr<shm::ControlWriter> control_;
  std::vector<std::string> logged_;
};

TEST_F(InjectionWatcherTest, DormantUntilArmedThenRecordsUntilDisarmed) {
  auto owned = std::make_unique<MockCuptiApi>();
  MockCuptiApi* api = owned.get();
  auto watcher = MakeWatcher(std::move(owned));
  for (int i = 0; i < 5; ++i) watcher->Poll();
  EXPECT_EQ(watcher->ring(), nullptr) << "no file for a process never profiled";
  EXPECT_THAT(api->calls(), IsEmpty()) << "CUPTI untouched while no capture is armed";

  shm::ControlWriter::DeviceArming arming;
  arming.max_activity_events = 10;
  const uint64_t seq = control_->ArmDevice(arming);
  watcher->Poll();
  ASSERT_NE(watcher->ring(), nullptr);
  EXPECT_TRUE(watcher->recorder()->armed());
  EXPECT_EQ(watcher->ring()->header().armed_seq.load(), seq);
  // Every few polls the buffers are flushed.
  for (int i = 0; i < 3; ++i) watcher->Poll();
  EXPECT_EQ(api->calls().back(), "FlushAll");

  control_->DisarmDevice();
  watcher->Poll();
  EXPECT_FALSE(watcher->recorder()->armed());
  EXPECT_EQ(watcher->ring()->header().flushed_seq.load(), seq);
  EXPECT_THAT(api->enabled(), IsEmpty());

  // The next capture arms again, with a new sequence number.
  const uint64_t next = control_->ArmDevice(arming);
  watcher->Poll();
  EXPECT_EQ(watcher->ring()->header().armed_seq.load(), next);
  watcher->Shutdown();
  EXPECT_EQ(watcher->ring()->header().flushed_seq.load(), next) << "exit flushes";
}

TEST_F(InjectionWatcherTest, NoFlushDuringACaptureUnlessConfigured) {
  auto owned = std::make_unique<MockCuptiApi>();
  MockCuptiApi* api = owned.get();
  InjectionWatcher::Options options;
  options.dir = dir_.path();
  options.wall_ns = [] { return int64_t{1}; };
  options.sleep = [](std::chrono::microseconds) {};
  options.log = [](const std::string&) {};
  InjectionWatcher watcher(std::move(options), std::move(owned), "");
  control_->ArmDevice({});
  for (int i = 0; i < 100; ++i) watcher.Poll();
  for (const std::string& call : api->calls()) EXPECT_THAT(call, Not(HasSubstr("FlushAll")));
  control_->DisarmDevice();
  watcher.Poll();
  EXPECT_EQ(api->calls().back(), "FlushAll forced");
}

TEST_F(InjectionWatcherTest, FollowsAControlPageReplacedByARestartedSidecar) {
  auto watcher = MakeWatcher(std::make_unique<MockCuptiApi>());
  watcher->Poll();
  control_.reset();
  std::string error;
  control_ = shm::ControlWriter::Create(dir_.path(), &error);
  ASSERT_NE(control_, nullptr) << error;
  const uint64_t seq = control_->ArmDevice({});
  // The watcher looks for a new page every reattach_every_polls (200) polls.
  for (int i = 0; i < 200; ++i) watcher->Poll();
  ASSERT_NE(watcher->ring(), nullptr);
  EXPECT_EQ(watcher->ring()->header().armed_seq.load(), seq);
}

TEST_F(InjectionWatcherTest, WithoutLibcuptiTheSidecarHearsWhy) {
  auto watcher = MakeWatcher(nullptr, "cannot load libcupti (...)");
  control_->ArmDevice({});
  watcher->Poll();
  ASSERT_NE(watcher->ring(), nullptr);
  auto reader = shm::GpuRingReader::Open(watcher->ring()->path());
  ASSERT_TRUE(reader.ok());
  const shm::GpuRingStatus status = (*reader)->ReadStatus();
  EXPECT_EQ(status.state, shm::GpuState::kFailed);
  EXPECT_THAT(status.error, HasSubstr("cannot load libcupti"));
}

TEST_F(InjectionWatcherTest, ARefusalIsLoggedOnce) {
  auto api = std::make_unique<MockCuptiApi>();
  api->enable_results[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] = CUPTI_ERROR_INSUFFICIENT_PRIVILEGES;
  auto watcher = MakeWatcher(std::move(api));
  control_->ArmDevice({});
  watcher->Poll();
  control_->DisarmDevice();
  watcher->Poll();
  control_->ArmDevice({});
  watcher->Poll();
  ASSERT_EQ(logged_.size(), 1u);
  EXPECT_THAT(logged_[0], HasSubstr("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"));
}

}  // namespace
}  // namespace clusterprof::cupti
