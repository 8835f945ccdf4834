// String helpers that bridge std::string_view and absl::string_view.
//
// Debian's abseil is built with its own absl::string_view (not an alias of std::string_view), so
// absl::StrCat and friends do not take std::string_view. clusterprof code uses std::string_view
// throughout and these helpers at the boundary.
#ifndef CLUSTERPROF_COMMON_BASE_STRINGS_H_
#define CLUSTERPROF_COMMON_BASE_STRINGS_H_

#include <charconv>
#include <concepts>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"

namespace clusterprof {

inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }
inline std::string_view StdView(absl::string_view s) { return {s.data(), s.size()}; }

namespace internal {

inline void AppendPiece(std::string& out, std::string_view piece) { out.append(piece); }
inline void AppendPiece(std::string& out, absl::string_view piece) {
  out.append(piece.data(), piece.size());
}
inline void AppendPiece(std::string& out, const char* piece) { out.append(piece); }
inline void AppendPiece(std::string& out, const std::string& piece) { out.append(piece); }
inline void AppendPiece(std::string& out, char c) { out.push_back(c); }
template <typename T>
requires(std::is_arithmetic_v<T> && !std::is_same_v<T, char> &&
         !std::is_same_v<T, bool>) void AppendPiece(std::string& out, T value) {
  char buffer[32];
  out.append(buffer, std::to_chars(buffer, buffer + sizeof(buffer), value).ptr);
}
inline void AppendPiece(std::string& out, bool value) { out.append(value ? "true" : "false"); }

}  // namespace internal

// Concatenates strings (std or absl views, C strings, chars) and numbers (integers in decimal,
// floating point in their shortest round-trip form).
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (internal::AppendPiece(out, args), ...);
  return out;
}

template <typename... Args>
void StrAppend(std::string* out, const Args&... args) {
  (internal::AppendPiece(*out, args), ...);
}

// Splits on `separator`, dropping empty pieces. The views point into `s`.
std::vector<std::string_view> SplitSkipEmpty(std::string_view s, char separator);

// Whitespace (ASCII) trimmed from both ends.
std::string_view StripAsciiWhitespace(std::string_view s);

// A TCP port in decimal digits only, 1-65535 ("8466"); nullopt for anything else ("", "+80",
// "08466x", "70000").
std::optional<int> ParsePort(std::string_view text);

// "host:port" or "[v6]:port": a non-empty host, then a port ParsePort takes.
bool IsHostPort(std::string_view address);

// The host of "host:port", without an IPv6 literal's brackets ("[::1]:8466" -> "::1"); the whole
// text when it has no port.
std::string_view AddressHost(std::string_view address);

// Whether `host` is a loopback IP literal: 127.0.0.0/8, ::1 or ::ffff:127.0.0.0/104. Names
// ("localhost") are not.
bool IsLoopbackIp(std::string_view host);

inline bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.starts_with(prefix);
}
inline bool EndsWith(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

// Removes `prefix` / `suffix` when present; returns whether it did.
inline bool ConsumePrefix(std::string_view* s, std::string_view prefix) {
  if (!s->starts_with(prefix)) return false;
  s->remove_prefix(prefix.size());
  return true;
}
inline bool ConsumeSuffix(std::string_view* s, std::string_view suffix) {
  if (!s->ends_with(suffix)) return false;
  s->remove_suffix(suffix.size());
  return true;
}

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_STRINGS_H_
