#include "operator/kube/watch_decoder.h"

#include <utility>

#include "common/base/strings.h"

namespace clusterprof::kube {
namespace {

std::string Excerpt(std::string_view text) {
  constexpr size_t kMax = 120;
  std::string out(text.substr(0, kMax));
  if (text.size() > kMax) out += "...";
  return out;
}

}  // namespace

absl::StatusOr<WatchEvent> ParseWatchEvent(std::string_view frame) {
  web::json::value json;
  try {
    std::error_code error;
    json = web::json::value::parse(std::string(frame), error);
    if (error) {
      return absl::InvalidArgumentError(
          StrCat("watch event is not valid JSON (", error.message(), "): ", Excerpt(frame)));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        StrCat("watch event is not valid JSON (", e.what(), "): ", Excerpt(frame)));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(StrCat("watch event is not a JSON object: ", Excerpt(frame)));
  }
  web::json::object& object = json.as_object();
  const auto type_it = object.find("type");
  if (type_it == object.end() || !type_it->second.is_string()) {
    return absl::InvalidArgumentError(
        StrCat("watch event has no string \"type\": ", Excerpt(frame)));
  }
  WatchEvent event;
  const std::string& type = type_it->second.as_string();
  if (type == "ADDED") {
    event.type = WatchEvent::Type::kAdded;
  } else if (type == "MODIFIED") {
    event.type = WatchEvent::Type::kModified;
  } else if (type == "DELETED") {
    event.type = WatchEvent::Type::kDeleted;
  } else if (type == "BOOKMARK") {
    event.type = WatchEvent::Type::kBookmark;
  } else if (type == "ERROR") {
    event.type = WatchEvent::Type::kError;
  } else {
    return absl::InvalidArgumentError(StrCat("watch event has unknown type \"", type,
                                             "\" (expected ADDED, MODIFIED, DELETED, BOOKMARK "
                                             "or ERROR)"));
  }
  const auto object_it = object.find("object");
  if (object_it == object.end() || !object_it->second.is_object()) {
    return absl::InvalidArgumentError(
        StrCat("watch event ", type, " has no \"object\" object: ", Excerpt(frame)));
  }
  event.object = std::move(object_it->second);
  return event;
}

WatchDecoder::WatchDecoder(size_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}

void WatchDecoder::Feed(std::string_view bytes) {
  // Drop what earlier frames used before growing the buffer.
  if (start_ > 0 && start_ >= buffer_.size() / 2) {
    buffer_.erase(0, start_);
    scan_ -= start_;
    start_ = 0;
  }
  buffer_.append(bytes);
}

bool WatchDecoder::ScanFrame() {
  const char* data = buffer_.data();
  const size_t size = buffer_.size();
  while (scan_ < size) {
    const char c = data[scan_];
    if (!started_) {
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
        ++scan_;
        start_ = scan_;
        continue;
      }
      if (c != '{') {
        failed_ = absl::InvalidArgumentError(
            StrCat("watch stream: expected '{' to start event ", frames_ + 1,
                   ", got: ", Excerpt(std::string_view(buffer_).substr(scan_))));
        return false;
      }
      started_ = true;
      depth_ = 0;
    }
    ++scan_;
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) {
        started_ = false;
        return true;
      }
    }
  }
  return false;
}

absl::StatusOr<std::optional<WatchEvent>> WatchDecoder::Next() {
  if (!failed_.ok()) return failed_;
  if (!ScanFrame()) {
    if (!failed_.ok()) return failed_;
    if (buffered() > max_frame_bytes_) {
      failed_ = absl::InvalidArgumentError(StrCat("watch stream: event ", frames_ + 1,
                                                  " is larger than ", max_frame_bytes_, " bytes"));
      return failed_;
    }
    return std::nullopt;
  }
  const std::string_view frame = std::string_view(buffer_).substr(start_, scan_ - start_);
  start_ = scan_;
  ++frames_;
  absl::StatusOr<WatchEvent> event = ParseWatchEvent(frame);
  if (!event.ok()) {
    return absl::InvalidArgumentError(
        StrCat("watch stream event ", frames_, ": ", event.status().message()));
  }
  return std::optional<WatchEvent>(*std::move(event));
}

}  // namespace clusterprof::kube
