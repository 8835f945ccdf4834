// The errors both XSpace readers give (the protobuf parser in xspace_io.cc and the wire-format
// walker in trace_json.cc), defined once so their messages stay the same.
#ifndef CLUSTERPROF_COMMON_XSPACE_XSPACE_ERRORS_H_
#define CLUSTERPROF_COMMON_XSPACE_XSPACE_ERRORS_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace clusterprof::xspace {

// Protobuf wire types by number (0 varint, 1 fixed64, 2 length-delimited, 3/4 group, 5 fixed32).
const char* WireTypeName(int wire_type);

absl::Status EmptyXSpaceError(std::string_view source);
absl::Status CorruptXSpaceError(std::string_view source, uint64_t offset);
// A field whose number `message` (XSpace, XPlane) defines, with a wire type it does not use.
absl::Status WrongWireTypeError(std::string_view source, int field_number, int wire_type,
                                std::string_view message);
absl::Status OnlyUnknownFieldsError(std::string_view source);

}  // namespace clusterprof::xspace

#endif  // CLUSTERPROF_COMMON_XSPACE_XSPACE_ERRORS_H_
