#include "operator/kube/selector.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "common/base/strings.h"

namespace clusterprof::kube {
namespace {

using Op = LabelRequirement::Operator;

bool IsValueChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
         c == '/';
}

// A small scanner over the string form.
class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ >= text_.size();
  }
  bool Consume(std::string_view token) {
    SkipSpace();
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  // A key or value: letters, digits, '-', '_', '.', '/'. May be empty.
  std::string Word() {
    SkipSpace();
    const size_t start = pos_;
    while (pos_ < text_.size() && IsValueChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }
  // "in" or "notin" followed by a space or '(' (so a key named "inx" is not an operator).
  bool ConsumeKeyword(std::string_view word) {
    SkipSpace();
    if (text_.substr(pos_, word.size()) != word) return false;
    const size_t after = pos_ + word.size();
    if (after < text_.size() && IsValueChar(text_[after])) return false;
    pos_ = after;
    return true;
  }
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        StrCat("label selector \"", text_, "\": ", what, " at position ", pos_ + 1));
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

absl::Status CheckKey(const std::string& key, std::string_view where) {
  if (key.empty()) return absl::InvalidArgumentError(StrCat(where, ": empty label key"));
  if (key.size() > 316) return absl::InvalidArgumentError(StrCat(where, ": label key too long"));
  for (char c : key) {
    if (!IsValueChar(c)) {
      return absl::InvalidArgumentError(StrCat(where, ": invalid label key \"", key, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckValue(const std::string& value, std::string_view where) {
  if (value.size() > 63) {
    return absl::InvalidArgumentError(
        StrCat(where, ": label value \"", value, "\" is longer than 63 characters"));
  }
  for (char c : value) {
    if (!IsValueChar(c) || c == '/') {
      return absl::InvalidArgumentError(StrCat(where, ": invalid label value \"", value, "\""));
    }
  }
  return absl::OkStatus();
}

void Normalize(std::vector<LabelRequirement>& requirements) {
  for (LabelRequirement& r : requirements) {
    std::sort(r.values.begin(), r.values.end());
    r.values.erase(std::unique(r.values.begin(), r.values.end()), r.values.end());
  }
  std::stable_sort(
      requirements.begin(), requirements.end(),
      [](const LabelRequirement& a, const LabelRequirement& b) { return a.key < b.key; });
}

}  // namespace

bool LabelRequirement::Matches(const StringMap& labels) const {
  const std::string* value = FindValue(labels, key);
  switch (op) {
    case Op::kExists:
      return value != nullptr;
    case Op::kDoesNotExist:
      return value == nullptr;
    case Op::kEquals:
    case Op::kIn:
      return value != nullptr && std::binary_search(values.begin(), values.end(), *value);
    case Op::kNotEquals:
    case Op::kNotIn:
      return value == nullptr || !std::binary_search(values.begin(), values.end(), *value);
  }
  return false;
}

absl::StatusOr<LabelSelector> LabelSelector::Parse(std::string_view text) {
  LabelSelector selector;
  Scanner scan(text);
  if (scan.AtEnd()) return selector;
  while (true) {
    LabelRequirement r;
    if (scan.Consume("!")) {
      r.key = scan.Word();
      r.op = Op::kDoesNotExist;
    } else {
      r.key = scan.Word();
      if (r.key.empty()) return scan.Error("expected a label key");
      if (scan.Consume("==") || scan.Consume("=")) {
        r.op = Op::kEquals;
        r.values.push_back(scan.Word());
      } else if (scan.Consume("!=")) {
        r.op = Op::kNotEquals;
        r.values.push_back(scan.Word());
      } else if (const bool notin = scan.ConsumeKeyword("notin");
                 notin || scan.ConsumeKeyword("in")) {
        r.op = notin ? Op::kNotIn : Op::kIn;
        if (!scan.Consume("(")) return scan.Error("expected '(' after in/notin");
        while (true) {
          r.values.push_back(scan.Word());
          if (scan.Consume(")")) break;
          if (!scan.Consume(",")) return scan.Error("expected ',' or ')' in a value set");
        }
      } else {
        r.op = Op::kExists;
      }
    }
    if (absl::Status status = CheckKey(r.key, StrCat("label selector \"", text, "\""));
        !status.ok()) {
      return status;
    }
    for (const std::string& value : r.values) {
      if (absl::Status status = CheckValue(value, StrCat("label selector \"", text, "\""));
          !status.ok()) {
        return status;
      }
    }
    selector.requirements_.push_back(std::move(r));
    if (scan.AtEnd()) break;
    if (!scan.Consume(",")) return scan.Error("expected ','");
  }
  Normalize(selector.requirements_);
  return selector;
}

absl::StatusOr<LabelSelector> LabelSelector::FromJson(const web::json::value& json) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        "selector: must be an object with matchLabels and/or "
        "matchExpressions");
  }
  LabelSelector selector;
  const web::json::object& object = json.as_object();
  if (const auto it = object.find("matchLabels"); it != object.end() && !it->second.is_null()) {
    if (!it->second.is_object()) {
      return absl::InvalidArgumentError("selector.matchLabels: must be a map of strings");
    }
    for (const auto& [key, value] : it->second.as_object()) {
      const std::string where = StrCat("selector.matchLabels.", key);
      if (!value.is_string()) return absl::InvalidArgumentError(StrCat(where, ": not a string"));
      if (absl::Status s = CheckKey(key, where); !s.ok()) return s;
      if (absl::Status s = CheckValue(value.as_string(), where); !s.ok()) return s;
      selector.requirements_.push_back({key, Op::kEquals, {value.as_string()}});
    }
  }
  if (const auto it = object.find("matchExpressions");
      it != object.end() && !it->second.is_null()) {
    if (!it->second.is_array()) {
      return absl::InvalidArgumentError("selector.matchExpressions: must be a list");
    }
    int index = 0;
    for (const web::json::value& e : it->second.as_array()) {
      const std::string where = StrCat("selector.matchExpressions[", index++, "]");
      if (!e.is_object() || !e.has_string_field("key") || !e.has_string_field("operator")) {
        return absl::InvalidArgumentError(StrCat(where, ": needs key and operator"));
      }
      LabelRequirement r;
      r.key = e.at("key").as_string();
      if (absl::Status s = CheckKey(r.key, where); !s.ok()) return s;
      const std::string op = e.at("operator").as_string();
      if (e.has_field("values") && !e.at("values").is_null()) {
        if (!e.at("values").is_array()) {
          return absl::InvalidArgumentError(StrCat(where, ".values: must be a list"));
        }
        for (const web::json::value& v : e.at("values").as_array()) {
          if (!v.is_string()) {
            return absl::InvalidArgumentError(StrCat(where, ".values: must be strings"));
          }
          if (absl::Status s = CheckValue(v.as_string(), where); !s.ok()) return s;
          r.values.push_back(v.as_string());
        }
      }
      if (op == "In" || op == "NotIn") {
        r.op = op == "In" ? Op::kIn : Op::kNotIn;
        if (r.values.empty()) {
          return absl::InvalidArgumentError(
              StrCat(where, ": operator ", op, " needs at least one value"));
        }
      } else if (op == "Exists" || op == "DoesNotExist") {
        r.op = op == "Exists" ? Op::kExists : Op::kDoesNotExist;
        if (!r.values.empty()) {
          return absl::InvalidArgumentError(StrCat(where, ": operator ", op, " takes no values"));
        }
      } else {
        return absl::InvalidArgumentError(
            StrCat(where, ": unknown operator \"", op, "\" (In, NotIn, Exists or DoesNotExist)"));
      }
      selector.requirements_.push_back(std::move(r));
    }
  }
  Normalize(selector.requirements_);
  return selector;
}

bool LabelSelector::Matches(const StringMap& labels) const {
  for (const LabelRequirement& r : requirements_) {
    if (!r.Matches(labels)) return false;
  }
  return true;
}

std::string LabelSelector::ToString() const {
  std::string out;
  for (const LabelRequirement& r : requirements_) {
    if (!out.empty()) out += ',';
    switch (r.op) {
      case Op::kExists:
        out += r.key;
        break;
      case Op::kDoesNotExist:
        StrAppend(&out, "!", r.key);
        break;
      case Op::kEquals:
        StrAppend(&out, r.key, "=", r.values.empty() ? "" : r.values[0]);
        break;
      case Op::kNotEquals:
        StrAppend(&out, r.key, "!=", r.values.empty() ? "" : r.values[0]);
        break;
      case Op::kIn:
      case Op::kNotIn: {
        StrAppend(&out, r.key, r.op == Op::kIn ? " in (" : " notin (");
        for (size_t i = 0; i < r.values.size(); ++i) {
          if (i > 0) out += ',';
          out += r.values[i];
        }
        out += ')';
        break;
      }
    }
  }
  return out;
}

}  // namespace clusterprof::kube
