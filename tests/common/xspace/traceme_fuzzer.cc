// Fuzzes the TraceMe name codec with arbitrary annotation names (every event name in a trace
// from an upstream workload goes through Decode). Checks only what the TSL algorithm guarantees
// (see traceme.h):
// - the views point into the input;
// - the name is trimmed; when the input carries metadata (ends in '#') the name holds no '#' and
//   without metadata there are no stats;
// - each key and each text value is non-empty, trimmed and free of '#'; a key holds no '=' (pairs
//   split on their first '='), a value may;
// - a text value is text ParseValue does not read as a number.
// Then re-encodes the decoded name and stats with Encode and decodes again: when the name holds
// no '#', the name, the keys, the text values and the numbers come back.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/xspace/traceme.h"

namespace {

using ::clusterprof::traceme::Annotation;
using ::clusterprof::traceme::Value;

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

bool IsTrimmed(std::string_view s) {
  return s.empty() || (!IsSpace(s.front()) && !IsSpace(s.back()));
}

bool Within(std::string_view part, std::string_view whole) {
  if (part.empty()) return true;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(whole.data());
  const uintptr_t p = reinterpret_cast<uintptr_t>(part.data());
  return p >= begin && p + part.size() <= begin + whole.size();
}

// The value as a double, for comparing numbers that may change type on re-encoding: a double
// like 100.0 is written "100" and reads back as an int64.
bool AsDouble(const Value& value, double* out) {
  if (const auto* v = std::get_if<int64_t>(&value)) {
    *out = static_cast<double>(*v);
  } else if (const auto* u = std::get_if<uint64_t>(&value)) {
    *out = static_cast<double>(*u);
  } else if (const auto* d = std::get_if<double>(&value)) {
    *out = *d;
  } else {
    return false;
  }
  return true;
}

bool SameValue(const Value& before, const Value& after) {
  if (const auto* text = std::get_if<std::string_view>(&before)) {
    const auto* again = std::get_if<std::string_view>(&after);
    return again != nullptr && *again == *text;
  }
  // Integers are written exactly and read back as the same type.
  if (!std::holds_alternative<double>(before)) return before == after;
  double a;
  double b;
  if (!AsDouble(before, &a) || !AsDouble(after, &b)) return false;
  return a == b || (std::isnan(a) && std::isnan(b));
}

void CheckDecoded(std::string_view input, const Annotation& decoded) {
  Check(Within(decoded.name, input));
  Check(IsTrimmed(decoded.name));
  if (clusterprof::traceme::HasMetadata(input)) {
    Check(decoded.name.find('#') == std::string_view::npos);
  } else {
    Check(decoded.stats.empty());
  }
  for (const auto& stat : decoded.stats) {
    Check(!stat.key.empty());
    Check(Within(stat.key, input));
    Check(IsTrimmed(stat.key));
    Check(stat.key.find('#') == std::string_view::npos);
    Check(stat.key.find('=') == std::string_view::npos);
    if (const auto* text = std::get_if<std::string_view>(&stat.value)) {
      Check(!text->empty());
      Check(Within(*text, input));
      Check(IsTrimmed(*text));
      Check(text->find('#') == std::string_view::npos);
      Check(std::holds_alternative<std::string_view>(clusterprof::traceme::ParseValue(*text)));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const Annotation decoded = clusterprof::traceme::Decode(input);
  CheckDecoded(input, decoded);
  if (decoded.name.find('#') != std::string_view::npos) return 0;

  // Re-encode: numbers as numbers, text as text.
  std::vector<clusterprof::traceme::Arg> args;
  args.reserve(decoded.stats.size());
  for (const auto& stat : decoded.stats) {
    std::visit([&](const auto& v) { args.push_back({stat.key, v}); }, stat.value);
  }
  const std::string encoded = clusterprof::traceme::Encode(decoded.name, args);
  const Annotation again = clusterprof::traceme::Decode(encoded);
  CheckDecoded(encoded, again);
  Check(again.name == decoded.name);
  Check(again.stats.size() == decoded.stats.size());
  for (size_t i = 0; i < decoded.stats.size(); ++i) {
    Check(again.stats[i].key == decoded.stats[i].key);
    Check(SameValue(decoded.stats[i].value, again.stats[i].value));
  }
  return 0;
}
