// The C ABI (clusterprof_annotate.h) over the C++ SDK's internals (annotate.h).
//
// Names arrive TraceMe-encoded (`name#k=v,...#`), as Python builds them. Leading pairs with
// plain integer values (`step_num=7`, `_r=1`) are moved into the record's inline args, as the
// C++ Trace stores its first two args, and the rest stays in the name. The sidecar decodes both
// into the same stats, and a name whose step number changes every step does not intern a new
// string each step.
//
// No exception leaves this file: the C++ internals may throw std::bad_alloc, which a C caller
// could not handle, so every entry point catches and reports "not recorded".
#include <algorithm>
#include <charconv>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>

#include "sdk/annotate.h"
#include "sdk/clusterprof_annotate.h"

namespace clusterprof::annotate_internal {
namespace {

// A TraceMe-encoded name split for recording.
struct SplitName {
  std::string_view name;   // the record's name: the base name, or all of the input
  std::string_view extra;  // metadata pairs left for the name (`k=v,...`, no '#')
  std::string_view keys[shm::kMaxInlineArgs];
  int64_t values[shm::kMaxInlineArgs] = {};
  int num_inline = 0;
};

// Characters a key moved inline may hold: none that the TraceMe decoder treats specially (pair
// and metadata separators, quotes, brackets) and no whitespace (the decoder trims it), so the
// decoder would have read the pair exactly as it is moved.
bool IsPlainKeyChar(char c) {
  switch (c) {
    case '=':
    case ',':
    case '#':
    case '"':
    case '\'':
    case '(':
    case ')':
    case '[':
    case ']':
    case '{':
    case '}':
    case ' ':
    case '\t':
    case '\n':
    case '\v':
    case '\f':
    case '\r':
      return false;
    default:
      return true;
  }
}

// Reads one `key=integer` pair at the start of `metadata`, ended by ',' or the end of it; the
// integer must be `-?[0-9]+` within int64 (what the decoder would type as int64 with the same
// value). Returns the bytes the pair and its ',' take, or 0 when it is not such a pair.
size_t TakeIntegerPair(std::string_view metadata, std::string_view* key, int64_t* value) {
  size_t eq = 0;
  while (eq < metadata.size() && IsPlainKeyChar(metadata[eq])) ++eq;
  if (eq == 0 || eq == metadata.size() || metadata[eq] != '=') return 0;
  const size_t end = std::min(metadata.find(',', eq + 1), metadata.size());
  const char* first = metadata.data() + eq + 1;
  const char* last = metadata.data() + end;
  const auto [ptr, ec] = std::from_chars(first, last, *value);  // accepts only -?[0-9]+
  if (ec != std::errc() || ptr != last) return 0;
  *key = metadata.substr(0, eq);
  return end == metadata.size() ? end : end + 1;
}

SplitName Split(std::string_view encoded) {
  SplitName out;
  out.name = encoded;
  // Only the plain shape `base#metadata#`: one '#' opening the metadata, one closing it.
  if (encoded.size() < 3 || encoded.back() != '#') return out;
  const size_t open = encoded.find('#');
  if (open == 0 || open + 1 == encoded.size()) return out;
  std::string_view metadata = encoded.substr(open + 1, encoded.size() - open - 2);
  if (metadata.find('#') != std::string_view::npos) return out;
  while (out.num_inline < shm::kMaxInlineArgs) {
    const size_t taken =
        TakeIntegerPair(metadata, &out.keys[out.num_inline], &out.values[out.num_inline]);
    if (taken == 0) break;
    metadata.remove_prefix(taken);
    ++out.num_inline;
  }
  if (out.num_inline == 0) return out;
  out.name = encoded.substr(0, open);
  out.extra = metadata;
  return out;
}

// Starts a complete event for `encoded` on this thread: fills `record` (start time included)
// and `split`. Returns false when nothing is to be recorded.
bool Begin(int level, std::string_view encoded, shm::Record* record, SplitName* split) {
  *split = Split(encoded);
  std::string* unused = nullptr;  // BeginComplete spills args beyond the inline ones; none here
  switch (split->num_inline) {
    case 0:
      return BeginComplete(level, split->name, {}, record, &unused);
    case 1:
      return BeginComplete(level, split->name, {{split->keys[0], split->values[0]}}, record,
                           &unused);
    default:
      return BeginComplete(level, split->name,
                           {{split->keys[0], split->values[0]}, {split->keys[1], split->values[1]}},
                           record, &unused);
  }
}

int ClampLevel(int level) { return std::max(level, kAnnotationLevelCritical); }

// A null name reads as empty (with a non-null pointer: the SDK may memcpy from it).
std::string_view View(const char* text, size_t size) {
  return text == nullptr ? std::string_view("") : std::string_view(text, size);
}

// What clusterprof_trace_t holds.
struct ScopedTrace {
  shm::Record record;
  std::string_view name;
  std::string_view extra;
  bool active;
};
static_assert(sizeof(ScopedTrace) <= sizeof(clusterprof_trace_t),
              "clusterprof_trace_t is part of the ABI: its size cannot grow");
static_assert(alignof(ScopedTrace) <= alignof(clusterprof_trace_t));
static_assert(std::is_trivially_copyable_v<ScopedTrace> &&
              std::is_trivially_destructible_v<ScopedTrace>);

}  // namespace
}  // namespace clusterprof::annotate_internal

namespace ai = clusterprof::annotate_internal;

extern "C" {

int clusterprof_abi_version(void) { return CLUSTERPROF_ABI_VERSION; }

int clusterprof_tracing_enabled(int level) {
  try {
    return ai::ClampLevel(level) <= ai::InitializedLevel() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int64_t clusterprof_now_ns(void) { return ai::NowNs(); }

int clusterprof_record_complete(const char* name, size_t name_len, int64_t start_ns, int64_t end_ns,
                                int level) {
  level = ai::ClampLevel(level);
  if (level > ai::CurrentLevel()) return 0;
  try {
    clusterprof::shm::Record record;
    ai::SplitName split;
    if (!ai::Begin(level, ai::View(name, name_len), &record, &split)) return 0;
    record.start_ns = start_ns;
    record.end_ns = end_ns;
    return ai::WriteComplete(split.name, split.extra, &record) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int clusterprof_trace_begin(clusterprof_trace_t* trace, const char* name, size_t name_len,
                            int level) {
  if (trace == nullptr) return 0;
  auto* state = new (trace->opaque) ai::ScopedTrace;
  state->active = false;
  level = ai::ClampLevel(level);
  if (level > ai::CurrentLevel()) return 0;
  try {
    ai::SplitName split;
    if (!ai::Begin(level, ai::View(name, name_len), &state->record, &split)) return 0;
    state->name = split.name;
    state->extra = split.extra;
    state->active = true;
    return 1;
  } catch (...) {
    return 0;
  }
}

int clusterprof_trace_end(clusterprof_trace_t* trace) {
  if (trace == nullptr) return 0;
  auto* state = std::launder(reinterpret_cast<ai::ScopedTrace*>(trace->opaque));
  if (!state->active) return 0;
  state->active = false;
  state->record.end_ns = ai::NowNs();
  try {
    return ai::WriteComplete(state->name, state->extra, &state->record) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

void clusterprof_set_thread_name(const char* name, size_t name_len) {
  try {
    clusterprof::SetThreadName(ai::View(name, name_len));
  } catch (...) {
  }
}

int clusterprof_async_begin(const char* name, size_t name_len, uint64_t id, int level) {
  level = ai::ClampLevel(level);
  if (level > ai::CurrentLevel()) return 0;
  try {
    return ai::RecordAsync(level, true, ai::View(name, name_len), id, ai::NowNs()) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int clusterprof_async_end(uint64_t id, int level) {
  level = ai::ClampLevel(level);
  if (level > ai::CurrentLevel()) return 0;
  try {
    return ai::RecordAsync(level, false, {}, id, ai::NowNs()) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int clusterprof_attached(void) {
  try {
    return clusterprof::GetAnnotationStats().attached ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

uint64_t clusterprof_dropped_strings(void) {
  try {
    return clusterprof::GetAnnotationStats().dropped_strings;
  } catch (...) {
    return 0;
  }
}

size_t clusterprof_ring_path(char* buffer, size_t size) {
  try {
    const std::string path = clusterprof::GetAnnotationStats().ring_path;
    if (buffer != nullptr && size > 0) {
      const size_t n = std::min(path.size(), size - 1);
      std::memcpy(buffer, path.data(), n);
      buffer[n] = '\0';
    }
    return path.size();
  } catch (...) {
    if (buffer != nullptr && size > 0) buffer[0] = '\0';
    return 0;
  }
}

}  // extern "C"
