#include "common/xspace/traceme.h"

#include <charconv>

#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "common/base/strings.h"

namespace clusterprof::traceme {
namespace {
// Splits metadata on ',' outside quotes and brackets, as the TSL profiler does. Pieces of one
// character or less cannot hold "k=v" and are skipped.
template <typename Fn>
void ForEachPair(std::string_view metadata, Fn&& fn) {
  // Open quotes and brackets, innermost last.
  absl::InlinedVector<char, 16> open;
  auto top = [&]() { return open.back(); };
  auto push = [&](char c) { open.push_back(c); };
  auto pop = [&]() { open.pop_back(); };
  auto empty = [&]() { return open.empty(); };

  size_t start = 0;
  size_t end = 0;
  for (; end < metadata.size(); ++end) {
    const char c = metadata[end];
    switch (c) {
      case '"':
      case '\'':
        if (empty() || top() != c) {
          push(c);
        } else {
          pop();
        }
        break;
      case '{':
      case '(':
      case '[':
        push(c);
        break;
      case '}':
        if (!empty() && top() == '{') pop();
        break;
      case ')':
        if (!empty() && top() == '(') pop();
        break;
      case ']':
        if (!empty() && top() == '[') pop();
        break;
      case ',':
        if (empty()) {
          if (end - start > 1) fn(metadata.substr(start, end - start));
          start = end + 1;
        }
        break;
      default:
        break;
    }
  }
  if (end - start > 1) fn(metadata.substr(start, end - start));
}

}  // namespace

Value ParseValue(std::string_view text) {
  int64_t int_value;
  if (absl::SimpleAtoi(AbslView(text), &int_value)) return int_value;
  uint64_t uint_value;
  if (absl::SimpleAtoi(AbslView(text), &uint_value)) return uint_value;
  double double_value;
  if (absl::SimpleAtod(AbslView(text), &double_value)) return double_value;
  return text;
}

Annotation Decode(std::string_view encoded) {
  Annotation result;
  if (!HasMetadata(encoded)) {
    result.name = StripAsciiWhitespace(encoded);
    return result;
  }
  encoded.remove_suffix(1);
  const size_t first_hash = encoded.find('#');
  result.name = StripAsciiWhitespace(encoded.substr(0, first_hash));
  if (first_hash == std::string_view::npos) return result;
  std::string_view metadata = encoded.substr(first_hash + 1);
  if (const size_t second_hash = metadata.find('#'); second_hash != std::string_view::npos) {
    metadata = metadata.substr(0, second_hash);
  }
  ForEachPair(metadata, [&](std::string_view pair) {
    const size_t eq = pair.find('=');
    if (eq == std::string_view::npos) return;
    const std::string_view key = StripAsciiWhitespace(pair.substr(0, eq));
    const std::string_view value = StripAsciiWhitespace(pair.substr(eq + 1));
    if (key.empty() || value.empty()) return;
    result.stats.push_back({key, ParseValue(value)});
  });
  return result;
}

}  // namespace clusterprof::traceme
