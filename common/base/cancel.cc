#include "common/base/cancel.h"

#include <utility>

namespace clusterprof {

void CancelToken::Cancel() {
  // Callbacks run under mu_, so that Unregister (which takes mu_) returns only once a callback
  // that had started has finished.
  MutexLock lock(&mu_);
  if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
  for (auto& [id, fn] : callbacks_) fn();
  callbacks_.clear();
}

CancelToken::Registration CancelToken::OnCancel(std::function<void()> fn) {
  MutexLock lock(&mu_);
  if (cancelled_.load(std::memory_order_acquire)) {
    fn();
    return Registration();
  }
  const uint64_t id = next_id_++;
  callbacks_.emplace(id, std::move(fn));
  return Registration(this, id);
}

void CancelToken::Unregister(uint64_t id) {
  MutexLock lock(&mu_);
  callbacks_.erase(id);
}

CancelToken::Registration::Registration(Registration&& other) noexcept
    : token_(std::exchange(other.token_, nullptr)), id_(other.id_) {}

CancelToken::Registration& CancelToken::Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    if (token_ != nullptr) token_->Unregister(id_);
    token_ = std::exchange(other.token_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

CancelToken::Registration::~Registration() {
  if (token_ != nullptr) token_->Unregister(id_);
}

}  // namespace clusterprof
