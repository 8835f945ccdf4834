#include "common/io/background_sink.h"

#include <algorithm>

namespace clusterprof::io {

BackgroundSink::BackgroundSink(ByteSink* out, size_t buffer_size, int max_buffers)
    : out_(out), buffer_size_(std::max<size_t>(buffer_size, 4096)), max_buffers_(max_buffers) {
  current_.reserve(buffer_size_);
  thread_ = std::thread([this] { Run(); });
}

BackgroundSink::~BackgroundSink() { (void)Finish(); }

void BackgroundSink::Run() {
  while (true) {
    std::string buffer;
    {
      MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !queue_.empty() || closing_; });
      if (queue_.empty()) return;  // closing and drained
      buffer = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    absl::Status status;
    {
      bool failed;
      {
        MutexLock lock(&mu_);
        failed = !status_.ok();
      }
      if (!failed) status = out_->Append(buffer);
    }
    MutexLock lock(&mu_);
    busy_ = false;
    if (status_.ok() && !status.ok()) status_ = status;
    buffer.clear();
    free_.push_back(std::move(buffer));
  }
}

absl::Status BackgroundSink::Submit() {
  MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return static_cast<int>(queue_.size()) < max_buffers_ || !status_.ok();
  });
  if (!status_.ok()) {
    current_.clear();
    return status_;
  }
  queue_.push_back(std::move(current_));
  if (!free_.empty()) {
    current_ = std::move(free_.back());
    free_.pop_back();
  } else {
    current_ = std::string();
    current_.reserve(buffer_size_);
  }
  return absl::OkStatus();
}

absl::Status BackgroundSink::Append(std::string_view data) {
  if (finished_) return absl::FailedPreconditionError("append to a finished background sink");
  while (!data.empty()) {
    const size_t room = buffer_size_ - current_.size();
    const size_t n = std::min(room, data.size());
    current_.append(data.data(), n);
    data.remove_prefix(n);
    if (current_.size() == buffer_size_) {
      if (absl::Status s = Submit(); !s.ok()) return s;
    }
  }
  MutexLock lock(&mu_);
  return status_;
}

absl::StatusOr<std::span<char>> BackgroundSink::NextWritable() {
  if (finished_) return absl::FailedPreconditionError("write to a finished background sink");
  if (current_.size() == buffer_size_) {
    if (absl::Status s = Submit(); !s.ok()) return s;
  } else {
    MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
  }
  const size_t used = current_.size();
  current_.resize(buffer_size_);
  return std::span<char>(current_.data() + used, buffer_size_ - used);
}

void BackgroundSink::BackUp(size_t count) {
  current_.resize(current_.size() - std::min(count, current_.size()));
}

absl::Status BackgroundSink::Finish() {
  if (finished_) {
    MutexLock lock(&mu_);
    return status_;
  }
  finished_ = true;
  absl::Status status = current_.empty() ? absl::OkStatus() : Submit();
  {
    MutexLock lock(&mu_);
    closing_ = true;
  }
  thread_.join();
  MutexLock lock(&mu_);
  return status_.ok() ? status : status_;
}

}  // namespace clusterprof::io
