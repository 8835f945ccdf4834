// The TraceMe name codec: how annotation metadata rides in an event name (docs/protocol.md).
//
//   Encode("train", {{"step_num", 3}, {"_r", 1}})  ->  "train#step_num=3,_r=1#"
//   AppendMetadata("train#step_num=3#", {{"loss", 0.5}})  ->  "train#step_num=3,loss=0.5#"
//   Decode("train#step_num=3,shape=[1,2]#")  ->  name "train", {step_num: 3, shape: "[1,2]"}
//
// Decoding is exactly the TSL profiler's: split on '#' and keep the first two parts; split pairs
// on ',' except inside quotes, (), [] and {}; split each pair on its first '='; trim; drop empty
// keys or values; type each value as int64, then uint64, then double, else string. It never
// fails: malformed metadata yields fewer pairs, as upstream.
//
// All functions are pure and thread-safe.
#ifndef CLUSTERPROF_COMMON_XSPACE_TRACEME_H_
#define CLUSTERPROF_COMMON_XSPACE_TRACEME_H_

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace clusterprof::traceme {

// A metadata value as callers give it. Booleans encode as 1 and 0 (as JAX writes them), so they
// decode as integers; doubles use the shortest text that reads back to the same value.
class ArgValue {
 public:
  ArgValue(bool v) : value_(static_cast<int64_t>(v ? 1 : 0)) {}         // NOLINT
  ArgValue(int v) : value_(static_cast<int64_t>(v)) {}                  // NOLINT
  ArgValue(long v) : value_(static_cast<int64_t>(v)) {}                 // NOLINT
  ArgValue(long long v) : value_(static_cast<int64_t>(v)) {}            // NOLINT
  ArgValue(unsigned v) : value_(static_cast<uint64_t>(v)) {}            // NOLINT
  ArgValue(unsigned long v) : value_(static_cast<uint64_t>(v)) {}       // NOLINT
  ArgValue(unsigned long long v) : value_(static_cast<uint64_t>(v)) {}  // NOLINT
  ArgValue(double v) : value_(v) {}                                     // NOLINT
  ArgValue(float v) : value_(static_cast<double>(v)) {}                 // NOLINT
  ArgValue(std::string_view v) : value_(v) {}                           // NOLINT
  ArgValue(const char* v) : value_(std::string_view(v)) {}              // NOLINT
  ArgValue(const std::string& v) : value_(std::string_view(v)) {}       // NOLINT

  // Appends the value's text to `out`.
  void AppendTo(std::string* out) const;

 private:
  std::variant<int64_t, uint64_t, double, std::string_view> value_;
};

struct Arg {
  std::string_view key;
  ArgValue value;
};

// '#' delimits the metadata, so it cannot appear inside a key, a value, or a name that carries
// metadata: the encoder replaces it with '_' there rather than corrupt the event.
inline constexpr char kReplacementForHash = '_';

// Encodes `name` with `args`. With no args the name is returned unchanged (a name that does not
// end in '#' carries no metadata).
std::string Encode(std::string_view name, std::span<const Arg> args);
inline std::string Encode(std::string_view name, std::initializer_list<Arg> args) {
  return Encode(name, std::span<const Arg>(args.begin(), args.size()));
}

// Appends `args` to an already encoded name, as Python's set_metadata does: a trailing '#'
// becomes ',' and the new pairs end with '#'; a name without metadata gains it.
void AppendMetadata(std::string* encoded, std::span<const Arg> args);
inline void AppendMetadata(std::string* encoded, std::initializer_list<Arg> args) {
  AppendMetadata(encoded, std::span<const Arg>(args.begin(), args.size()));
}

// A decoded value: int64, uint64, double, or text (a view into the decoded string).
using Value = std::variant<int64_t, uint64_t, double, std::string_view>;

// Types `text` as the TSL profiler does (absl::SimpleAtoi for int64 then uint64, SimpleAtod for
// double, else the text itself).
Value ParseValue(std::string_view text);

struct Stat {
  std::string_view key;
  Value value;
};

struct Annotation {
  std::string_view name;
  std::vector<Stat> stats;
};

// True when `encoded` carries metadata (its last character is '#').
inline bool HasMetadata(std::string_view encoded) {
  return !encoded.empty() && encoded.back() == '#';
}

// Decodes an event name. The views point into `encoded`.
Annotation Decode(std::string_view encoded);

}  // namespace clusterprof::traceme

#endif  // CLUSTERPROF_COMMON_XSPACE_TRACEME_H_
