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
#ifndef CLUSTERPROF_SDK_SHM_FORMAT_H_
#define CLUSTERPROF_SDK_SHM_FORMAT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace clusterprof::shm {

inline constexpr char kDefaultDir[] = "/var/run/clusterprof";
inline constexpr char kDirEnv[] = "CLUSTERPROF_DIR";
inline constexpr char kControlFileName[] = "control";
inline constexpr char kRingPrefix[] = "ring-";
inline constexpr char kRingSuffix[] = ".shm";
inline constexpr char kGpuRingPrefix[] = "gpu-";
// The GPU tracing library as the sidecar installs it in the directory, for the pod's CUDA
// processes to load (CUDA_INJECTION64_PATH=<dir>/libclusterprof_cupti.so).
inline constexpr char kInjectionLibraryFileName[] = "libclusterprof_cupti.so";

inline constexpr uint64_t kControlMagic = 0x3130'4C52'5443'5043;  // "CPCTRL01" little-endian
inline constexpr uint64_t kRingMagic = 0x3130'474E'4952'5043;     // "CPRING01"
inline constexpr uint64_t kGpuRingMagic = 0x3230'3055'5047'5043;  // "CPGPU002"
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
  // GPU tracing (libclusterprof_cupti), on while device_level >= 1. These fields were appended
  // to version 1: a reader uses them only when `size` covers them.
  // Incremented each time a GPU capture is armed.
  std::atomic<uint64_t> device_seq;
  // Caps per capture and process (advanced_configuration gpu_max_activity_api_events and
  // gpu_max_callback_api_events); beyond them records are dropped and counted.
  std::atomic<uint64_t> gpu_max_activity_events;
  std::atomic<uint64_t> gpu_max_api_events;
  std::atomic<uint32_t> gpu_flags;  // GpuFlags
};

enum GpuFlags : uint32_t {
  kGpuFlagNvtx = 1,          // record NVTX ranges too
  kGpuFlagNoRuntimeApi = 2,  // leave out the CUDA runtime's calls
  kGpuFlagNoDriverApi = 4,   // leave out the CUDA driver's calls
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

// GPU activity: one file per CUDA process that loaded libclusterprof_cupti (docs/shm-format.md).
// CUPTI hands the library its records in buffers on CUPTI's own threads, never on the threads
// that launch work, so one ring per process, with a lock on the producer side, is enough.

enum class GpuRecordKind : uint8_t {
  kKernel = 1,
  kMemcpy = 2,
  kMemset = 3,
  kSync = 4,
  kRuntimeApi = 5,
  kDriverApi = 6,
  kNvtxRange = 7,
  // A clock calibration: `start` is a CUPTI timestamp and `end` the wall clock (ns since the Unix
  // epoch) read at the same instant. Written at arm and at disarm.
  kClock = 8,
};

// GpuRecord::subkind of a kMemcpy: the direction.
enum class GpuCopyKind : uint8_t {
  kUnknown = 0,
  kHtoD = 1,
  kDtoH = 2,
  kDtoD = 3,
  kHtoH = 4,
  kPtoP = 5,   // between devices: memcpy.dst_device names the other one
  kOther = 6,  // arrays
};

// One CUPTI activity record, reduced to what the trace shows. Timestamps are CUPTI's (ns);
// the sidecar maps them to the wall clock with the kClock records.
struct GpuRecord {
  uint64_t start;
  uint64_t end;
  uint32_t correlation_id;
  uint32_t name_id;    // string id: kernel (mangled), API function, NVTX message; 0 = none
  uint32_t stream_id;  // API and NVTX records: the thread id (the system tid)
  uint32_t context_id;
  uint16_t device_id;
  GpuRecordKind kind;
  uint8_t subkind;  // kMemcpy: GpuCopyKind; kSync: CUPTI's synchronization type
  // 4-byte aligned (its 64-bit fields too), so that the record stays 64 bytes.
  union __attribute__((packed, aligned(4))) {
    struct {
      int32_t grid[3];
      uint16_t block[3];
      uint16_t registers;  // per thread
      int32_t static_shared;
      int32_t dynamic_shared;
    } kernel;
    struct __attribute__((packed, aligned(4))) {
      uint64_t bytes;
      uint8_t src_kind;  // CUPTI memory kinds
      uint8_t dst_kind;
      uint8_t async;
      uint8_t reserved;
      uint32_t dst_device;
    } memcpy;
    struct __attribute__((packed, aligned(4))) {
      uint64_t bytes;
      uint32_t value;
      uint16_t memory_kind;
      uint16_t async;
    } memset;
    struct {
      uint32_t cbid;
      uint32_t return_value;
    } api;
    struct {
      uint32_t cuda_event_id;
    } sync;
    struct {
      uint32_t domain_id;  // string id of the NVTX domain; 0 = the default domain
    } nvtx;
    uint8_t raw[28];
  };
};
static_assert(sizeof(GpuRecord) == 64);

// What a process reports about its GPU tracing.
enum class GpuState : uint32_t {
  kIdle = 0,    // loaded, waiting for a capture
  kArmed = 1,   // CUPTI is recording for `armed_seq`
  kFailed = 2,  // CUPTI refused; GPU tracing is off in this process (`error` says why)
};

// A device as the process's CUDA driver describes it (for the plane's capability stats).
struct GpuDeviceInfo {
  uint32_t ordinal;
  uint32_t compute_cap_major;
  uint32_t compute_cap_minor;
  uint32_t core_count;  // multiprocessors
  uint64_t clock_rate_khz;
  uint64_t memory_size;       // bytes
  uint64_t memory_bandwidth;  // bytes/s
  // The limits a kernel's occupancy follows from (0: unknown).
  uint32_t max_threads_per_block;
  uint32_t max_threads_per_sm;
  uint32_t regs_per_block;
  uint32_t regs_per_sm;
  uint32_t warp_size;
  uint32_t shared_per_block;           // bytes, without opting in
  uint32_t shared_per_sm;              // bytes
  uint32_t shared_per_block_optin;     // bytes
  uint32_t reserved_shared_per_block;  // bytes the driver keeps per block
  uint32_t reserved;
  char uuid[16];  // raw CUuuid: how the sidecar matches NVML devices
  char name[88];
};
static_assert(sizeof(GpuDeviceInfo) == 184);

inline constexpr uint32_t kMaxGpuDevices = 16;

struct alignas(64) GpuRingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_size;  // sizeof(GpuRingHeader)
  uint32_t pid;
  uint32_t record_size;  // sizeof(GpuRecord)
  uint64_t process_start_ticks;
  uint64_t capacity;  // records, a power of two
  uint64_t records_offset;
  uint64_t strings_offset;
  uint64_t strings_capacity;
  uint64_t file_size;
  char process_name[64];
  // The ring: the process publishes write_index (release), the sidecar read_index (release).
  alignas(64) std::atomic<uint64_t> write_index;
  alignas(64) std::atomic<uint64_t> read_index;
  std::atomic<uint64_t> dropped;  // records lost because the ring stayed full
  std::atomic<uint64_t> strings_used;
  std::atomic<uint64_t> dropped_strings;
  // Per GPU capture (ControlPage::device_seq), reset when the process arms for a new one.
  alignas(64) std::atomic<uint64_t> armed_seq;  // the capture CUPTI was enabled for
  std::atomic<uint64_t> flushed_seq;            // its records are all in the ring
  std::atomic<int64_t> armed_wall_ns;           // when CUPTI was enabled for it
  std::atomic<uint64_t> capped_activity;        // over gpu_max_activity_events
  std::atomic<uint64_t> capped_api;             // over gpu_max_api_events
  std::atomic<uint64_t> cupti_dropped;          // records CUPTI dropped (its buffers were full)
  std::atomic<uint32_t> state;                  // GpuState
  std::atomic<uint32_t> error_seq;              // incremented after `error` is rewritten
  char error[512];                              // NUL-terminated
  std::atomic<uint32_t> num_devices;            // devices[0..num_devices) are written
  uint32_t reserved;
  GpuDeviceInfo devices[kMaxGpuDevices];
};

// 131072 records x 64 bytes = 8 MiB of sparse file per CUDA process; the sidecar drains it every
// 10 ms while a capture runs. CUPTI hands a buffer over when it fills (8 MiB of its records,
// about 40000 kernels), so a ring takes several buffers between drains.
inline constexpr uint64_t kDefaultGpuRingRecords = 131072;
inline constexpr char kGpuRingRecordsEnv[] = "CLUSTERPROF_GPU_RING_RECORDS";
inline constexpr uint64_t kDefaultGpuStringsCapacity = 4 << 20;
// advanced_configuration's default caps, as upstream's.
inline constexpr uint64_t kDefaultGpuMaxEvents = 2 * 1024 * 1024;

}  // namespace clusterprof::shm

#endif  // CLUSTERPROF_SDK_SHM_FORMAT_H_
