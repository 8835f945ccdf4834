#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/control_page.h"
#include "sdk/ring_writer.h"
#include "sidecar/tracers/ring_reader.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::shm {
namespace {

using ::testing::HasSubstr;

Record MakeRecord(int64_t seq, uint32_t name_id = 0) {
  Record r{};
  r.start_ns = seq;
  r.end_ns = seq + 1;
  r.name_id = name_id;
  r.kind = RecordKind::kComplete;
  return r;
}

struct Fixture {
  testing::TempDir dir;
  std::unique_ptr<RingWriter> writer;
  std::unique_ptr<RingReader> reader;

  explicit Fixture(RingOptions options) {
    std::string error;
    writer = RingWriter::Create(dir.path(), options, &error);
    EXPECT_NE(writer, nullptr) << error;
    auto opened = RingReader::Open(writer->path());
    EXPECT_TRUE(opened.ok()) << opened.status();
    reader = std::move(*opened);
  }

  std::vector<int64_t> DrainSequence(DrainStats* stats = nullptr) {
    std::vector<int64_t> seen;
    DrainStats s =
        reader->Drain([&](const ThreadInfo&, const Record& r) { seen.push_back(r.start_ns); });
    if (stats != nullptr) *stats = s;
    return seen;
  }
};

TEST(RingTest, FileNameAndHeader) {
  Fixture f({.max_threads = 4, .slots_per_thread = 10, .process_name = "trainer"});
  EXPECT_THAT(f.writer->path(), HasSubstr("/ring-" + std::to_string(getpid()) + "-"));
  EXPECT_EQ(f.reader->pid(), static_cast<uint32_t>(getpid()));
  EXPECT_EQ(f.reader->process_name(), "trainer");
  EXPECT_EQ(f.writer->header().slots_per_thread, 16u) << "rounded up to a power of two";
  EXPECT_TRUE(ProcessAlive("/proc", f.reader->pid(), f.reader->process_start_ticks()));
}

// The shared-memory directory is shared with the pod's other containers: a link planted at the
// ring's temporary name does not make the workload write through it.
TEST(RingTest, ALinkPlantedAtTheTemporaryNameIsNotFollowed) {
  testing::TempDir dir;
  testing::TempDir elsewhere;
  const std::string victim = elsewhere.Join("victim");
  { std::ofstream(victim) << "keep"; }
  const RingOptions options{.max_threads = 1, .slots_per_thread = 4, .process_name = "trainer"};
  // The ring's name is ring-<pid>-<start ticks>.shm; plant a link at every name it could take.
  std::string error;
  std::unique_ptr<RingWriter> probe = RingWriter::Create(dir.path(), options, &error);
  ASSERT_NE(probe, nullptr) << error;
  const std::string path = probe->path();
  probe.reset();
  unlink(path.c_str());
  ASSERT_EQ(symlink(victim.c_str(), (path + ".tmp").c_str()), 0);

  std::unique_ptr<RingWriter> writer = RingWriter::Create(dir.path(), options, &error);
  ASSERT_NE(writer, nullptr) << error;
  struct stat info;
  ASSERT_EQ(lstat(writer->path().c_str(), &info), 0);
  EXPECT_TRUE(S_ISREG(info.st_mode)) << "the ring is a file of its own";
  ASSERT_EQ(stat(victim.c_str(), &info), 0);
  EXPECT_EQ(info.st_size, 4) << "the link's target is untouched";
}

// In Kubernetes the sidecar runs under its own user id and advances the ring's read cursor: the
// file is writable by every user that shares the pod's volume, whatever the workload's umask.
TEST(RingTest, FileIsReadAndWrittenByOtherUsersOfThePod) {
  const mode_t old_umask = umask(077);
  Fixture f({.max_threads = 1, .slots_per_thread = 4, .process_name = "trainer"});
  umask(old_umask);
  struct stat info;
  ASSERT_EQ(stat(f.writer->path().c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0666u);
}

TEST(RingTest, RecordsArriveInOrderAndWrapAround) {
  Fixture f({.max_threads = 1, .slots_per_thread = 8});
  ThreadRing* ring = f.writer->ClaimThread(42);
  ASSERT_NE(ring, nullptr);
  int64_t seq = 0;
  std::vector<int64_t> expected;
  for (int round = 0; round < 10; ++round) {  // 10 rounds of 5: the ring wraps many times
    expected.clear();
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(ring->Append(MakeRecord(seq)));
      expected.push_back(seq++);
    }
    EXPECT_EQ(f.DrainSequence(), expected);
  }
  EXPECT_TRUE(f.DrainSequence().empty());
}

TEST(RingTest, FullRingDropsAndCounts) {
  Fixture f({.max_threads = 1, .slots_per_thread = 8});
  ThreadRing* ring = f.writer->ClaimThread(1);
  int accepted = 0;
  for (int i = 0; i < 20; ++i) accepted += ring->Append(MakeRecord(i)) ? 1 : 0;
  EXPECT_EQ(accepted, 8);
  EXPECT_EQ(ring->dropped(), 12u);
  DrainStats stats;
  EXPECT_EQ(f.DrainSequence(&stats), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}))
      << "the oldest records are kept; the newest are dropped";
  EXPECT_EQ(stats.records, 8u);
  EXPECT_EQ(stats.dropped, 12u);
  f.DrainSequence(&stats);
  EXPECT_EQ(stats.dropped, 0u) << "drops are reported once";
  EXPECT_TRUE(ring->Append(MakeRecord(100))) << "room again after the drain";
}

TEST(RingTest, ManyThreadsWithAConcurrentDrainer) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 50'000;
  Fixture f({.max_threads = kThreads, .slots_per_thread = 1024});
  std::atomic<bool> done{false};
  std::vector<int64_t> last(kThreads, -1);
  uint64_t received = 0;
  uint64_t dropped = 0;
  bool in_order = true;
  std::thread drainer([&] {
    auto visit = [&](const ThreadInfo& info, const Record& r) {
      if (r.start_ns <= last[info.index]) in_order = false;
      last[info.index] = r.start_ns;
      ++received;
    };
    while (!done.load()) {
      const DrainStats s = f.reader->Drain(visit);
      dropped += s.dropped;
    }
    dropped += f.reader->Drain(visit).dropped;
  });
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      ThreadRing* ring = f.writer->ClaimThread(1000 + t);
      ASSERT_NE(ring, nullptr);
      for (int i = 0; i < kPerThread; ++i) ring->Append(MakeRecord(i));
    });
  }
  for (auto& p : producers) p.join();
  done = true;
  drainer.join();
  EXPECT_TRUE(in_order);
  EXPECT_EQ(received + dropped, uint64_t{kThreads} * kPerThread)
      << "every record is delivered or counted";
  EXPECT_GT(received, 0u);
}

TEST(RingTest, ThreadSlotsRunOut) {
  Fixture f({.max_threads = 2, .slots_per_thread = 8});
  EXPECT_NE(f.writer->ClaimThread(1), nullptr);
  EXPECT_NE(f.writer->ClaimThread(2), nullptr);
  EXPECT_EQ(f.writer->ClaimThread(3), nullptr);
  EXPECT_EQ(f.reader->dropped_threads(), 1u);
}

TEST(RingTest, StringsAreInternedOnce) {
  Fixture f({.max_threads = 1, .slots_per_thread = 8, .strings_capacity = 64});
  const uint32_t a = f.writer->Intern("train_step");
  EXPECT_NE(a, 0u);
  EXPECT_EQ(f.writer->Intern("train_step"), a);
  const uint32_t empty = f.writer->Intern("");
  EXPECT_NE(empty, 0u);
  EXPECT_EQ(f.reader->String(a), "train_step");
  EXPECT_EQ(f.reader->String(empty), "");
  EXPECT_EQ(f.reader->String(0), "");
  EXPECT_EQ(f.reader->String(3), "") << "not an entry boundary";
  EXPECT_EQ(f.reader->String(1'000'000), "") << "out of range";
  // Fill the table: further strings get id 0 and are counted.
  uint32_t last = 1;
  for (int i = 0; i < 10 && last != 0; ++i)
    last = f.writer->Intern("string number " + std::to_string(i));
  EXPECT_EQ(last, 0u);
  EXPECT_GE(f.reader->dropped_strings(), 1u);
}

TEST(RingTest, ThreadNamesReachTheReader) {
  Fixture f({.max_threads = 1, .slots_per_thread = 8});
  ThreadRing* ring = f.writer->ClaimThread(7);
  ring->SetName(f.writer->Intern("data_loader"));
  ring->Append(MakeRecord(1));
  std::string name;
  uint32_t tid = 0;
  f.reader->Drain([&](const ThreadInfo& info, const Record&) {
    name = std::string(info.name);
    tid = info.tid;
  });
  EXPECT_EQ(name, "data_loader");
  EXPECT_EQ(tid, 7u);
}

TEST(RingTest, SkipDiscardsOldRecords) {
  Fixture f({.max_threads = 1, .slots_per_thread = 8});
  ThreadRing* ring = f.writer->ClaimThread(1);
  ring->Append(MakeRecord(1));
  ring->Append(MakeRecord(2));
  EXPECT_EQ(f.reader->Skip().records, 2u);
  ring->Append(MakeRecord(3));
  EXPECT_EQ(f.DrainSequence(), (std::vector<int64_t>{3}));
}

TEST(RingTest, ExitedAndCrashedProcessesLeaveTheirRecords) {
  for (const bool crash : {false, true}) {
    testing::TempDir dir;
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      std::string error;
      auto writer =
          RingWriter::Create(dir.path(), {.max_threads = 1, .slots_per_thread = 64}, &error);
      if (writer == nullptr) _exit(2);
      ThreadRing* ring = writer->ClaimThread(static_cast<uint32_t>(getpid()));
      const uint32_t name = writer->Intern("before the end");
      for (int i = 0; i < 10; ++i) ring->Append(MakeRecord(i, name));
      if (crash) abort();
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    auto files = ListRingFiles(dir.path());
    ASSERT_TRUE(files.ok());
    ASSERT_EQ(files->size(), 1u);
    auto reader = RingReader::Open(files->front());
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_FALSE(ProcessAlive("/proc", (*reader)->pid(), (*reader)->process_start_ticks()));
    int count = 0;
    (*reader)->Drain([&](const ThreadInfo&, const Record& r) {
      EXPECT_EQ((*reader)->String(r.name_id), "before the end");
      ++count;
    });
    EXPECT_EQ(count, 10) << (crash ? "crashed" : "exited");
  }
}

// In a pod the writer runs in another container, another PID namespace: its pid is not (or is
// another process) under the sidecar's /proc. The ring's lock says whether it lives.
TEST(RingTest, AWriterInAnotherPidNamespaceIsAliveUntilItEnds) {
  testing::TempDir dir, empty_proc;
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string error;
    auto writer = RingWriter::Create(dir.path(), {.max_threads = 1, .slots_per_thread = 8}, &error);
    const char ready = writer != nullptr ? 'r' : 'e';
    if (write(from_child[1], &ready, 1) != 1) _exit(3);
    char go = 0;
    if (read(to_child[0], &go, 1) != 1) _exit(4);  // holds the ring until told to end
    _exit(0);
  }
  char ready = 0;
  ASSERT_EQ(read(from_child[0], &ready, 1), 1);
  ASSERT_EQ(ready, 'r');
  auto files = ListRingFiles(dir.path());
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 1u);
  auto reader = RingReader::Open(files->front());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const uint32_t pid = (*reader)->pid();
  const uint64_t ticks = (*reader)->process_start_ticks();
  // An empty /proc: the pid is nowhere to be seen, as from another container.
  EXPECT_FALSE(ProcessAlive(empty_proc.path(), pid, ticks));
  EXPECT_TRUE(WriterAlive(files->front(), empty_proc.path(), pid, ticks));
  RemoveRingIfExited(empty_proc.path(), files->front(), pid, ticks, "ring");
  EXPECT_EQ(access(files->front().c_str(), F_OK), 0) << "a live writer's ring was removed";

  ASSERT_EQ(write(to_child[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_FALSE(WriterAlive(files->front(), empty_proc.path(), pid, ticks));
  EXPECT_FALSE(WriterAlive(files->front(), "/proc", pid, ticks));
  RemoveRingIfExited(empty_proc.path(), files->front(), pid, ticks, "ring");
  EXPECT_NE(access(files->front().c_str(), F_OK), 0) << "an ended writer's ring was kept";
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) close(fd);
}

TEST(RingTest, AWriterThatEndsReleasesItsRingInTheSameProcessToo) {
  testing::TempDir dir, empty_proc;
  std::string error;
  auto writer = RingWriter::Create(dir.path(), {.max_threads = 1, .slots_per_thread = 8}, &error);
  ASSERT_NE(writer, nullptr) << error;
  const std::string path = writer->path();
  EXPECT_TRUE(WriterAlive(path, empty_proc.path(), 1, 1));
  writer.reset();
  EXPECT_FALSE(WriterAlive(path, empty_proc.path(), 1, 1));
}

TEST(RingReaderTest, RejectsCorruptFiles) {
  testing::TempDir dir;
  testing::WriteFileOrDie(dir.Join("ring-1-1.shm"), "short");
  EXPECT_EQ(RingReader::Open(dir.Join("ring-1-1.shm")).status().code(),
            absl::StatusCode::kInvalidArgument);
  testing::WriteFileOrDie(dir.Join("ring-2-2.shm"), std::string(8192, '\xab'));
  auto bad_magic = RingReader::Open(dir.Join("ring-2-2.shm"));
  EXPECT_EQ(bad_magic.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_magic.status().message(), HasSubstr("unknown format"));

  // A valid ring whose geometry a hostile writer then enlarges beyond the file.
  std::string error;
  auto writer = RingWriter::Create(dir.path(), {.max_threads = 1, .slots_per_thread = 8}, &error);
  ASSERT_NE(writer, nullptr);
  const_cast<RingHeader&>(writer->header()).slots_per_thread = 1u << 20;
  EXPECT_THAT(RingReader::Open(writer->path()).status().message(), HasSubstr("inconsistent"));
  EXPECT_EQ(RingReader::Open(dir.Join("missing.shm")).status().code(), absl::StatusCode::kNotFound);
}

TEST(RingReaderTest, HostileIndicesAreClamped) {
  Fixture f({.max_threads = 1, .slots_per_thread = 8});
  ThreadRing* ring = f.writer->ClaimThread(1);
  ring->Append(MakeRecord(1));
  auto* slot = reinterpret_cast<ThreadSlot*>(
      reinterpret_cast<char*>(const_cast<RingHeader*>(&f.writer->header())) +
      f.writer->header().slots_offset);
  slot->write_index.store(1'000'000);  // claims far more records than the ring holds
  DrainStats stats;
  const auto seen = f.DrainSequence(&stats);
  EXPECT_EQ(seen.size(), 8u) << "at most one ring's worth is read";
}

TEST(ProcessStartTicksTest, ParsesStatWithSpacesInTheName) {
  testing::TempDir proc;
  // Field 22 (start time) is 123456; the command name holds spaces and a ')'.
  testing::WriteFileOrDie(proc.Join("77/stat"),
                          "77 (python3 (my) job) S 1 77 77 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 "
                          "3 0 123456 1000 200 18446744073709551615\n");
  EXPECT_EQ(ProcessStartTicks(proc.path(), 77), 123456u);
  EXPECT_EQ(ProcessStartTicks(proc.path(), 78), 0u);
  EXPECT_TRUE(ProcessAlive(proc.path(), 77, 123456));
  EXPECT_FALSE(ProcessAlive(proc.path(), 77, 123457)) << "a reused pid is another process";
  testing::WriteFileOrDie(proc.Join("79/stat"),
                          "79 (crashed) Z 1 77 77 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 "
                          "3 0 5555 1000 200 18446744073709551615\n");
  EXPECT_FALSE(ProcessAlive(proc.path(), 79, 5555)) << "a zombie has exited";
}

TEST(ControlPageTest, ReaderSeesArmAndDisarm) {
  testing::TempDir dir;
  ControlReader reader;
  EXPECT_FALSE(reader.TryAttach(dir.path()));
  EXPECT_EQ(reader.page().host_level.load(), 0u) << "the static page reads as off";
  std::string error;
  auto writer = ControlWriter::Create(dir.path(), &error);
  ASSERT_NE(writer, nullptr) << error;
  ASSERT_TRUE(reader.TryAttach(dir.path()));
  EXPECT_EQ(reader.page().host_level.load(), 0u);
  const uint64_t seq = writer->ArmHost(2, 1000, 2000);
  EXPECT_EQ(seq, 1u);
  EXPECT_EQ(reader.page().host_level.load(), 2u);
  EXPECT_EQ(reader.page().device_level.load(), 0u) << "GPU tracing is armed on its own";
  EXPECT_EQ(reader.page().start_ns.load(), 1000);
  EXPECT_EQ(reader.page().stop_ns.load(), 2000);
  writer->DisarmHost();
  EXPECT_EQ(reader.page().host_level.load(), 0u);
  EXPECT_EQ(writer->ArmHost(1, 0, 0), 2u);

  ControlWriter::DeviceArming arming;
  arming.max_activity_events = 100;
  arming.max_api_events = 200;
  arming.flags = kGpuFlagNvtx;
  EXPECT_EQ(writer->ArmDevice(arming), 1u);
  EXPECT_EQ(reader.page().device_level.load(), 1u);
  EXPECT_EQ(reader.page().host_level.load(), 1u) << "arming the device leaves the host alone";
  EXPECT_EQ(reader.page().gpu_max_activity_events.load(), 100u);
  EXPECT_EQ(reader.page().gpu_max_api_events.load(), 200u);
  EXPECT_EQ(reader.page().gpu_flags.load(), uint32_t{kGpuFlagNvtx});
  EXPECT_GE(reader.page().size, sizeof(ControlPage));
  writer->Disarm();
  EXPECT_EQ(reader.page().device_level.load(), 0u);
  EXPECT_EQ(reader.page().host_level.load(), 0u);
}

TEST(ControlPageTest, GarbageControlFileIsIgnored) {
  testing::TempDir dir;
  testing::WriteFileOrDie(dir.Join("control"), std::string(4096, 'x'));
  ControlReader reader;
  EXPECT_FALSE(reader.TryAttach(dir.path()));
  EXPECT_FALSE(reader.attached());
}

}  // namespace
}  // namespace clusterprof::shm
