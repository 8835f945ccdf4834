#include "common/xspace/xspace_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/strings.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/unknown_field_set.h"

namespace clusterprof::xspace {
namespace {

using ::google::protobuf::UnknownField;
using ::google::protobuf::UnknownFieldSet;
using ::tensorflow::profiler::XPlane;
using ::tensorflow::profiler::XSpace;

const char* WireTypeName(UnknownField::Type type) {
  switch (type) {
    case UnknownField::TYPE_VARINT:
      return "varint";
    case UnknownField::TYPE_FIXED32:
      return "fixed32";
    case UnknownField::TYPE_FIXED64:
      return "fixed64";
    case UnknownField::TYPE_LENGTH_DELIMITED:
      return "length-delimited";
    case UnknownField::TYPE_GROUP:
      return "group";
  }
  return "unknown";
}

// A field whose number the message defines but whose wire type it does not means the bytes are
// some other message. Unknown numbers are tolerated (a newer writer may add fields).
absl::Status CheckUnknownFields(const UnknownFieldSet& unknown, int max_known_field,
                                std::string_view message, std::string_view source) {
  for (int i = 0; i < unknown.field_count(); ++i) {
    const UnknownField& field = unknown.field(i);
    if (field.number() >= 1 && field.number() <= max_known_field) {
      return absl::InvalidArgumentError(
          StrCat(source, " is not an XSpace (.xplane.pb): field ", field.number(), " of ", message,
                 " has wire type ", WireTypeName(field.type()),
                 ", which XSpace does not use; is this some other protobuf message?"));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const XSpace& space, std::string_view source) {
  const auto* reflection = space.GetReflection();
  const UnknownFieldSet& unknown = reflection->GetUnknownFields(space);
  CLUSTERPROF_RETURN_IF_ERROR(CheckUnknownFields(unknown, 4, "XSpace", source));
  for (const XPlane& plane : space.planes()) {
    CLUSTERPROF_RETURN_IF_ERROR(
        CheckUnknownFields(plane.GetReflection()->GetUnknownFields(plane), 6, "XPlane", source));
  }
  if (!unknown.empty() && space.planes_size() == 0 && space.hostnames_size() == 0) {
    return absl::InvalidArgumentError(StrCat(
        source, " is not an XSpace (.xplane.pb): it holds only fields XSpace does not define"));
  }
  return absl::OkStatus();
}

// Adapts a ByteSink to protobuf's output streams.
class SinkOutputStream final : public google::protobuf::io::CopyingOutputStream {
 public:
  explicit SinkOutputStream(io::ByteSink* sink) : sink_(sink) {}
  bool Write(const void* buffer, int size) override {
    status_ = sink_->Append(std::string_view(static_cast<const char*>(buffer), size));
    return status_.ok();
  }
  const absl::Status& status() const { return status_; }

 private:
  io::ByteSink* sink_;
  absl::Status status_;
};

}  // namespace

LoadedXSpace::LoadedXSpace() : arena_(std::make_unique<google::protobuf::Arena>()) {
  space_ = google::protobuf::Arena::CreateMessage<XSpace>(arena_.get());
}

LoadedXSpace::~LoadedXSpace() = default;

absl::StatusOr<std::unique_ptr<LoadedXSpace>> ParseXSpace(
    google::protobuf::io::ZeroCopyInputStream* input, std::string_view source) {
  auto loaded = std::make_unique<LoadedXSpace>();
  google::protobuf::io::CodedInputStream coded(input);
  coded.SetTotalBytesLimit(std::numeric_limits<int>::max());
  if (!loaded->space_->MergeFromCodedStream(&coded) || !coded.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError(
        StrCat(source,
               " is not a valid XSpace (.xplane.pb): the protobuf data is truncated or corrupt "
               "(parsing stopped near byte ",
               coded.CurrentPosition(), ")"));
  }
  loaded->serialized_bytes_ = static_cast<uint64_t>(coded.CurrentPosition());
  if (loaded->serialized_bytes_ == 0) {
    return absl::InvalidArgumentError(StrCat(source, " is empty (0 bytes): it holds no XSpace"));
  }
  CLUSTERPROF_RETURN_IF_ERROR(Validate(*loaded->space_, source));
  return loaded;
}

absl::StatusOr<std::unique_ptr<LoadedXSpace>> ParseXSpace(std::string_view bytes,
                                                          std::string_view source) {
  google::protobuf::io::ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()));
  return ParseXSpace(&input, source);
}

absl::StatusOr<std::unique_ptr<LoadedXSpace>> ReadXSpaceFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "cannot open", path);
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(StrCat(path, " is a directory, not an .xplane.pb file"));
  }
  google::protobuf::io::FileInputStream input(fd, /*block_size=*/1 << 20);
  input.SetCloseOnDelete(true);
  auto result = ParseXSpace(&input, path);
  if (!result.ok() && input.GetErrno() != 0) {
    return ErrnoToStatus(input.GetErrno(), "cannot read", path);
  }
  return result;
}

absl::Status WriteXSpace(const XSpace& space, io::ByteSink* out) {
  const size_t size = space.ByteSizeLong();
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(
        StrCat("the XSpace is ", size,
               " bytes, over protobuf's 2 GiB message limit; capture a shorter "
               "window or fewer events (max_events)"));
  }
  SinkOutputStream sink_stream(out);
  google::protobuf::io::CopyingOutputStreamAdaptor adaptor(&sink_stream, /*block_size=*/1 << 20);
  bool serialized;
  {
    google::protobuf::io::CodedOutputStream coded(&adaptor);
    space.SerializeWithCachedSizes(&coded);
    serialized = !coded.HadError();
  }
  if (!serialized || !adaptor.Flush()) {
    return sink_stream.status().ok() ? absl::InternalError("serializing the XSpace failed")
                                     : sink_stream.status();
  }
  return absl::OkStatus();
}

}  // namespace clusterprof::xspace
