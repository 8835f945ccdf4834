// The shared-memory transport between instrumented processes and the sidecar (docs/shm-format.md).
//
// Files in $CLUSTERPROF_DIR (default /var/run/clusterprof), on a volume shared by the pod's
// containers:
//   control                          one page, written by the sidecar, read by every process
//   ring-<pid>-<start ticks>.shm     one per instrumented process, written by it, drained by the
//                                    sidecar, removed by the sidecar once the process is gone
//
// Everything here is plain data at fixed offsets; atomics are lock-free and address-free, so the
// layout is the same in every process that maps the files. Version changes are breaking: a reader
// ignores files whose magic or version it does not know.
#ifndef CLUSTERPROF_SIDECAR_SDK_SHM_FORMAT_H_
#define CLUSTERPROF_SIDECAR_SDK_SHM_FORMAT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace clusterprof::shm {

inline constexpr char kDefaultDir[] = "/var/run/clusterprof";
inline constexpr char kDirEnv[] = "CLUSTERPROF_DIR";
inline constexpr char kControlFileName[] = "control";
inline constexpr char kRingPrefix[] = "ring-";
inline constexpr char kRingSuffix[] = ".shm";

inline constexpr uint64_t kControlMagic = 0x3130'4C52'5443'5043;  // "CPCTRL01" little-endian
inline constexpr uint64_t kRingMagic = 0x3130'474E'4952'5043;     // "CPRING01"
inline constexpr uint32_t kVersion = 1;

// The sidecar's control page. A process records annotations at `level` only while
// host_level >= level; that check is one relaxed atomic load.
struct alignas(64) ControlPage {
  uint64_t magic;
  uint32_t version;
  uint32_t size;  // sizeof(ControlPage)
  // 0 = off. TraceMe levels: 1 critical, 2 info, 3 verbose.
  std::atomic<uint32_t> host_level;
  std::atomic<uint32_t> device_level;
  // Incremented each time a capture is armed; processes use it to notice a new session.
  std::atomic<uint64_t> session_seq;
  // The armed window (wall clock, ns since the Unix epoch); 0 when unknown.
  std::atomic<int64_t> start_ns;
  std::atomic<int64_t> stop_ns;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

enum class RecordKind : uint16_t {
  kComplete = 1,    // a scoped event: start_ns..end_ns on the writing thread
  kAsyncBegin = 2,  // begin of an event identified by async_id (may end on another thread)
  kAsyncEnd = 3,
};

enum class ArgType : uint32_t {
  kNone = 0,
  kInt64 = 1,
  kUint64 = 2,
  kDouble = 3,  // value holds the IEEE-754 bits
  kString = 4,  // value holds a string id
};

struct Arg {
  uint32_t key_id;  // string id of the key
  ArgType type;
  uint64_t value;
};

inline constexpr int kMaxInlineArgs = 2;

// One event. Fixed size, so a full ring drops whole records and counts them.
struct Record {
  int64_t start_ns;
  int64_t end_ns;
  uint32_t name_id;  // string id; 0 = none
  RecordKind kind;
  uint8_t num_args;
  uint8_t reserved;
  uint64_t async_id;
  Arg args[kMaxInlineArgs];
};
static_assert(sizeof(Record) == 64);

// One thread's single-producer, single-consumer ring of records.
struct alignas(64) ThreadSlot {
  std::atomic<uint64_t> write_index;  // records written; advanced by the producer (release)
  std::atomic<uint64_t> read_index;   // records drained; advanced by the sidecar (release)
  std::atomic<uint64_t> dropped;      // records lost because the ring was full
  std::atomic<uint32_t> tid;          // 0 while the slot is free
  std::atomic<uint32_t> name_id;      // thread name, a string id; 0 = unnamed
};

// Header of a process ring file; thread slots, record arrays and the string table follow at the
// offsets it gives.
struct alignas(64) RingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_size;  // sizeof(RingHeader)
  uint32_t pid;
  uint32_t max_threads;
  uint64_t process_start_ticks;  // /proc/<pid>/stat field 22: tells a reused pid apart
  uint32_t slots_per_thread;     // records per thread ring, a power of two
  uint32_t record_size;          // sizeof(Record)
  uint64_t slots_offset;         // ThreadSlot[max_threads]
  uint64_t records_offset;       // Record[max_threads][slots_per_thread]
  uint64_t strings_offset;       // the string table
  uint64_t strings_capacity;     // bytes
  uint64_t file_size;
  std::atomic<uint32_t> threads_claimed;  // slots handed out so far (never reused)
  std::atomic<uint32_t> dropped_threads;  // threads that found no free slot
  std::atomic<uint64_t> strings_used;     // bytes of the string table handed out
  std::atomic<uint64_t> dropped_strings;  // strings that did not fit (their events name id 0)
  char process_name[64];
};

// A string table entry: a 4-byte header holding length + 1, then the bytes, padded to 4. The
// header is stored last (release), so a reader that sees it non-zero sees the bytes. The string
// id is the entry's offset in the table plus one; 0 means "no string".
struct StringEntryHeader {
  std::atomic<uint32_t> length_plus_one;
};

// Defaults for a process ring: 64 threads x 65536 records x 64 bytes = 256 MiB of sparse file;
// pages are only touched as threads record (4 MiB for a thread that fills its ring). A ring holds
// 64 ms of a thread producing 1 M events/s: room for a drainer that a busy machine keeps off
// the CPU for tens of milliseconds. CLUSTERPROF_RING_EVENTS sets another size per thread.
inline constexpr uint32_t kDefaultMaxThreads = 64;
inline constexpr uint32_t kDefaultSlotsPerThread = 65536;
inline constexpr char kRingEventsEnv[] = "CLUSTERPROF_RING_EVENTS";
inline constexpr uint64_t kDefaultStringsCapacity = 4 << 20;

}  // namespace clusterprof::shm

#endif  // CLUSTERPROF_SIDECAR_SDK_SHM_FORMAT_H_
