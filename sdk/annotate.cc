#include "sdk/annotate.h"

#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/xspace/traceme.h"
#include "sdk/control_page.h"
#include "sdk/ring_writer.h"

namespace clusterprof {
namespace annotate_internal {
namespace {

// Before the SDK has looked for the control page, the level reads as "everything", so the first
// annotation takes the slow path, which sets the SDK up and then checks the real level.
const std::atomic<uint32_t> kUnknownLevel{0xFFFFFFFF};

constexpr auto kAttachInterval = std::chrono::milliseconds(200);

// Process-wide SDK state. Never destroyed: threads may annotate while the process exits.
struct State {
  std::mutex mu;
  std::string dir;
  uint64_t generation = 1;  // bumped by ResetForTesting and after fork; g_generation mirrors it
  std::unique_ptr<shm::ControlReader> control;
  ino_t control_inode = 0;
  std::unique_ptr<shm::RingWriter> ring;
  bool ring_failed = false;
  bool poller_started = false;
};

State& GetState() {
  static State* state = new State();
  return *state;
}

std::string DirFromEnvironment() {
  const char* dir = std::getenv(shm::kDirEnv);
  return dir != nullptr && *dir != '\0' ? dir : shm::kDefaultDir;
}

ino_t InodeOf(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// Maps the control page if it is there, again if the sidecar recreated it, and falls back to
// "off" if it disappeared (a sidecar that died while armed must not leave processes recording).
// Requires state.mu.
void AttachLocked(State& state) {
  const ino_t inode = InodeOf(state.dir + "/" + shm::kControlFileName);
  if (inode == 0) {
    g_host_level.store(&shm::ControlReader::OffPage().host_level, std::memory_order_release);
    state.control_inode = 0;
    return;
  }
  if (state.control != nullptr && inode == state.control_inode) return;
  auto* control = new shm::ControlReader();
  if (!control->TryAttach(state.dir)) {
    delete control;
    if (g_host_level.load(std::memory_order_relaxed) == &kUnknownLevel) {
      g_host_level.store(&shm::ControlReader::OffPage().host_level, std::memory_order_release);
    }
    return;
  }
  g_host_level.store(&control->page().host_level, std::memory_order_release);
  // The previous mapping is left in place on purpose: other threads may be reading through it.
  (void)state.control.release();
  state.control.reset(control);
  state.control_inode = inode;
}

int64_t ClockGettimeNs(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

#if defined(__x86_64__)
// Timestamps from the TSC (g_tsc). clock_gettime(CLOCK_REALTIME) reads the TSC too (the vDSO),
// then scales it; doing that in the SDK, with the scale calibrated by the poller thread, saves
// most of the cost of two clock reads per event. Used only where the kernel itself trusts the
// TSC (its clocksource is "tsc", which implies an invariant TSC synchronized across CPUs);
// elsewhere, and until the first calibration, NowNs falls back to clock_gettime.
//
// The poller re-anchors (TSC, wall clock) every 200 ms and measures the TSC rate against
// CLOCK_MONOTONIC_RAW over a growing baseline, so NTP steps and slews reach the timestamps within
// one period.
bool TscUsable() {
  if (const char* env = std::getenv("CLUSTERPROF_TSC"); env != nullptr && env[0] == '0') {
    return false;
  }
  char source[32] = {};
  FILE* file = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (file == nullptr) return false;
  const bool read = std::fgets(source, sizeof(source), file) != nullptr;
  std::fclose(file);
  return read && std::strncmp(source, "tsc", 3) == 0 && (source[3] == '\n' || source[3] == 0);
}

// The poller's side. Not thread-safe: the poller thread only.
class TscCalibrator {
 public:
  TscCalibrator() : usable_(TscUsable()) {}

  void Update() {
    if (!usable_) return;
    // (TSC, raw, wall) read as close together as the machine allows: the best of a few tries.
    uint64_t tsc = 0;
    int64_t raw = 0;
    int64_t wall = 0;
    uint64_t best_gap = UINT64_MAX;
    for (int i = 0; i < 5; ++i) {
      const uint64_t t1 = ReadTsc();
      const int64_t r = ClockGettimeNs(CLOCK_MONOTONIC_RAW);
      const int64_t w = ClockGettimeNs(CLOCK_REALTIME);
      const uint64_t t2 = ReadTsc();
      if (t2 - t1 < best_gap) {
        best_gap = t2 - t1;
        tsc = t1 + (t2 - t1) / 2;
        raw = r;
        wall = w;
      }
    }
    if (first_tsc_ == 0) {
      first_tsc_ = tsc;
      first_raw_ = raw;
      return;
    }
    const uint64_t ticks = tsc - first_tsc_;
    const int64_t elapsed = raw - first_raw_;
    if (ticks == 0 || elapsed <= 0) return;
    const uint64_t rate =
        static_cast<uint64_t>((static_cast<unsigned __int128>(elapsed) << 32) / ticks);
    // The seqlock's writer: an odd seq, the fields (release: a reader that sees any of them
    // sees the odd seq too, and retries), an even seq.
    const uint64_t seq = g_tsc.seq.load(std::memory_order_relaxed);
    g_tsc.seq.store(seq + 1, std::memory_order_relaxed);
    g_tsc.base_wall_ns.store(wall, std::memory_order_release);
    g_tsc.base_tsc.store(tsc, std::memory_order_release);
    g_tsc.ns_per_tick_q32.store(rate, std::memory_order_release);
    g_tsc.seq.store(seq + 2, std::memory_order_release);
  }

 private:
  const bool usable_;
  uint64_t first_tsc_ = 0;
  int64_t first_raw_ = 0;
};
#else
class TscCalibrator {
 public:
  void Update() {}
};
#endif

void StartPollerLocked(State& state) {
  if (state.poller_started) return;
  state.poller_started = true;
  std::thread([] {
    State& s = GetState();
    TscCalibrator tsc;
    tsc.Update();
    while (true) {
      std::this_thread::sleep_for(kAttachInterval);
      tsc.Update();
      std::lock_guard<std::mutex> lock(s.mu);
      AttachLocked(s);
    }
  }).detach();
}

// After fork() the child has one thread, a copy of the parent's state, and the parent's ring
// mapped: it must not write there (two processes, one ring). It starts over with a ring of its
// own, and a poller of its own on its next annotation. The mutex is held across the fork
// (prepare/parent handlers), so the child's copy of the state is consistent.
void BeforeFork() { GetState().mu.lock(); }
void AfterForkInParent() { GetState().mu.unlock(); }
void AfterForkInChild() {
  State& state = GetState();
  new (&state.mu) std::mutex();  // the child's copy is locked by a thread it does not have
  (void)state.ring.release();    // the parent's ring: still mapped, never written again
  state.ring_failed = false;
  state.poller_started = false;
  ++state.generation;
  g_generation.store(state.generation, std::memory_order_release);
  // Until the child's poller calibrates again, timestamps come from clock_gettime.
  g_tsc.ns_per_tick_q32.store(0, std::memory_order_relaxed);
}

void EnsureInitializedLocked(State& state) {
  if (state.dir.empty()) state.dir = DirFromEnvironment();
  static const bool fork_handlers =
      pthread_atfork(BeforeFork, AfterForkInParent, AfterForkInChild) == 0;
  (void)fork_handlers;
  if (g_host_level.load(std::memory_order_relaxed) == &kUnknownLevel) AttachLocked(state);
  StartPollerLocked(state);
}

// Heterogeneous lookup: finding a string_view in the map builds no std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};

// Per-thread: the ring, the interned ids, the thread's name. t_hot holds what the inline path
// needs of the same ring.
struct ThreadState {
  uint64_t generation = 0;
  shm::ThreadRing* ring = nullptr;
  shm::RingWriter* writer = nullptr;
  bool failed = false;
  std::string name;
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> ids;
};

thread_local ThreadState t_state;

// Points t_hot at the thread's ring, which is set up and current.
void PublishThreadHot(const ThreadState& t) {
  t_hot.slot = t.ring->slot();
  t_hot.records = t.ring->records();
  t_hot.mask = t.ring->mask();
  t_hot.read_index = t_hot.slot->read_index.load(std::memory_order_acquire);
  t_hot.generation = t.generation;
}

// The calling thread's ring, set up on first use; nullptr when none can be had.
shm::ThreadRing* ThreadRingForThisThread(int level) {
  ThreadState& t = t_state;
  State& state = GetState();
  // Fast path: the thread's ring is set up and current.
  if (t.ring != nullptr && t.generation == g_generation.load(std::memory_order_acquire)) {
    return level <= CurrentLevel() ? t.ring : nullptr;
  }
  std::lock_guard<std::mutex> lock(state.mu);
  EnsureInitializedLocked(state);
  if (level > CurrentLevel()) return nullptr;  // the first look found the page off (or none)
  if (t.generation != state.generation) {
    t.generation = state.generation;
    t.ring = nullptr;
    t.writer = nullptr;
    t.failed = false;
    t.ids.clear();
    // The cached ids are the previous ring file's.
    t_hot.generation = 0;
    std::memset(t_hot.names, 0, sizeof(t_hot.names));
  }
  if (t.ring != nullptr) return t.ring;
  if (t.failed) return nullptr;
  if (state.ring == nullptr && !state.ring_failed) {
    std::string error;
    char name[64] = {};
    shm::RingOptions options;
    if (FILE* comm = std::fopen("/proc/self/comm", "r")) {
      if (std::fgets(name, sizeof(name), comm) != nullptr) name[std::strcspn(name, "\n")] = '\0';
      std::fclose(comm);
    }
    options.process_name = name;
    if (const char* events = std::getenv(shm::kRingEventsEnv); events != nullptr) {
      const long long value = std::atoll(events);
      if (value >= 1024 && value <= (1 << 22)) {
        options.slots_per_thread = static_cast<uint32_t>(value);
      } else {
        std::fprintf(stderr, "clusterprof: ignoring %s=%s (give 1024 to 4194304)\n",
                     shm::kRingEventsEnv, events);
      }
    }
    state.ring = shm::RingWriter::Create(state.dir, options, &error);
    if (state.ring == nullptr) {
      state.ring_failed = true;
      std::fprintf(stderr, "clusterprof: annotations are off in this process: %s\n", error.c_str());
    }
  }
  if (state.ring == nullptr) {
    t.failed = true;
    return nullptr;
  }
  t.writer = state.ring.get();
  t.ring = t.writer->ClaimThread(static_cast<uint32_t>(syscall(SYS_gettid)));
  if (t.ring == nullptr) {
    t.failed = true;
    return nullptr;
  }
  if (!t.name.empty()) t.ring->SetName(t.writer->Intern(t.name));
  PublishThreadHot(t);
  return t.ring;
}

// Names longer than t_hot's entries hold: a small direct-mapped cache keyed by where the text
// lives, checked against a copy of the text, in front of the per-thread map.
struct LongNameCacheEntry {
  const char* data = nullptr;
  uint64_t generation = 0;
  uint32_t id = 0;
  std::string text;
};
constexpr size_t kLongNameCacheSize = 64;
thread_local LongNameCacheEntry t_long_names[kLongNameCacheSize];

// Intern's look-up in the map and the ring's string table, for a text no cache holds.
uint32_t InternUncached(std::string_view text) {
  ThreadState& t = t_state;
  if (auto it = t.ids.find(text); it != t.ids.end()) return it->second;
  const uint32_t id = t.writer->Intern(text);
  if (id != 0) t.ids.emplace(std::string(text), id);
  return id;
}

shm::Arg ToShmArg(const Arg& arg) {
  shm::Arg out{};
  out.key_id = Intern(arg.key);
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          out.type = shm::ArgType::kInt64;
          out.value = static_cast<uint64_t>(v);
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          out.type = shm::ArgType::kUint64;
          out.value = v;
        } else if constexpr (std::is_same_v<T, double>) {
          out.type = shm::ArgType::kDouble;
          out.value = std::bit_cast<uint64_t>(v);
        } else if constexpr (std::is_same_v<T, bool>) {
          out.type = shm::ArgType::kInt64;
          out.value = v ? 1 : 0;
        } else {
          out.type = shm::ArgType::kString;
          out.value = Intern(v);
        }
      },
      arg.value);
  return out;
}

traceme::ArgValue ToTraceMeValue(const Value& value) {
  return std::visit([](const auto& v) { return traceme::ArgValue(v); }, value);
}

}  // namespace

std::atomic<const std::atomic<uint32_t>*> g_host_level{&kUnknownLevel};
std::atomic<uint64_t> g_generation{1};
TscCalibration g_tsc;
constinit thread_local ThreadHot t_hot{};

uint32_t Intern(std::string_view text) {
  if (text.size() <= kNameCacheText) {
    NameCacheSet& set = NameCacheSetFor(t_hot, text.data(), text.size());
    for (const NameCacheEntry& entry : set) {
      if (NameCacheHolds(entry, text.data(), text.size())) return entry.id;
    }
    const uint32_t id = InternUncached(text);
    if (id == 0) return 0;
    set[1] = set[0];
    set[0].size_plus_one = static_cast<uint32_t>(text.size() + 1);
    set[0].id = id;
    if (!text.empty()) std::memcpy(set[0].text, text.data(), text.size());
    return id;
  }
  const ThreadState& t = t_state;
  LongNameCacheEntry& entry =
      t_long_names[((reinterpret_cast<uintptr_t>(text.data()) >> 3) ^ text.size()) %
                   kLongNameCacheSize];
  if (entry.data == text.data() && entry.generation == t.generation && entry.text == text) {
    return entry.id;
  }
  const uint32_t id = InternUncached(text);
  if (id == 0) return 0;
  entry.data = text.data();
  entry.generation = t.generation;
  entry.id = id;
  entry.text.assign(text);
  return id;
}

bool HasRoom(ThreadHot& t, uint64_t write) {
  t.read_index = t.slot->read_index.load(std::memory_order_acquire);
  if (write - t.read_index <= t.mask) return true;
  t.slot->dropped.fetch_add(1, std::memory_order_relaxed);
  return false;
}

int64_t NowNs() {
#if defined(__x86_64__)
  TscSnapshot clock;
  if (ReadTscCalibration(&clock)) [[likely]] {
    return TscToWallNs(ReadTsc(), clock);
  }
#endif
  return ClockGettimeNs(CLOCK_REALTIME);
}

int InitializedLevel() {
  if (g_host_level.load(std::memory_order_acquire) == &kUnknownLevel) {
    State& state = GetState();
    std::lock_guard<std::mutex> lock(state.mu);
    EnsureInitializedLocked(state);
  }
  return CurrentLevel();
}

void EncodePairs(std::initializer_list<Arg> args, std::string* out) {
  if (args.size() == 0) return;
  std::vector<traceme::Arg> pairs;
  pairs.reserve(args.size());
  for (const Arg& arg : args) pairs.push_back({arg.key, ToTraceMeValue(arg.value)});
  const std::string encoded = traceme::Encode("x", pairs);  // "x#k=v,...#"
  if (!out->empty()) out->push_back(',');
  out->append(encoded, 2, encoded.size() - 3);
}

bool BeginComplete(int level, std::string_view name, std::initializer_list<Arg> args,
                   shm::Record* record, std::string** extra) {
  if (ThreadRingForThisThread(level) == nullptr) return false;
  // Every field is set here or in EndComplete; no zeroing first.
  record->kind = shm::RecordKind::kComplete;
  record->reserved = 0;
  record->async_id = 0;
  record->name_id = Intern(name);
  int index = 0;
  for (const Arg& arg : args) {
    if (index < shm::kMaxInlineArgs) {
      record->args[index++] = ToShmArg(arg);
    } else {
      if (*extra == nullptr) *extra = new std::string();
      EncodePairs({arg}, *extra);
    }
  }
  for (int i = index; i < shm::kMaxInlineArgs; ++i) record->args[i] = shm::Arg{};
  record->num_args = static_cast<uint8_t>(index);
  record->start_ns = NowNs();
  return true;
}

void InternIds(std::string_view name, std::initializer_list<Arg> args, shm::Record* record) {
  record->name_id = Intern(name);
  int index = 0;
  for (const Arg& arg : args) {
    if (index == shm::kMaxInlineArgs) break;
    record->args[index++] = ToShmArg(arg);
  }
}

namespace {

// EndComplete's work after it has read the clock; WriteComplete's as well. Inlined into both,
// so EndComplete stays one function on the hot path.
[[gnu::always_inline]] inline bool AppendComplete(std::string_view name, std::string_view extra,
                                                  shm::Record* record) {
  shm::ThreadRing* ring = t_state.ring;
  // A ring of another generation: the SDK was reset, or this is a forked child finishing a
  // scope its parent began (the parent's ring is not the child's to write).
  if (ring == nullptr || t_state.generation != g_generation.load(std::memory_order_relaxed)) {
    return false;
  }
  if (!extra.empty()) {
    // Metadata beyond the inline args rides in the name, TraceMe-encoded.
    std::string encoded;
    encoded.reserve(name.size() + extra.size() + 2);
    encoded.append(name);
    encoded.push_back('#');
    encoded.append(extra);
    encoded.push_back('#');
    record->name_id = Intern(encoded);
  }
  return ring->Append(*record);
}

}  // namespace

bool EndComplete(std::string_view name, std::string* extra, shm::Record* record) {
  record->end_ns = NowNs();
  if (extra == nullptr) [[likely]] {
    return AppendComplete(name, {}, record);
  }
  const bool written = AppendComplete(name, *extra, record);
  delete extra;
  return written;
}

bool EndCompleteTsc(std::string_view name, std::string* extra, shm::Record* record,
                    uint64_t end_tsc) {
#if defined(__x86_64__)
  const auto start_tsc = static_cast<uint64_t>(record->start_ns);
  bool converted = false;
  // The poller holds the seqlock for a few stores; it may lose its CPU while it does, so give up
  // after a while rather than spin behind it.
  for (int attempt = 0; attempt < 1000 && !converted; ++attempt) {
    TscSnapshot clock;
    if (ReadTscCalibration(&clock)) {
      record->start_ns = TscToWallNs(start_tsc, clock);
      record->end_ns = TscToWallNs(end_tsc, clock);
      converted = true;
    } else if (g_tsc.ns_per_tick_q32.load(std::memory_order_relaxed) == 0) {
      break;  // no calibration any more (a forked child)
    } else if (attempt % 16 == 15) {
      std::this_thread::yield();
    }
  }
  if (!converted) {
    // Without a calibration the readings cannot be scaled: the event keeps its place in time,
    // not its duration.
    record->end_ns = ClockGettimeNs(CLOCK_REALTIME);
    record->start_ns = record->end_ns;
  }
#else
  (void)end_tsc;
  record->end_ns = NowNs();
#endif
  if (extra == nullptr) return AppendComplete(name, {}, record);
  const bool written = AppendComplete(name, *extra, record);
  delete extra;
  return written;
}

bool WriteComplete(std::string_view name, std::string_view extra, shm::Record* record) {
  return AppendComplete(name, extra, record);
}

bool RecordAsync(int level, bool begin, std::string_view name, uint64_t id, int64_t now_ns) {
  shm::ThreadRing* ring = ThreadRingForThisThread(level);
  if (ring == nullptr) return false;
  shm::Record record{};
  record.start_ns = now_ns;
  record.end_ns = now_ns;
  record.kind = begin ? shm::RecordKind::kAsyncBegin : shm::RecordKind::kAsyncEnd;
  record.async_id = id;
  if (begin) record.name_id = Intern(name);
  return ring->Append(record);
}

void ResetForTesting(const std::string& dir) {
  State& state = GetState();
  std::lock_guard<std::mutex> lock(state.mu);
  state.dir = dir;
  ++state.generation;
  g_generation.store(state.generation, std::memory_order_release);
  state.ring.release();  // threads of the previous generation may still hold its pointers
  state.ring_failed = false;
  (void)state.control.release();  // may still be read by other threads
  state.control_inode = 0;
  g_host_level.store(&kUnknownLevel, std::memory_order_release);
}

}  // namespace annotate_internal

void SetThreadName(std::string_view name) {
  annotate_internal::t_state.name.assign(name);
  if (annotate_internal::t_state.ring != nullptr) {
    annotate_internal::t_state.ring->SetName(annotate_internal::Intern(name));
  }
}

AnnotationStats GetAnnotationStats() {
  AnnotationStats stats;
  annotate_internal::State& state = annotate_internal::GetState();
  std::lock_guard<std::mutex> lock(state.mu);
  const auto* level = annotate_internal::g_host_level.load();
  stats.attached = level != &shm::ControlReader::OffPage().host_level &&
                   level != &annotate_internal::kUnknownLevel;
  if (state.ring != nullptr) {
    stats.ring_path = state.ring->path();
    stats.dropped_strings = state.ring->header().dropped_strings.load();
  }
  return stats;
}

}  // namespace clusterprof
