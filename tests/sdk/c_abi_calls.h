/* C functions (c_abi_calls.c) that call the C ABI, for c_abi_test.cc. */
#ifndef CLUSTERPROF_TESTS_SDK_C_ABI_CALLS_H_
#define CLUSTERPROF_TESTS_SDK_C_ABI_CALLS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int c_abi_tracing_enabled(int level);
/* Records, from C, a scoped step with a nested op, an async pair, a timed event and a verbose
 * event, on a thread named "c_main"; returns how many calls reported a write (-1 when the
 * library's ABI is older than the header's). */
int c_abi_record_everything(void);
int c_abi_attached(void);
uint64_t c_abi_dropped_strings(void);
size_t c_abi_ring_path(char* buffer, size_t size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CLUSTERPROF_TESTS_SDK_C_ABI_CALLS_H_ */
