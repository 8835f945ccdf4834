/* The clusterprof annotation SDK's C ABI (libclusterprof_annotate.so): for C code, and for
 * languages that call C (the Python module in sdk/python uses it through ctypes).
 *
 *   clusterprof_trace_t trace;
 *   clusterprof_trace_begin(&trace, "train#step_num=7,_r=1#", 22, CLUSTERPROF_LEVEL_CRITICAL);
 *   ...
 *   clusterprof_trace_end(&trace);
 *
 *   int64_t start = clusterprof_now_ns();  ...
 *   clusterprof_record_complete("forward", 7, start, clusterprof_now_ns(), 2);
 *
 * Stability: this ABI only grows. Functions are added, never removed or changed: their parameters,
 * return types and meanings stay; clusterprof_trace_t keeps its size and alignment. A newer library
 * serves programs built against an older header. clusterprof_abi_version() says which functions
 * a library has (ABI version 1: everything declared here).
 *
 * Names are UTF-8 text with a length (no terminating NUL needed) and may carry TraceMe metadata,
 * `name#key=value,key=value#` (docs/trace-format.md). Levels are TraceMe's: 1 critical, 2 info,
 * 3 verbose; an event at level L is recorded while the sidecar's host tracer level is >= L
 * (levels below 1 count as 1). Every function is thread-safe, never waits for the sidecar, never
 * aborts or throws, and records nothing while no capture is armed: then a call returns after a
 * few loads and a compare.
 */
#ifndef CLUSTERPROF_SDK_CLUSTERPROF_ANNOTATE_H_
#define CLUSTERPROF_SDK_CLUSTERPROF_ANNOTATE_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define CLUSTERPROF_API __attribute__((visibility("default")))
#else
#define CLUSTERPROF_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header declares. */
#define CLUSTERPROF_ABI_VERSION 1

#define CLUSTERPROF_LEVEL_CRITICAL 1
#define CLUSTERPROF_LEVEL_INFO 2
#define CLUSTERPROF_LEVEL_VERBOSE 3

/* The ABI version of the loaded library (>= the CLUSTERPROF_ABI_VERSION a caller was built
 * with, when the library is at least as new). */
CLUSTERPROF_API int clusterprof_abi_version(void);

/* 1 when events at `level` are being recorded now, else 0. The first call in a process looks
 * for the sidecar's control page. */
CLUSTERPROF_API int clusterprof_tracing_enabled(int level);

/* The clock events are recorded with: wall clock (CLOCK_REALTIME), ns since the Unix epoch. */
CLUSTERPROF_API int64_t clusterprof_now_ns(void);

/* Records one event on the calling thread that began at `start_ns` and ended at `end_ns` (times
 * from clusterprof_now_ns). For callers that time events themselves: read the start when the
 * scope opens (if clusterprof_tracing_enabled), record when it closes. Returns 1 when the event
 * was written, 0 when not (tracing off at `level`, no ring, or the thread's ring full: then it
 * is counted as dropped). */
CLUSTERPROF_API int clusterprof_record_complete(const char* name, size_t name_len, int64_t start_ns,
                                                int64_t end_ns, int level);

/* State of one scoped event, allocated by the caller (usually on the stack). Opaque; its size
 * and alignment are part of the ABI and never change. */
typedef struct clusterprof_trace {
  uint64_t opaque[16];
} clusterprof_trace_t;

/* Opens a scoped event on the calling thread; the clock is read here. Returns 1 when the event
 * will be recorded, 0 when not. Either way, call clusterprof_trace_end on the same thread with
 * the same `trace` (ending a trace that returned 0 does nothing). `name` must stay valid until
 * then. */
CLUSTERPROF_API int clusterprof_trace_begin(clusterprof_trace_t* trace, const char* name,
                                            size_t name_len, int level);
/* Closes the event `trace` opened and records it. Returns 1 when the event was written. */
CLUSTERPROF_API int clusterprof_trace_end(clusterprof_trace_t* trace);

/* Names the calling thread in traces (its line in XProf and Perfetto). The name is copied. */
CLUSTERPROF_API void clusterprof_set_thread_name(const char* name, size_t name_len);

/* Events that begin and end on different threads, or out of scope order, matched by `id`.
 * Return 1 when written. */
CLUSTERPROF_API int clusterprof_async_begin(const char* name, size_t name_len, uint64_t id,
                                            int level);
CLUSTERPROF_API int clusterprof_async_end(uint64_t id, int level);

/* 1 when the sidecar's control page is mapped in this process, else 0. */
CLUSTERPROF_API int clusterprof_attached(void);
/* Strings (names, keys, values) that did not fit the process's string table; their events were
 * recorded without them. */
CLUSTERPROF_API uint64_t clusterprof_dropped_strings(void);
/* Copies this process's ring file path into `buffer` (NUL-terminated, truncated to `size`) and
 * returns its full length, as snprintf does; the path is empty until the first recorded event. */
CLUSTERPROF_API size_t clusterprof_ring_path(char* buffer, size_t size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CLUSTERPROF_SDK_CLUSTERPROF_ANNOTATE_H_ */
