// jemalloc's settings for the processes linked with it (clusterprof_use_jemalloc in
// cmake/ClusterprofHelpers.cmake: the operator, and the benchmark that runs its capture). Two
// arenas, as the operator had with glibc, and freed pages given back after a second: its
// resident size watching 10,000 pods is 87-102 MiB with these against 186 MiB with jemalloc's
// defaults, for the same fan-out CPU (bench/RESULTS.md). MALLOC_CONF in the environment still
// applies on top.
extern "C" {
// NOLINTNEXTLINE: the name jemalloc reads.
const char* malloc_conf = "narenas:2,dirty_decay_ms:1000,muzzy_decay_ms:0";
}
