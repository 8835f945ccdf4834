#include "sdk/cupti/injection_watcher.h"

#include <sys/stat.h>

namespace clusterprof::cupti {

InjectionWatcher::InjectionWatcher(Options options, std::unique_ptr<CuptiApi> api,
                                   std::string load_error)
    : options_(std::move(options)), api_(std::move(api)), load_error_(std::move(load_error)) {}

void InjectionWatcher::Attach() {
  // Maps the control page, again when the sidecar has replaced it (a restarted sidecar creates a
  // new file; the old mapping would never be armed again).
  struct stat st;
  if (stat((options_.dir + "/" + shm::kControlFileName).c_str(), &st) != 0) return;
  if (control_ != nullptr && control_->attached() && st.st_ino == control_inode_) return;
  auto control = std::make_unique<shm::ControlReader>();
  if (!control->TryAttach(options_.dir)) return;
  control_ = std::move(control);
  control_inode_ = st.st_ino;
}

void InjectionWatcher::Poll() {
  if (polls_++ % options_.reattach_every_polls == 0) Attach();
  if (control_ == nullptr) return;
  const shm::ControlPage& page = control_->page();
  if (page.size < sizeof(shm::ControlPage)) return;  // a sidecar without GPU tracing
  const uint32_t level = page.device_level.load(std::memory_order_acquire);
  const uint64_t seq = page.device_seq.load(std::memory_order_acquire);
  const bool armed = recorder_ != nullptr && recorder_->armed();
  if (level >= 1 && seq != armed_seq_) {
    armed_seq_ = seq;
    armed_polls_ = 0;
    if (!EnsureRecorder()) return;
    RecorderConfig config;
    config.max_activity_events = page.gpu_max_activity_events.load(std::memory_order_relaxed);
    config.max_api_events = page.gpu_max_api_events.load(std::memory_order_relaxed);
    const uint32_t flags = page.gpu_flags.load(std::memory_order_relaxed);
    config.nvtx = (flags & shm::kGpuFlagNvtx) != 0;
    config.runtime_api = (flags & shm::kGpuFlagNoRuntimeApi) == 0;
    config.driver_api = (flags & shm::kGpuFlagNoDriverApi) == 0;
    config.synchronization = options_.synchronization;
    if (!recorder_->Enable(seq, config) && !reported_failure_) {
      reported_failure_ = true;
      options_.log(ring_->header().error);
    }
  } else if (level == 0 && armed) {
    recorder_->Disable();
  } else if (armed && options_.flush_every_polls > 0 &&
             ++armed_polls_ % options_.flush_every_polls == 0) {
    recorder_->Flush();
  }
}

bool InjectionWatcher::EnsureRecorder() {
  if (recorder_ != nullptr) return !recorder_->failed();
  if (ring_ == nullptr) {
    std::string error;
    ring_ = shm::GpuRingWriter::Create(options_.dir, options_.ring_records, options_.process_name,
                                       &error);
    if (ring_ == nullptr) {
      if (!reported_failure_) options_.log("GPU tracing is off: " + error);
      reported_failure_ = true;
      return false;
    }
  }
  if (api_ == nullptr) {
    ring_->SetError("GPU tracing is off in this process: " + load_error_);
    return false;
  }
  recorder_ = std::make_unique<CuptiRecorder>(*api_, *ring_, options_.wall_ns, options_.sleep);
  if (!recorder_->Setup()) {
    options_.log(ring_->header().error);
    reported_failure_ = true;
    return false;
  }
  return true;
}

void InjectionWatcher::Shutdown() {
  if (recorder_ != nullptr && recorder_->armed()) recorder_->Disable();
}

}  // namespace clusterprof::cupti
