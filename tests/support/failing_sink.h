// A ByteSink whose every Append fails with a given status, for testing error propagation.
#ifndef CLUSTERPROF_TESTS_SUPPORT_FAILING_SINK_H_
#define CLUSTERPROF_TESTS_SUPPORT_FAILING_SINK_H_

#include <string_view>
#include <utility>

#include "common/io/byte_sink.h"

namespace clusterprof::testing {

class FailingSink final : public io::ByteSink {
 public:
  explicit FailingSink(absl::Status status) : status_(std::move(status)) {}
  absl::Status Append(std::string_view) override { return status_; }

 private:
  absl::Status status_;
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_FAILING_SINK_H_
