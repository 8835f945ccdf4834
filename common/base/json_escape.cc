#include "common/base/json_escape.h"

#include <charconv>
#include <cmath>

namespace clusterprof {
namespace {

constexpr std::string_view kReplacementChar = "\\ufffd";

// Length of the valid UTF-8 sequence starting at `p` (at most `n` bytes), or 0 if invalid.
size_t Utf8SequenceLength(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  auto cont = [&](size_t i) { return i < n && (p[i] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && p[1] < 0xA0) return 0;  // overlong
    if (c == 0xED && p[1] > 0x9F) return 0;  // surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && p[1] < 0x90) return 0;  // overlong
    if (c == 0xF4 && p[1] > 0x8F) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

}  // namespace

void AppendJsonEscaped(std::string_view text, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* data = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t run_start = 0;
  size_t i = 0;
  while (i < size) {
    const unsigned char c = data[i];
    if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      const size_t len = Utf8SequenceLength(data + i, size - i);
      if (len > 0) {
        i += len;
        continue;
      }
    }
    out->append(text.data() + run_start, i - run_start);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          const char escaped[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
          out->append(escaped, sizeof(escaped));
        } else {
          out->append(kReplacementChar);
        }
    }
    ++i;
    run_start = i;
  }
  out->append(text.data() + run_start, size - run_start);
}

void AppendJsonDouble(double value, std::string* out) {
  if (std::isnan(value)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(value)) {
    out->append(value > 0 ? "Infinity" : "-Infinity");
    return;
  }
  char buf[32];
  out->append(buf, std::to_chars(buf, buf + sizeof(buf), value).ptr);
}

}  // namespace clusterprof
