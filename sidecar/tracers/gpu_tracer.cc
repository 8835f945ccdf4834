#include "sidecar/tracers/gpu_tracer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "common/base/check.h"
#include "common/base/strings.h"
#include "sidecar/tracers/gpu_xplane.h"
#include "sidecar/tracers/ring_reader.h"
#include "spdlog/spdlog.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using tensorflow::profiler::XSpace;

std::string ProcessLabel(const shm::GpuRingReader& reader) {
  return reader.process_name().empty() ? StrCat("pid ", reader.pid())
                                       : StrCat(reader.process_name(), " (pid ", reader.pid(), ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuTracer>> GpuTracer::Create(
    Options options, shm::ControlWriter* control, std::unique_ptr<GpuMetricsSampler> metrics) {
  CLUSTERPROF_CHECK(control != nullptr) << "the GPU tracer needs the control page";
  return std::unique_ptr<GpuTracer>(new GpuTracer(std::move(options), control, std::move(metrics)));
}

GpuTracer::GpuTracer(Options options, shm::ControlWriter* control,
                     std::unique_ptr<GpuMetricsSampler> metrics)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &SystemClock()),
      control_(control),
      metrics_(std::move(metrics)) {
  drainer_ = std::thread([this] { DrainLoop(); });
}

GpuTracer::~GpuTracer() {
  control_->DisarmDevice();
  {
    MutexLock lock(&mu_);
    draining_ = false;
    shutting_down_ = true;
  }
  drainer_.join();
}

TracerStatus GpuTracer::Status() const {
  absl::StatusOr<std::vector<std::string>> files =
      shm::ListRingFiles(options_.dir, shm::kGpuRingPrefix);
  if (!files.ok()) return {false, std::string(files.status().message())};
  return {true, StrCat(files->size(), " CUDA process(es) with GPU tracing in ", options_.dir,
                       metrics_ != nullptr ? "; GPU counters from NVML" : "")};
}

void GpuTracer::ArmLocked(const CaptureWindow& window) {
  ReleaseRingsLocked();
  window_ = window;
  stop_ns_ = window.planned_stop_ns;
  kept_ = 0;
  capped_ = 0;
  warnings_.clear();
  // Whatever the rings hold from before is not this capture's.
  RefreshRingsLocked();
  for (auto& [path, ring] : rings_) ring.reader->Skip();
  shm::ControlWriter::DeviceArming arming;
  arming.level = window.device_tracer_level;
  if (window.gpu_max_activity_events > 0) {
    arming.max_activity_events = window.gpu_max_activity_events;
  }
  if (window.gpu_max_api_events > 0) arming.max_api_events = window.gpu_max_api_events;
  arming.flags = (window.gpu_nvtx ? uint32_t{shm::kGpuFlagNvtx} : 0u) |
                 (window.gpu_runtime_api ? 0u : uint32_t{shm::kGpuFlagNoRuntimeApi}) |
                 (window.gpu_driver_api ? 0u : uint32_t{shm::kGpuFlagNoDriverApi});
  seq_ = control_->ArmDevice(arming);
  armed_ = true;
  // Drain while CUPTI records, from now on: records of the processes' first flushes already
  // come in before the start instant.
  draining_ = true;
}

absl::Status GpuTracer::Prepare(const CaptureWindow& window) {
  MutexLock lock(&mu_);
  CLUSTERPROF_CHECK(!armed_) << "GPU tracer prepared while capturing";
  ArmLocked(window);
  return absl::OkStatus();
}

absl::Status GpuTracer::Start(const CaptureWindow& window) {
  {
    MutexLock lock(&mu_);
    if (!armed_) ArmLocked(window);
    window_ = window;
    stop_ns_ = window.planned_stop_ns;
  }
  if (metrics_ != nullptr) {
    absl::Status started = metrics_->Start(window.start_ns);
    MutexLock lock(&mu_);
    metrics_started_ = started.ok();
    if (!started.ok()) warnings_.push_back(StrCat("gpu: no GPU counters: ", started.message()));
  }
  return absl::OkStatus();
}

absl::Status GpuTracer::Stop(int64_t stop_ns) {
  control_->DisarmDevice();
  MutexLock lock(&mu_);
  if (metrics_started_) metrics_->Stop(stop_ns);
  stop_ns_ = stop_ns;
  // Each process that armed for this capture flushes CUPTI and says so; wait for that, draining
  // meanwhile (a full ring would hold a flush up). A process that exited has nothing more.
  const int64_t deadline_ns = clock_->MonotonicNs() + options_.flush_timeout_ms * kNanosPerMilli;
  while (true) {
    // A process that saw the arming just before the disarm may create its ring only now.
    RefreshRingsLocked();
    DrainLocked();
    std::vector<const shm::GpuRingReader*> pending;
    for (auto& [path, ring] : rings_) {
      const shm::GpuRingStatus status = ring.reader->ReadStatus();
      if (status.armed_seq == seq_ && status.flushed_seq < seq_ &&
          shm::WriterAlive(path, options_.proc_root, ring.reader->pid(),
                           ring.reader->process_start_ticks())) {
        pending.push_back(ring.reader.get());
      }
    }
    if (pending.empty()) break;
    if (clock_->MonotonicNs() >= deadline_ns) {
      for (const shm::GpuRingReader* reader : pending) {
        warnings_.push_back(StrCat(
            "gpu: ", ProcessLabel(*reader), " did not hand over its last GPU records within ",
            options_.flush_timeout_ms, " ms of the stop; the end of its trace may be missing"));
      }
      break;
    }
    mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return shutting_down_; },
                         std::chrono::milliseconds(2));
  }
  draining_ = false;
  armed_ = false;
  return absl::OkStatus();
}

void GpuTracer::DrainLoop() {
  MutexLock lock(&mu_);
  while (true) {
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return draining_ || shutting_down_; });
    if (shutting_down_) return;
    timespec dir_mtime{};
    while (draining_ && !shutting_down_) {
      struct stat st;
      if (stat(options_.dir.c_str(), &st) == 0 &&
          (st.st_mtim.tv_sec != dir_mtime.tv_sec || st.st_mtim.tv_nsec != dir_mtime.tv_nsec)) {
        dir_mtime = st.st_mtim;
        RefreshRingsLocked();
      }
      DrainLocked();
      mu_.AwaitWithTimeout(
          [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !draining_ || shutting_down_; },
          std::chrono::milliseconds(options_.drain_interval_ms));
    }
  }
}

uint64_t GpuTracer::DrainOnce() {
  MutexLock lock(&mu_);
  return DrainLocked();
}

void GpuTracer::RefreshRingsLocked() {
  absl::StatusOr<std::vector<std::string>> files =
      shm::ListRingFiles(options_.dir, shm::kGpuRingPrefix);
  if (!files.ok()) return;
  for (const std::string& path : *files) {
    if (rings_.count(path) > 0) continue;
    absl::StatusOr<std::unique_ptr<shm::GpuRingReader>> reader = shm::GpuRingReader::Open(path);
    if (!reader.ok()) {
      const std::string message = StrCat("gpu: ", reader.status().message());
      if (std::find(warnings_.begin(), warnings_.end(), message) == warnings_.end()) {
        warnings_.push_back(message);
      }
      continue;
    }
    Ring& ring = rings_[path];
    ring.dropped_before = (*reader)->ReadStatus().ring_dropped;
    ring.reader = std::move(*reader);
  }
}

uint64_t GpuTracer::DrainLocked() {
  uint64_t total = 0;
  for (auto& [path, ring] : rings_) {
    Ring* r = &ring;
    total += r->reader->Drain(
        [this, r](std::span<const shm::GpuRecord> records) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          const uint64_t room = options_.max_records - std::min(kept_, options_.max_records);
          if (records.size() > room) {
            capped_ += records.size() - room;
            records = records.first(room);
          }
          r->records.Append(records);
          kept_ += records.size();
        });
  }
  return total;
}

void GpuTracer::ReleaseRingsLocked() {
  for (auto& [path, ring] : rings_) {
    shm::RemoveRingIfExited(options_.proc_root, path, ring.reader->pid(),
                            ring.reader->process_start_ticks(), "GPU ring");
  }
  rings_.clear();
}

absl::Status GpuTracer::CollectInto(XSpace* space, TracerStats* stats) {
  MutexLock lock(&mu_);
  GpuXPlaneConverter converter(space, window_.start_ns, stop_ns_);
  uint64_t dropped = capped_;
  bool any_armed = false;
  bool any_failed = false;
  for (auto& [path, ring] : rings_) {
    const shm::GpuRingReader& reader = *ring.reader;
    const shm::GpuRingStatus status = reader.ReadStatus();
    const std::string process = ProcessLabel(reader);
    if (status.state == shm::GpuState::kFailed) {
      space->add_warnings(StrCat("gpu: no GPU activity from ", process, ": ", status.error));
      any_failed = true;
      continue;
    }
    if (status.armed_seq != seq_) {
      // A process that never saw this capture's arming: CUDA started in it after the stop, or
      // it has been idle in a blocked state.
      continue;
    }
    any_armed = true;
    if (status.armed_wall_ns > window_.start_ns + 10 * 1'000'000) {
      space->add_warnings(StrCat("gpu: GPU tracing in ", process, " began ",
                                 (status.armed_wall_ns - window_.start_ns) / 1'000'000,
                                 " ms after the capture start (give the capture a longer delay)"));
    }
    const std::vector<shm::GpuDeviceInfo> devices = reader.Devices();
    converter.AddProcess(
        reader.pid(), reader.process_name(), devices,
        [&ring](const std::function<void(const shm::GpuRecord&)>& visit) {
          ring.records.ForEach(visit);
        },
        [&reader](uint32_t id) { return reader.String(id); });
    const uint64_t ring_dropped =
        status.ring_dropped - std::min(status.ring_dropped, ring.dropped_before);
    if (status.capped_activity > 0 || status.capped_api > 0) {
      space->add_warnings(StrCat(
          "gpu: ", process, " reached the capture's event caps: ", status.capped_activity,
          " GPU activity and ", status.capped_api,
          " API events were dropped (raise advanced_configuration gpu_max_activity_api_events / "
          "gpu_max_callback_api_events)"));
    }
    if (status.cupti_dropped > 0) {
      space->add_warnings(StrCat("gpu: CUPTI dropped ", status.cupti_dropped, " records of ",
                                 process, " (its activity buffers were full)"));
    }
    if (ring_dropped > 0) {
      space->add_warnings(StrCat("gpu: ", ring_dropped, " GPU records of ", process,
                                 " were dropped because its ring stayed full"));
    }
    if (status.dropped_strings > 0) {
      space->add_warnings(
          StrCat("gpu: the string table of ", process, " is full; some events have no name"));
    }
    dropped += status.capped_activity + status.capped_api + status.cupti_dropped + ring_dropped;
  }
  if (capped_ > 0) {
    space->add_warnings(StrCat("gpu: ", capped_,
                               " GPU records were dropped past the sidecar's "
                               "cap of ",
                               options_.max_records, " per capture"));
  }
  if (rings_.empty()) {
    space->add_warnings(StrCat(
        "gpu: no CUDA process in ", options_.dir,
        " has loaded libclusterprof_cupti, so there is no GPU activity: set "
        "CUDA_INJECTION64_PATH to libclusterprof_cupti.so and CLUSTERPROF_DIR in the workload's "
        "environment (docs/gpu.md)"));
  } else if (!any_armed && !any_failed) {
    space->add_warnings("gpu: no CUDA process was recording GPU activity during the capture");
  }
  for (const std::string& warning : warnings_) space->add_warnings(warning);

  uint64_t events = converter.stats().events;
  if (metrics_started_) {
    const GpuMetricsSampler::CollectResult counters =
        metrics_->CollectInto(space, converter.ordinal_by_uuid());
    events += counters.events;
    dropped += counters.dropped_samples;
    metrics_started_ = false;
  }
  stats->events += events;
  stats->dropped_events += dropped;
  ReleaseRingsLocked();
  return absl::OkStatus();
}

}  // namespace clusterprof::sidecar
