// The encoding half of the TraceMe codec. It depends on the C++ standard library only, so the
// annotation SDK that runs inside workloads can link it (target clusterprof_traceme_encode).
#include <charconv>

#include "common/xspace/traceme.h"

namespace clusterprof::traceme {
namespace {

void AppendReplacingHash(std::string_view text, std::string* out) {
  const size_t start = out->size();
  out->append(text);
  for (size_t i = start; i < out->size(); ++i) {
    if ((*out)[i] == '#') (*out)[i] = kReplacementForHash;
  }
}

void AppendPairs(std::span<const Arg> args, std::string* out) {
  bool first = true;
  for (const Arg& arg : args) {
    if (!first) out->push_back(',');
    first = false;
    AppendReplacingHash(arg.key, out);
    out->push_back('=');
    const size_t value_start = out->size();
    arg.value.AppendTo(out);
    for (size_t i = value_start; i < out->size(); ++i) {
      if ((*out)[i] == '#') (*out)[i] = kReplacementForHash;
    }
  }
  out->push_back('#');
}

}  // namespace

void ArgValue::AppendTo(std::string* out) const {
  char buffer[32];
  std::to_chars_result result{};
  switch (value_.index()) {
    case 0:
      result = std::to_chars(buffer, buffer + sizeof(buffer), std::get<int64_t>(value_));
      break;
    case 1:
      result = std::to_chars(buffer, buffer + sizeof(buffer), std::get<uint64_t>(value_));
      break;
    case 2:
      result = std::to_chars(buffer, buffer + sizeof(buffer), std::get<double>(value_));
      break;
    default:
      out->append(std::get<std::string_view>(value_));
      return;
  }
  out->append(buffer, result.ptr);
}

std::string Encode(std::string_view name, std::span<const Arg> args) {
  std::string out;
  if (args.empty()) {
    out.assign(name);
    return out;
  }
  out.reserve(name.size() + 16 * args.size());
  AppendReplacingHash(name, &out);
  out.push_back('#');
  AppendPairs(args, &out);
  return out;
}

void AppendMetadata(std::string* encoded, std::span<const Arg> args) {
  if (args.empty()) return;
  if (HasMetadata(*encoded)) {
    encoded->back() = ',';
  } else {
    for (char& c : *encoded) {
      if (c == '#') c = kReplacementForHash;
    }
    encoded->push_back('#');
  }
  AppendPairs(args, encoded);
}

}  // namespace clusterprof::traceme
