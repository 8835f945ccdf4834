#include "common/xspace/xspace_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/xspace/xspace_errors.h"
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

// The wire type number of an unknown field (UnknownField::Type is its own enumeration).
int WireType(UnknownField::Type type) {
  switch (type) {
    case UnknownField::TYPE_VARINT:
      return 0;
    case UnknownField::TYPE_FIXED64:
      return 1;
    case UnknownField::TYPE_LENGTH_DELIMITED:
      return 2;
    case UnknownField::TYPE_GROUP:
      return 3;
    case UnknownField::TYPE_FIXED32:
      return 5;
  }
  return -1;
}

// A field whose number the message defines but whose wire type it does not means the bytes are
// some other message. Unknown numbers are tolerated (a newer writer may add fields).
absl::Status CheckUnknownFields(const UnknownFieldSet& unknown, int max_known_field,
                                std::string_view message, std::string_view source) {
  for (int i = 0; i < unknown.field_count(); ++i) {
    const UnknownField& field = unknown.field(i);
    if (field.number() >= 1 && field.number() <= max_known_field) {
      return WrongWireTypeError(source, field.number(), WireType(field.type()), message);
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
    return OnlyUnknownFieldsError(source);
  }
  return absl::OkStatus();
}

// Adapts a ByteSink to protobuf's output streams: straight into the sink's own buffers when it
// has a zero-copy path, through a buffer and Append otherwise.
class SinkOutputStream final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  explicit SinkOutputStream(io::ByteSink* sink) : sink_(sink) {
    auto probe = sink_->NextWritable();
    if (probe.ok()) {
      zero_copy_ = true;
      pending_ = *probe;
    } else {
      buffer_.resize(1 << 20);
    }
  }

  bool Next(void** data, int* size) override {
    if (!status_.ok()) return false;
    if (zero_copy_) {
      if (pending_.empty()) {
        auto next = sink_->NextWritable();
        if (!next.ok()) {
          status_ = next.status();
          return false;
        }
        pending_ = *next;
      }
      *data = pending_.data();
      *size = static_cast<int>(pending_.size());
      byte_count_ += static_cast<int64_t>(pending_.size());
      pending_ = {};
      return true;
    }
    if (!FlushBuffer()) return false;
    *data = buffer_.data();
    *size = static_cast<int>(buffer_.size());
    used_ = buffer_.size();
    byte_count_ += static_cast<int64_t>(buffer_.size());
    return true;
  }

  void BackUp(int count) override {
    byte_count_ -= count;
    if (zero_copy_) {
      sink_->BackUp(static_cast<size_t>(count));
    } else {
      used_ -= static_cast<size_t>(count);
    }
  }

  int64_t ByteCount() const override { return byte_count_; }

  // Hands over what is buffered; returns the first error.
  absl::Status Close() {
    if (zero_copy_ && !pending_.empty()) {
      sink_->BackUp(pending_.size());  // the probe region was never used
      pending_ = {};
    }
    if (!zero_copy_) FlushBuffer();
    return status_;
  }

 private:
  bool FlushBuffer() {
    if (used_ > 0) status_ = sink_->Append(std::string_view(buffer_.data(), used_));
    used_ = 0;
    return status_.ok();
  }

  io::ByteSink* sink_;
  bool zero_copy_ = false;
  std::span<char> pending_;
  std::string buffer_;
  size_t used_ = 0;
  int64_t byte_count_ = 0;
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
    return CorruptXSpaceError(source, static_cast<uint64_t>(coded.CurrentPosition()));
  }
  loaded->serialized_bytes_ = static_cast<uint64_t>(coded.CurrentPosition());
  if (loaded->serialized_bytes_ == 0) {
    return EmptyXSpaceError(source);
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
  SinkOutputStream stream(out);
  bool serialized;
  {
    google::protobuf::io::CodedOutputStream coded(&stream);
    space.SerializeWithCachedSizes(&coded);
    serialized = !coded.HadError();
  }
  const absl::Status status = stream.Close();
  if (!status.ok()) return status;
  if (!serialized) return absl::InternalError("serializing the XSpace failed");
  return absl::OkStatus();
}

}  // namespace clusterprof::xspace
