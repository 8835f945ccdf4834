// A small streaming JSON writer for documents we emit (the run manifest, the run report): keys,
// values and brackets appended to a string, commas placed for you. No validation: the caller
// opens and closes what it writes.
#ifndef CLUSTERPROF_COMMON_BASE_JSON_WRITER_H_
#define CLUSTERPROF_COMMON_BASE_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/base/json_escape.h"
#include "common/base/strings.h"

namespace clusterprof {

class JsonWriter {
 public:
  explicit JsonWriter(std::string* out) : out_(out) {}
  void Key(std::string_view key) {
    String(key);
    out_->push_back(':');
    need_comma_ = false;
  }
  void String(std::string_view value) {
    Comma();
    out_->push_back('"');
    AppendJsonEscaped(value, out_);
    out_->push_back('"');
  }
  void Int(int64_t value) {
    Comma();
    StrAppend(out_, value);
  }
  void Uint(uint64_t value) {
    Comma();
    StrAppend(out_, value);
  }
  void Bool(bool value) {
    Comma();
    out_->append(value ? "true" : "false");
  }
  void Null() {
    Comma();
    out_->append("null");
  }
  void Open(char bracket) {
    Comma();
    out_->push_back(bracket);
    need_comma_ = false;
  }
  void Close(char bracket) {
    out_->push_back(bracket);
    need_comma_ = true;
  }
  template <typename T>
  void Field(std::string_view key, const T& value) {
    Key(key);
    if constexpr (std::is_same_v<T, bool>) {
      Bool(value);
    } else if constexpr (std::is_signed_v<T>) {
      Int(value);
    } else if constexpr (std::is_unsigned_v<T>) {
      Uint(value);
    } else {
      String(value);
    }
  }

 private:
  // Writes the separator a value needs, and notes that the next one needs it too.
  void Comma() {
    if (need_comma_) out_->push_back(',');
    need_comma_ = true;
  }
  std::string* out_;
  bool need_comma_ = false;
};

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_JSON_WRITER_H_
