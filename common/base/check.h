// CLUSTERPROF_CHECK for broken invariants (bugs): prints where and why, then aborts. Environment
// failures are never CHECKed; they return a Status (see status.h).
#ifndef CLUSTERPROF_COMMON_BASE_CHECK_H_
#define CLUSTERPROF_COMMON_BASE_CHECK_H_

#include <sstream>

namespace clusterprof::internal {

// Collects the message of a failed check and aborts when destroyed.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `CLUSTERPROF_CHECK(x) << ...` be a void expression in both branches of the ternary.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace clusterprof::internal

#define CLUSTERPROF_CHECK(condition)                 \
  (condition) ? (void)0                              \
              : ::clusterprof::internal::Voidify() & \
                    ::clusterprof::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#endif  // CLUSTERPROF_COMMON_BASE_CHECK_H_
