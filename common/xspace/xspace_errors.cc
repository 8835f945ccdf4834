#include "common/xspace/xspace_errors.h"

#include "common/base/strings.h"

namespace clusterprof::xspace {

const char* WireTypeName(int wire_type) {
  switch (wire_type) {
    case 0:
      return "varint";
    case 1:
      return "fixed64";
    case 2:
      return "length-delimited";
    case 3:
    case 4:
      return "group";
    case 5:
      return "fixed32";
    default:
      return "unknown";
  }
}

absl::Status EmptyXSpaceError(std::string_view source) {
  return absl::InvalidArgumentError(StrCat(source, " is empty (0 bytes): it holds no XSpace"));
}

absl::Status CorruptXSpaceError(std::string_view source, uint64_t offset) {
  return absl::InvalidArgumentError(
      StrCat(source,
             " is not a valid XSpace (.xplane.pb): the protobuf data is truncated or corrupt, or "
             "holds a string that is not valid UTF-8 (parsing stopped near byte ",
             offset, ")"));
}

absl::Status WrongWireTypeError(std::string_view source, int field_number, int wire_type,
                                std::string_view message) {
  return absl::InvalidArgumentError(
      StrCat(source, " is not an XSpace (.xplane.pb): field ", field_number, " of ", message,
             " has wire type ", WireTypeName(wire_type),
             ", which XSpace does not use; is this some other protobuf message?"));
}

absl::Status OnlyUnknownFieldsError(std::string_view source) {
  return absl::InvalidArgumentError(StrCat(
      source, " is not an XSpace (.xplane.pb): it holds only fields XSpace does not define"));
}

}  // namespace clusterprof::xspace
