// A sink that hands its bytes to another sink on a background thread, so producing bytes
// (serializing an XSpace, generating JSON) overlaps with consuming them (gzip, write(2), an
// upload). Memory is bounded: at most `max_buffers` buffers of `buffer_size` bytes are queued;
// a producer that gets ahead waits.
#ifndef CLUSTERPROF_COMMON_IO_BACKGROUND_SINK_H_
#define CLUSTERPROF_COMMON_IO_BACKGROUND_SINK_H_

#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/base/mutex.h"
#include "common/io/byte_sink.h"

namespace clusterprof::io {

// Append and Finish are called from one producer thread; the downstream sink is called only from
// the background thread, in order. The first downstream error is returned by the next Append or
// by Finish, and later data is dropped. Destroying an unfinished sink finishes it.
class BackgroundSink final : public ByteSink {
 public:
  explicit BackgroundSink(ByteSink* out, size_t buffer_size = 1 << 20, int max_buffers = 4);
  ~BackgroundSink() override;
  BackgroundSink(const BackgroundSink&) = delete;
  BackgroundSink& operator=(const BackgroundSink&) = delete;

  absl::Status Append(std::string_view data) override;
  // Zero-copy: the free tail of the current buffer.
  absl::StatusOr<std::span<char>> NextWritable() override;
  void BackUp(size_t count) override;
  // Hands over what is buffered, waits until the downstream sink has taken everything, and
  // returns its first error. Appending afterwards is an error.
  absl::Status Finish();

 private:
  void Run();
  // Queues current_ for the background thread and takes a free buffer.
  absl::Status Submit();

  ByteSink* const out_;
  const size_t buffer_size_;
  const int max_buffers_;
  std::string current_;    // producer-owned
  bool finished_ = false;  // producer-owned

  Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> free_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace clusterprof::io

#endif  // CLUSTERPROF_COMMON_IO_BACKGROUND_SINK_H_
