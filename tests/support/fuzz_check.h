// FUZZ_CHECK(condition): a fuzz target's invariant. When it does not hold, names the check on
// stderr and traps, which libFuzzer (and the corpus replay) reports as a crash with the input.
#ifndef CLUSTERPROF_TESTS_SUPPORT_FUZZ_CHECK_H_
#define CLUSTERPROF_TESTS_SUPPORT_FUZZ_CHECK_H_

#include <cstdio>

#define FUZZ_CHECK(condition)                                                                 \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #condition); \
      __builtin_trap();                                                                       \
    }                                                                                         \
  } while (false)

#endif  // CLUSTERPROF_TESTS_SUPPORT_FUZZ_CHECK_H_
