// Streams gzip (RFC 1952, one member) into another sink. Levels 1 to 3 use ISA-L's igzip, which
// compresses trace JSON several times faster than zlib at a similar ratio; level 0 and levels 4
// to 9 use zlib. Memory stays bounded whatever the size of the stream.
#ifndef CLUSTERPROF_COMMON_IO_GZIP_SINK_H_
#define CLUSTERPROF_COMMON_IO_GZIP_SINK_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/io/byte_sink.h"

namespace clusterprof::io {

// Not thread-safe. Call Finish() to write the gzip trailer; a sink destroyed without Finish()
// leaves a truncated stream behind (the caller aborts the object it was writing).
class GzipSink final : public ByteSink {
 public:
  // 0 (store) to 9 (smallest); 1 is the fast default for traces.
  static constexpr int kDefaultLevel = 1;

  explicit GzipSink(ByteSink* out, int level = kDefaultLevel);
  ~GzipSink() override;
  GzipSink(const GzipSink&) = delete;
  GzipSink& operator=(const GzipSink&) = delete;

  absl::Status Append(std::string_view data) override;
  // Flushes what is buffered and writes the trailer. Appending afterwards is an error.
  absl::Status Finish();

  uint64_t bytes_in() const { return bytes_in_; }
  uint64_t bytes_out() const { return bytes_out_; }

 private:
  struct State;
  absl::Status Deflate(const char* data, size_t size, bool finish);
  absl::Status DeflateZlib(const char* data, size_t size, bool finish);
  absl::Status DeflateIsal(const char* data, size_t size, bool finish);
  absl::Status Emit(size_t produced);

  ByteSink* out_;
  std::unique_ptr<State> state_;
  std::string output_;
  absl::Status status_;
  bool finished_ = false;
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
};

// Decompresses a whole gzip stream (all members); for tests and tools reading small files.
absl::Status GunzipString(std::string_view compressed, std::string* out);

}  // namespace clusterprof::io

#endif  // CLUSTERPROF_COMMON_IO_GZIP_SINK_H_
