// Reading and writing serialized XSpaces (<host>.xplane.pb) with errors that name the file and
// say what is wrong with it.
#ifndef CLUSTERPROF_COMMON_XSPACE_XSPACE_IO_H_
#define CLUSTERPROF_COMMON_XSPACE_XSPACE_IO_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/io/byte_sink.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace google::protobuf {
class Arena;
namespace io {
class ZeroCopyInputStream;
}
}  // namespace google::protobuf

namespace clusterprof::xspace {

// An XSpace parsed into an arena: large traces parse faster and free at once. Not thread-safe
// to mutate; safe to read from several threads.
class LoadedXSpace {
 public:
  LoadedXSpace();
  ~LoadedXSpace();
  LoadedXSpace(const LoadedXSpace&) = delete;
  LoadedXSpace& operator=(const LoadedXSpace&) = delete;

  const tensorflow::profiler::XSpace& space() const { return *space_; }
  tensorflow::profiler::XSpace* mutable_space() { return space_; }
  // Size of the serialized form that was read.
  uint64_t serialized_bytes() const { return serialized_bytes_; }

 private:
  friend absl::StatusOr<std::unique_ptr<LoadedXSpace>> ParseXSpace(
      google::protobuf::io::ZeroCopyInputStream*, std::string_view);
  std::unique_ptr<google::protobuf::Arena> arena_;
  tensorflow::profiler::XSpace* space_;
  uint64_t serialized_bytes_ = 0;
};

// Parses an XSpace from `input`; `source` (a path or URI) names it in errors. Fails with
// InvalidArgument for an empty input, bytes that are not protobuf, or a protobuf message that is
// not an XSpace (fields whose numbers XSpace uses but whose wire types it does not).
absl::StatusOr<std::unique_ptr<LoadedXSpace>> ParseXSpace(
    google::protobuf::io::ZeroCopyInputStream* input, std::string_view source);
absl::StatusOr<std::unique_ptr<LoadedXSpace>> ParseXSpace(std::string_view bytes,
                                                          std::string_view source);

// Reads a local file. NotFound / PermissionDenied name the path; the rest as ParseXSpace.
absl::StatusOr<std::unique_ptr<LoadedXSpace>> ReadXSpaceFile(const std::string& path);

// Serializes `space` into `out` in chunks, without building the whole message in memory.
// Fails with InvalidArgument when the message would exceed protobuf's 2 GiB limit.
absl::Status WriteXSpace(const tensorflow::profiler::XSpace& space, io::ByteSink* out);

}  // namespace clusterprof::xspace

#endif  // CLUSTERPROF_COMMON_XSPACE_XSPACE_IO_H_
