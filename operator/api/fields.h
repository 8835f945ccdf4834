// Reading the fields of our objects' JSON with errors that name the field by its path
// ("spec.capture.durationMs: must be between 1 and 600000 (milliseconds), got -5"). For the
// parsers in operator/api only.
#ifndef CLUSTERPROF_OPERATOR_API_FIELDS_H_
#define CLUSTERPROF_OPERATOR_API_FIELDS_H_

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "cpprest/json.h"

namespace clusterprof::api::api_internal {

using web::json::value;

// Reads typed fields of one JSON object; errors name the field by its path.
class Fields {
 public:
  Fields(const value& object, std::string where) : object_(object), where_(std::move(where)) {}

  static absl::StatusOr<Fields> Of(const value& object, std::string where) {
    if (!object.is_object()) {
      return absl::InvalidArgumentError(StrCat(where, ": must be an object"));
    }
    return Fields(object, std::move(where));
  }

  std::string Path(std::string_view key) const { return StrCat(where_, ".", key); }

  // nullptr when absent or null.
  const value* Find(std::string_view key) const {
    const auto& object = object_.as_object();
    auto it = object.find(std::string(key));
    if (it == object.end() || it->second.is_null()) return nullptr;
    return &it->second;
  }

  absl::Status Int(std::string_view key, int64_t* out) const {
    const value* field = Find(key);
    if (field == nullptr) return absl::OkStatus();
    if (!field->is_number() || !field->as_number().is_int64()) {
      return absl::InvalidArgumentError(
          StrCat(Path(key), ": must be an integer, got ", field->serialize()));
    }
    *out = field->as_number().to_int64();
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Int(std::string_view key, T* out) const {
    int64_t wide = *out;
    CLUSTERPROF_RETURN_IF_ERROR(Int(key, &wide));
    if (wide < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        wide > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      return absl::InvalidArgumentError(StrCat(Path(key), ": ", wide, " is out of range"));
    }
    *out = static_cast<T>(wide);
    return absl::OkStatus();
  }
  absl::Status OptionalInt(std::string_view key, std::optional<int64_t>* out) const {
    if (Find(key) == nullptr) return absl::OkStatus();
    int64_t v = 0;
    CLUSTERPROF_RETURN_IF_ERROR(Int(key, &v));
    *out = v;
    return absl::OkStatus();
  }
  absl::Status String(std::string_view key, std::string* out) const {
    const value* field = Find(key);
    if (field == nullptr) return absl::OkStatus();
    if (!field->is_string()) {
      return absl::InvalidArgumentError(
          StrCat(Path(key), ": must be a string, got ", field->serialize()));
    }
    *out = field->as_string();
    return absl::OkStatus();
  }
  absl::Status Bool(std::string_view key, bool* out) const {
    const value* field = Find(key);
    if (field == nullptr) return absl::OkStatus();
    if (!field->is_boolean()) {
      return absl::InvalidArgumentError(
          StrCat(Path(key), ": must be true or false, got ", field->serialize()));
    }
    *out = field->as_bool();
    return absl::OkStatus();
  }
  absl::Status StringList(std::string_view key, std::vector<std::string>* out) const {
    const value* field = Find(key);
    if (field == nullptr) return absl::OkStatus();
    if (!field->is_array())
      return absl::InvalidArgumentError(StrCat(Path(key), ": must be a list"));
    for (const value& item : field->as_array()) {
      if (!item.is_string()) {
        return absl::InvalidArgumentError(StrCat(Path(key), "[]: must be a string"));
      }
      out->push_back(item.as_string());
    }
    return absl::OkStatus();
  }
  absl::Status StringMap(std::string_view key, std::map<std::string, std::string>* out) const {
    const value* field = Find(key);
    if (field == nullptr) return absl::OkStatus();
    if (!field->is_object())
      return absl::InvalidArgumentError(StrCat(Path(key), ": must be a map"));
    for (const auto& [k, v] : field->as_object()) {
      if (!v.is_string()) {
        return absl::InvalidArgumentError(StrCat(Path(key), ".", k, ": must be a string"));
      }
      (*out)[k] = v.as_string();
    }
    return absl::OkStatus();
  }

 private:
  const value& object_;
  std::string where_;
};

inline absl::Status Range(std::string_view path, int64_t v, int64_t lo, int64_t hi,
                          std::string_view unit = "") {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat(path, ": must be between ", lo, " and ", hi,
                                           unit.empty() ? "" : StrCat(" (", unit, ")"), ", got ",
                                           v));
}

// Where one integer field of an object goes.
using IntRef = std::variant<int32_t*, int64_t*, uint32_t*>;

// One integer field of an object, declared: its key, where it goes in `Out`, and the values it
// may hold. A field that is absent keeps the value `Out` had.
template <typename Out>
struct IntField {
  std::string_view key;
  // A captureless lambda: [](auto& o) -> IntRef { return &o.duration_ms; }.
  IntRef (*field)(Out&);
  int64_t min;
  int64_t max;
  // Named in the error: "must be between 1 and 600000 (milliseconds)".
  std::string_view unit = {};
  // 0 means "not set" and is not checked against the range (a port chosen elsewhere).
  bool zero_is_unset = false;
};

// Reads the fields of `table` from `fields` into `out`, in the table's order; the first field
// that is not an integer in its range is the error.
template <typename Out, size_t N>
absl::Status ReadInts(const Fields& fields, const IntField<Out> (&table)[N], Out& out) {
  for (const IntField<Out>& f : table) {
    CLUSTERPROF_RETURN_IF_ERROR(std::visit(
        [&](auto* v) -> absl::Status {
          CLUSTERPROF_RETURN_IF_ERROR(fields.Int(f.key, v));
          if (f.zero_is_unset && *v == 0) return absl::OkStatus();
          return Range(fields.Path(f.key), static_cast<int64_t>(*v), f.min, f.max, f.unit);
        },
        f.field(out)));
  }
  return absl::OkStatus();
}

}  // namespace clusterprof::api::api_internal

#endif  // CLUSTERPROF_OPERATOR_API_FIELDS_H_
