/* The probes of the clusterprof_bench tracepoint provider, linked into annotate_benchmark. */
#define LTTNG_UST_TRACEPOINT_CREATE_PROBES
#define LTTNG_UST_TRACEPOINT_DEFINE
#include "bench/annotate_lttng_provider.h"
