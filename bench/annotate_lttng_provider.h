// LTTng-UST tracepoints for annotate_benchmark: a scoped event as a begin and an end tracepoint,
// each carrying the event name and an int (the step number). annotate_lttng_provider.c holds the
// probes; annotate_lttng_cases.cc fires them.
#undef LTTNG_UST_TRACEPOINT_PROVIDER
#define LTTNG_UST_TRACEPOINT_PROVIDER clusterprof_bench

#undef LTTNG_UST_TRACEPOINT_INCLUDE
#define LTTNG_UST_TRACEPOINT_INCLUDE "bench/annotate_lttng_provider.h"

#if !defined(CLUSTERPROF_BENCH_ANNOTATE_LTTNG_PROVIDER_H_) || \
    defined(LTTNG_UST_TRACEPOINT_HEADER_MULTI_READ)
#define CLUSTERPROF_BENCH_ANNOTATE_LTTNG_PROVIDER_H_

#include <lttng/tracepoint.h>

LTTNG_UST_TRACEPOINT_EVENT(clusterprof_bench, begin,
                           LTTNG_UST_TP_ARGS(const char*, name, int, step),
                           LTTNG_UST_TP_FIELDS(lttng_ust_field_string(name, name)
                                                   lttng_ust_field_integer(int, step, step)))

LTTNG_UST_TRACEPOINT_EVENT(clusterprof_bench, end, LTTNG_UST_TP_ARGS(const char*, name, int, step),
                           LTTNG_UST_TP_FIELDS(lttng_ust_field_string(name, name)
                                                   lttng_ust_field_integer(int, step, step)))

#endif  // CLUSTERPROF_BENCH_ANNOTATE_LTTNG_PROVIDER_H_

#include <lttng/tracepoint-event.h>
