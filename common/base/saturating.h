// Saturating int64 arithmetic, for timestamps and durations read from files: a hostile or broken
// trace must never cause signed overflow (undefined behaviour).
#ifndef CLUSTERPROF_COMMON_BASE_SATURATING_H_
#define CLUSTERPROF_COMMON_BASE_SATURATING_H_

#include <cmath>
#include <cstdint>
#include <limits>

namespace clusterprof {

inline int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_add_overflow(a, b, &result)) {
    return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
  }
  return result;
}

inline int64_t SaturatingSub(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_sub_overflow(a, b, &result)) {
    return b < 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
  }
  return result;
}

inline int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_mul_overflow(a, b, &result)) {
    return (a < 0) != (b < 0) ? std::numeric_limits<int64_t>::min()
                              : std::numeric_limits<int64_t>::max();
  }
  return result;
}

// Converts a double to int64, clamping out-of-range values and mapping NaN to 0.
inline int64_t SaturatingCast(double value) {
  if (std::isnan(value)) return 0;
  if (value >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
  if (value <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(value);
}

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_SATURATING_H_
