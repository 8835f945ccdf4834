// clusterprof annotations for C++ code: what tf.profiler.experimental.Trace is for Python.
//
//   {
//     clusterprof::Trace trace("train", {{"step_num", step}, {"_r", 1}});
//     ...
//     trace.SetMetadata({{"in_cache", true}});
//   }  // recorded here, as one event on this thread
//
//   clusterprof::SetThreadName("data_loader");
//   clusterprof::AsyncBegin("prefetch", id);  ...  clusterprof::AsyncEnd(id);  // any threads
//
// When no capture is armed, a Trace costs one relaxed atomic load and a branch. When one is, it
// writes one fixed-size record into this thread's shared-memory ring at the end of the scope:
// no lock and no allocation once the thread's ring and the names are set up. A full ring drops
// the record and counts it. Names and keys follow the TraceMe encoding (docs/trace-format.md).
//
// Armed, the common case makes no call into the library: the thread's ring is set up, the
// name, the args' keys and string values are literals (up to kNameCacheText bytes) the thread
// has recorded before, there are at most two args, and the TSC is calibrated. Then a Trace
// reads the TSC at each end, converts both readings at the end under one read of the
// calibration, and stores the record with one release store. Anything else (the thread's first
// event, a std::string name, SetMetadata, a clock other than the TSC) calls into annotate.cc.
#ifndef CLUSTERPROF_SDK_ANNOTATE_H_
#define CLUSTERPROF_SDK_ANNOTATE_H_

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>

#include "sdk/shm_format.h"

namespace clusterprof {

// TraceMe levels: 1 critical (steps), 2 info (the default), 3 verbose.
inline constexpr int kAnnotationLevelCritical = 1;
inline constexpr int kAnnotationLevelInfo = 2;
inline constexpr int kAnnotationLevelVerbose = 3;

namespace annotate_internal {

// Points at the control page's host_level (or at a static word before the SDK has looked for
// the page); never null.
extern std::atomic<const std::atomic<uint32_t>*> g_host_level;

// The process's current host tracer level: two loads, no call. The pointer is loaded with
// acquire so the mapping it points into is visible (free on x86: a plain load).
inline int CurrentLevel() {
  return static_cast<int>(std::min<uint32_t>(
      g_host_level.load(std::memory_order_acquire)->load(std::memory_order_relaxed), 1u << 30));
}
int64_t NowNs();
// CurrentLevel() once the SDK has looked for the control page (the first call does), so that a
// process without a sidecar reads 0 from its first call on. For the C ABI's tracing_enabled.
int InitializedLevel();

// Bumped by ResetForTesting and in a forked child. A thread whose ThreadHot::generation differs
// takes the slow path, which sets its ring up again (or finds it has none).
extern std::atomic<uint64_t> g_generation;

// The TSC's calibration against the wall clock: wall_ns = base_wall_ns + ((tsc - base_tsc) *
// ns_per_tick_q32 >> 32). annotate.cc's poller thread writes it every 200 ms, and only where the
// kernel's clocksource is the TSC; readers use the seqlock `seq` (odd while written).
struct alignas(64) TscCalibration {
  std::atomic<uint64_t> seq{0};
  std::atomic<int64_t> base_wall_ns{0};
  std::atomic<uint64_t> base_tsc{0};
  std::atomic<uint64_t> ns_per_tick_q32{0};  // 0: not calibrated; use NowNs()
};
extern TscCalibration g_tsc;

#if defined(__x86_64__)
inline uint64_t ReadTsc() { return __builtin_ia32_rdtsc(); }

// g_tsc, read consistently.
struct TscSnapshot {
  int64_t base_wall_ns;
  uint64_t base_tsc;
  uint64_t rate;  // ns_per_tick_q32
};

// Reads g_tsc; false while the poller writes it, or when it is not calibrated. The fields are
// loaded with acquire, which keeps the second load of `seq` after them: a seqlock without a
// fence (ThreadSanitizer does not model fences).
[[gnu::always_inline]] inline bool ReadTscCalibration(TscSnapshot* out) {
  const uint64_t seq = g_tsc.seq.load(std::memory_order_acquire);
  out->base_wall_ns = g_tsc.base_wall_ns.load(std::memory_order_acquire);
  out->base_tsc = g_tsc.base_tsc.load(std::memory_order_acquire);
  out->rate = g_tsc.ns_per_tick_q32.load(std::memory_order_acquire);
  return (seq & 1) == 0 && g_tsc.seq.load(std::memory_order_relaxed) == seq && out->rate != 0;
}

// Signed: a reading may precede the anchor (taken before a re-anchoring, or on a CPU whose TSC
// reads a little behind).
inline int64_t TscToWallNs(uint64_t tsc, const TscSnapshot& clock) {
  __extension__ using Int128 = __int128;
  const auto delta = static_cast<Int128>(static_cast<int64_t>(tsc - clock.base_tsc));
  return clock.base_wall_ns + static_cast<int64_t>((delta * clock.rate) >> 32);
}
#endif

// A cache of string ids, per thread: two-way set-associative, the set chosen by where the text
// lives (names are mostly literals, whose address never changes), each entry checked against a
// copy of the text (a reused buffer may hold other text at the same address and of the same
// size). Two ways, so that two names of a loop that fall into one set do not evict each other
// on every event. Texts longer than kNameCacheText are not cached here (annotate.cc has a cache
// for them).
inline constexpr int kNameCacheSetBits = 7;
inline constexpr size_t kNameCacheText = 56;
struct NameCacheEntry {
  uint32_t size_plus_one;  // 0: empty
  uint32_t id;
  char text[kNameCacheText];
};
static_assert(sizeof(NameCacheEntry) == 64);
// Way 0 holds the set's most recently added text.
using NameCacheSet = NameCacheEntry[2];

// What the inline path needs of the calling thread's ring. Owned by its thread; zero until the
// thread's ring is set up. The name cache holds ids of the string table of the ring file that
// the thread's ring belongs to, and is emptied when that changes.
struct ThreadHot {
  uint64_t generation;  // g_generation when the ring was set up; 0: no ring
  shm::ThreadSlot* slot;
  shm::Record* records;
  uint64_t mask;        // records in the ring - 1
  uint64_t read_index;  // the consumer's read_index when last loaded: a lower bound
  NameCacheSet names[size_t{1} << kNameCacheSetBits];
};
// Zero-initialized (so in .tbss, and accessed without a TLS wrapper call).
extern constinit thread_local ThreadHot t_hot;

// Fibonacci hashing: literals that lie next to each other land in unrelated sets.
inline NameCacheSet& NameCacheSetFor(ThreadHot& t, const char* data, size_t size) {
  const uint64_t hash = (reinterpret_cast<uintptr_t>(data) ^ size) * 0x9E37'79B9'7F4A'7C15ull;
  return t.names[hash >> (64 - kNameCacheSetBits)];
}

[[gnu::always_inline]] inline bool NameCacheHolds(const NameCacheEntry& entry, const char* data,
                                                  size_t size) {
  return entry.size_plus_one == size + 1 && (size == 0 || std::memcmp(entry.text, data, size) == 0);
}

// The id of `text` in the calling thread's ring file (the same id for the same text); 0 when the
// string table is full. Requires the thread's ring to be set up (t_hot.generation ==
// g_generation, or BeginComplete having returned true).
uint32_t Intern(std::string_view text);

// The id of `text` when the compiler knows its size (a literal) and the thread's name cache holds
// it; else 0, and the caller calls Intern. Never calls out: a call in the middle of the inline
// path would keep the compiler from seeing the args' keys and types after it.
[[gnu::always_inline]] inline uint32_t CachedId(ThreadHot& t, std::string_view text) {
  const size_t size = text.size();
  if (__builtin_constant_p(size) && size <= kNameCacheText) {
    const NameCacheSet& set = NameCacheSetFor(t, text.data(), size);
    if (NameCacheHolds(set[0], text.data(), size)) [[likely]] {
      return set[0].id;
    }
    if (NameCacheHolds(set[1], text.data(), size)) return set[1].id;
  }
  return 0;
}

// Whether the calling thread's ring has room for record `write` now that the consumer's
// read_index is loaded again; if not, counts the record as dropped. Out of line: rare.
bool HasRoom(ThreadHot& t, uint64_t write);

// Appends `record`, with the times given, to the calling thread's ring (t_hot, set up and
// current), as shm::ThreadRing::Append does, loading the consumer's read_index only when the ring
// looks full. The times are stored from registers: copying them through `record`, just written,
// would stall the copy's wide loads on the narrower stores (no store-to-load forwarding).
[[gnu::always_inline]] inline bool AppendToThreadRing(ThreadHot& t, const shm::Record& record,
                                                      int64_t start_ns, int64_t end_ns) {
  const uint64_t write = t.slot->write_index.load(std::memory_order_relaxed);
  if (write - t.read_index > t.mask && !HasRoom(t, write)) [[unlikely]] {
    return false;
  }
  shm::Record& out = t.records[write & t.mask];
  out.start_ns = start_ns;
  out.end_ns = end_ns;
  constexpr size_t kRest = offsetof(shm::Record, name_id);
  static_assert(kRest == 2 * sizeof(int64_t));
  std::memcpy(reinterpret_cast<char*>(&out) + kRest, reinterpret_cast<const char*>(&record) + kRest,
              sizeof(shm::Record) - kRest);
  t.slot->write_index.store(write + 1, std::memory_order_release);
  return true;
}

using Value = std::variant<int64_t, uint64_t, double, bool, std::string_view>;

struct Arg {
  std::string_view key;
  Value value;
  Arg(std::string_view k, int v) : key(k), value(int64_t{v}) {}
  Arg(std::string_view k, long v) : key(k), value(int64_t{v}) {}
  Arg(std::string_view k, long long v) : key(k), value(int64_t{v}) {}
  Arg(std::string_view k, unsigned v) : key(k), value(uint64_t{v}) {}
  Arg(std::string_view k, unsigned long v) : key(k), value(uint64_t{v}) {}
  Arg(std::string_view k, unsigned long long v) : key(k), value(uint64_t{v}) {}
  Arg(std::string_view k, double v) : key(k), value(v) {}
  Arg(std::string_view k, bool v) : key(k), value(v) {}
  Arg(std::string_view k, std::string_view v) : key(k), value(v) {}
  Arg(std::string_view k, const char* v) : key(k), value(std::string_view(v)) {}
  Arg(std::string_view k, const std::string& v) : key(k), value(std::string_view(v)) {}
};

// An arg that travels in the record, taken apart: what the record needs of it, but string ids.
struct InlineArg {
  std::string_view key;
  shm::ArgType type = shm::ArgType::kNone;
  uint64_t value = 0;     // the bits of an int64, uint64, double or bool (1/0)
  std::string_view text;  // a string value (type kString)

  InlineArg() = default;
  [[gnu::always_inline]] explicit InlineArg(const Arg& arg) : key(arg.key) {
    if (const auto* v = std::get_if<int64_t>(&arg.value)) {
      type = shm::ArgType::kInt64;
      value = static_cast<uint64_t>(*v);
    } else if (const auto* v = std::get_if<uint64_t>(&arg.value)) {
      type = shm::ArgType::kUint64;
      value = *v;
    } else if (const auto* v = std::get_if<double>(&arg.value)) {
      type = shm::ArgType::kDouble;
      value = std::bit_cast<uint64_t>(*v);
    } else if (const auto* v = std::get_if<bool>(&arg.value)) {
      type = shm::ArgType::kInt64;
      value = *v ? 1 : 0;
    } else {
      type = shm::ArgType::kString;
      text = *std::get_if<std::string_view>(&arg.value);
    }
  }
};

// The first two args, taken apart before a Trace loads the level: the compiler then sees their
// literal keys and value types, which it could not after an atomic load (GCC treats any atomic
// load as a possible write to memory that has escaped, and the list's array escapes to the slow
// path). Optimized away when off.
struct InlineArgs {
  [[gnu::always_inline]] explicit InlineArgs(std::initializer_list<Arg> args) {
    static_assert(shm::kMaxInlineArgs == 2);
    if (args.size() > 0) args0 = InlineArg(args.begin()[0]);
    if (args.size() > 1) args1 = InlineArg(args.begin()[1]);
  }
  InlineArg args0;
  InlineArg args1;
};

// `arg` as the record holds it, with string ids from CachedId: 0 where the cache has none, which
// `*cached` tells (it is cleared then).
[[gnu::always_inline]] inline shm::Arg CachedRecordArg(ThreadHot& t, const InlineArg& arg,
                                                       bool* cached) {
  shm::Arg out;
  out.key_id = CachedId(t, arg.key);
  out.type = arg.type;
  out.value = arg.value;
  if (arg.type == shm::ArgType::kString) {
    out.value = CachedId(t, arg.text);
    *cached = *cached && out.value != 0;
  }
  *cached = *cached && out.key_id != 0;
  return out;
}

// Starts an event: checks the level again (the first call in a process sets the SDK up), gets
// the thread's ring, and fills `record` (start, name, the first two args inline; further args
// go TraceMe-encoded into `extra`). Returns false when nothing is to be recorded.
bool BeginComplete(int level, std::string_view name, std::initializer_list<Arg> args,
                   shm::Record* record, std::string** extra);
// Sets `record`'s name id and the string ids of its inline args (the first two of `args`) with
// Intern: for the inline path, where the name cache did not have them all.
void InternIds(std::string_view name, std::initializer_list<Arg> args, shm::Record* record);
// Finishes and writes the event. `extra` (may be null; deleted here) holds metadata pairs to
// encode into the name.
bool EndComplete(std::string_view name, std::string* extra, shm::Record* record);
// EndComplete for an event whose record holds TSC readings instead of times: start_ns the
// reading at its start, `end_tsc` the one at its end.
bool EndCompleteTsc(std::string_view name, std::string* extra, shm::Record* record,
                    uint64_t end_tsc);
// Writes the event as EndComplete does, with the end time the caller set in `record` (the C ABI
// records events that its caller timed).
bool WriteComplete(std::string_view name, std::string_view extra, shm::Record* record);
bool RecordAsync(int level, bool begin, std::string_view name, uint64_t id, int64_t now_ns);
// Appends TraceMe-encoded pairs (`k=v,...`, no '#') to `out`, after a ',' if `out` is not empty.
void EncodePairs(std::initializer_list<Arg> args, std::string* out);

// Points the SDK at `dir` (as CLUSTERPROF_DIR would) and forgets its ring and control page;
// for tests that run several scenarios in one process.
void ResetForTesting(const std::string& dir);

}  // namespace annotate_internal

// A scoped annotation. Not copyable or movable; create it on the stack. The name must outlive
// the Trace (a literal, or a string of the enclosing scope); argument values are copied.
class Trace {
 public:
  // Inlined whatever the compiler's own judgement: off, a Trace must not cost a call.
  [[gnu::always_inline]] explicit Trace(std::string_view name, int level = kAnnotationLevelInfo)
      : Trace(name, {}, level) {}
  [[gnu::always_inline]] Trace(std::string_view name,
                               std::initializer_list<annotate_internal::Arg> args,
                               int level = kAnnotationLevelInfo) {
    // Taken apart before the level is loaded (InlineArgs says why); nothing of it is left when
    // off.
    const annotate_internal::InlineArgs inline_args(args);
    // Off, the members stay untouched but state_: nothing else is constructed or destroyed.
    if (level <= annotate_internal::CurrentLevel()) [[unlikely]] {
      Begin(name, args, inline_args, level);
    }
  }
  [[gnu::always_inline]] ~Trace() {
    if (state_ != kOff) [[unlikely]] {
      End();
    }
  }
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // Adds metadata recorded with the event, as Python's set_metadata does.
  void SetMetadata(std::initializer_list<annotate_internal::Arg> args) {
    if (state_ != kOff) {
      if (extra_ == nullptr) extra_ = new std::string();
      annotate_internal::EncodePairs(args, extra_);
    }
  }
  bool active() const { return state_ != kOff; }

 private:
  enum State : uint8_t {
    kOff,
    kStartNs,   // record_.start_ns is wall-clock ns
    kStartTsc,  // record_.start_ns holds the TSC reading at the start
  };

  [[gnu::always_inline]] void Begin(std::string_view name,
                                    std::initializer_list<annotate_internal::Arg> args,
                                    const annotate_internal::InlineArgs& inline_args, int level) {
    namespace ai = annotate_internal;
    extra_ = nullptr;
    name_ = name;
    ai::ThreadHot& t = ai::t_hot;
    if (t.generation != ai::g_generation.load(std::memory_order_relaxed) ||
        args.size() > shm::kMaxInlineArgs) [[unlikely]] {
      // The thread's first event, a new generation (fork, ResetForTesting), or args to encode.
      state_ = ai::BeginComplete(level, name, args, &record_, &extra_) ? kStartNs : kOff;
      return;
    }
    record_.kind = shm::RecordKind::kComplete;
    record_.reserved = 0;
    record_.async_id = 0;
    record_.name_id = ai::CachedId(t, name);
    bool cached = record_.name_id != 0;
    // Unrolled, so that the compiler sees each key's and value's type and size.
    static_assert(shm::kMaxInlineArgs == 2);
    record_.args[0] =
        args.size() > 0 ? ai::CachedRecordArg(t, inline_args.args0, &cached) : shm::Arg{};
    record_.args[1] =
        args.size() > 1 ? ai::CachedRecordArg(t, inline_args.args1, &cached) : shm::Arg{};
    record_.num_args = static_cast<uint8_t>(args.size());
    if (!cached) [[unlikely]] {
      ai::InternIds(name, args, &record_);  // a name new to this thread, or not a literal
    }
#if defined(__x86_64__)
    if (ai::g_tsc.ns_per_tick_q32.load(std::memory_order_relaxed) != 0) [[likely]] {
      record_.start_ns = static_cast<int64_t>(ai::ReadTsc());
      state_ = kStartTsc;
      return;
    }
#endif
    record_.start_ns = ai::NowNs();
    state_ = kStartNs;
  }

  [[gnu::always_inline]] void End() {
    namespace ai = annotate_internal;
#if defined(__x86_64__)
    if (state_ == kStartTsc) [[likely]] {
      const uint64_t end_tsc = ai::ReadTsc();
      ai::ThreadHot& t = ai::t_hot;
      // Not another generation (the SDK reset, or a forked child finishing a scope its parent
      // began: the parent's ring is not the child's to write), which EndCompleteTsc leaves out.
      if (t.generation == ai::g_generation.load(std::memory_order_relaxed) && extra_ == nullptr)
          [[likely]] {
        // Both readings converted with one calibration, read once.
        ai::TscSnapshot clock;
        if (ai::ReadTscCalibration(&clock)) [[likely]] {
          ai::AppendToThreadRing(t, record_,
                                 ai::TscToWallNs(static_cast<uint64_t>(record_.start_ns), clock),
                                 ai::TscToWallNs(end_tsc, clock));
          return;
        }
      }
      ai::EndCompleteTsc(name_, extra_, &record_, end_tsc);
      return;
    }
#endif
    ai::EndComplete(name_, extra_, &record_);
  }

  State state_ = kOff;
  std::string_view name_;
  shm::Record record_;
  // TraceMe-encoded pairs beyond the inline args: allocated only when there are some.
  std::string* extra_;
};

// Names the calling thread in traces (its line in XProf and Perfetto).
void SetThreadName(std::string_view name);

// Events that begin and end on different threads (or out of scope order), matched by `id`.
inline void AsyncBegin(std::string_view name, uint64_t id, int level = kAnnotationLevelInfo) {
  if (level <= annotate_internal::CurrentLevel()) {
    annotate_internal::RecordAsync(level, true, name, id, annotate_internal::NowNs());
  }
}
inline void AsyncEnd(uint64_t id, int level = kAnnotationLevelInfo) {
  if (level <= annotate_internal::CurrentLevel()) {
    annotate_internal::RecordAsync(level, false, {}, id, annotate_internal::NowNs());
  }
}

// Whether annotations at `level` are being recorded now.
inline bool TracingEnabled(int level = kAnnotationLevelInfo) {
  return level <= annotate_internal::CurrentLevel();
}

// The SDK's state in this process.
struct AnnotationStats {
  // Strings that did not fit the string table (their events have no name).
  uint64_t dropped_strings = 0;
  bool attached = false;  // the sidecar's control page is mapped
  std::string ring_path;  // empty until the first recorded event
};
AnnotationStats GetAnnotationStats();

}  // namespace clusterprof

#endif  // CLUSTERPROF_SDK_ANNOTATE_H_
