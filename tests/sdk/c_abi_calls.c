/* Calls every function of the C ABI from C (compiled as C99 with -pedantic-errors: this file
 * is also the check that clusterprof_annotate.h is valid C). c_abi_test.cc drives it against
 * libclusterprof_annotate.so and drains what it recorded. */
#include "tests/sdk/c_abi_calls.h"

#include <string.h>

#include "sdk/clusterprof_annotate.h"

static size_t Length(const char* text) { return strlen(text); }

int c_abi_tracing_enabled(int level) { return clusterprof_tracing_enabled(level); }

int c_abi_record_everything(void) {
  int written = 0;
  clusterprof_trace_t step;
  clusterprof_trace_t op;
  const char* step_name = "train#step_num=3,_r=1#";
  const char* op_name = "forward#layer=dense_1,training=1#";
  const int64_t start = clusterprof_now_ns();

  if (clusterprof_abi_version() < CLUSTERPROF_ABI_VERSION) return -1;
  clusterprof_set_thread_name("c_main", Length("c_main"));
  written +=
      clusterprof_trace_begin(&step, step_name, Length(step_name), CLUSTERPROF_LEVEL_CRITICAL);
  written += clusterprof_trace_begin(&op, op_name, Length(op_name), CLUSTERPROF_LEVEL_INFO);
  written += clusterprof_trace_end(&op);
  written += clusterprof_async_begin("prefetch", Length("prefetch"), 42, CLUSTERPROF_LEVEL_INFO);
  written += clusterprof_async_end(42, CLUSTERPROF_LEVEL_INFO);
  written += clusterprof_record_complete("timed", Length("timed"), start, start + 500,
                                         CLUSTERPROF_LEVEL_INFO);
  /* Verbose events are not recorded at the info level the test arms. */
  written += clusterprof_record_complete("verbose", Length("verbose"), start, start + 1,
                                         CLUSTERPROF_LEVEL_VERBOSE);
  written += clusterprof_trace_end(&step);
  return written;
}

int c_abi_attached(void) { return clusterprof_attached(); }

uint64_t c_abi_dropped_strings(void) { return clusterprof_dropped_strings(); }

size_t c_abi_ring_path(char* buffer, size_t size) { return clusterprof_ring_path(buffer, size); }
