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
#ifndef CLUSTERPROF_SIDECAR_SDK_ANNOTATE_H_
#define CLUSTERPROF_SIDECAR_SDK_ANNOTATE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>

#include "sidecar/sdk/shm_format.h"

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

// Starts an event: checks the level again (the first call in a process sets the SDK up), gets
// the thread's ring, and fills `record` (start, name, the first two args inline; further args
// go TraceMe-encoded into `extra`). Returns false when nothing is to be recorded.
bool BeginComplete(int level, std::string_view name, std::initializer_list<Arg> args,
                   shm::Record* record, std::string** extra);
// Finishes and writes the event. `extra` (may be null; deleted here) holds metadata pairs to
// encode into the name.
bool EndComplete(std::string_view name, std::string* extra, shm::Record* record);
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
  explicit Trace(std::string_view name, int level = kAnnotationLevelInfo)
      : Trace(name, {}, level) {}
  Trace(std::string_view name, std::initializer_list<annotate_internal::Arg> args,
        int level = kAnnotationLevelInfo) {
    // Off, the members stay untouched but active_: nothing else is constructed or destroyed.
    if (level <= annotate_internal::CurrentLevel()) [[unlikely]] {
      extra_ = nullptr;
      active_ = annotate_internal::BeginComplete(level, name, args, &record_, &extra_);
      name_ = name;
    }
  }
  ~Trace() {
    if (active_) [[unlikely]] {
      annotate_internal::EndComplete(name_, extra_, &record_);
    }
  }
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // Adds metadata recorded with the event, as Python's set_metadata does.
  void SetMetadata(std::initializer_list<annotate_internal::Arg> args) {
    if (active_) {
      if (extra_ == nullptr) extra_ = new std::string();
      annotate_internal::EncodePairs(args, extra_);
    }
  }
  bool active() const { return active_; }

 private:
  bool active_ = false;
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

#endif  // CLUSTERPROF_SIDECAR_SDK_ANNOTATE_H_
