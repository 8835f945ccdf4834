#include "sidecar/tracers/gpu_metrics.h"

#include <algorithm>
#include <array>
#include <memory>
#include <utility>

#include "common/base/check.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using tensorflow::profiler::XEventMetadata;
using tensorflow::profiler::XSpace;
using tensorflow::profiler::XStatMetadata;
using xspace::XEventBuilder;
using xspace::XLineBuilder;
using xspace::XPlaneBuilder;

constexpr std::string_view kWarningPrefix = "gpu metrics: ";
// Distinct warnings kept per capture; errors repeat with every sample, so more would only be
// noise (a device's queries times the devices is far less).
constexpr size_t kMaxWarnings = 64;

enum Metric : int {
  kGpuUtilization,
  kMemoryUtilization,
  kMemoryUsed,
  kPower,
  kSmClock,
  kNumMetrics,
};

constexpr std::array<std::string_view, kNumMetrics> kMetricNames = {
    kGpuUtilizationPercent, kMemoryUtilizationPercent, kMemoryUsedBytes, kPowerWatts, kSmClockMhz,
};

// The plane number of each device, by NVML index: the mapped CUDA ordinal, else the NVML index
// when no mapped device has it, else the lowest number nobody has.
std::vector<int> PlaneNumbers(const std::vector<std::string>& uuids,
                              const absl::flat_hash_map<std::string, int>& ordinal_by_uuid) {
  std::vector<int> numbers(uuids.size(), -1);
  absl::flat_hash_set<int> taken;
  for (size_t i = 0; i < uuids.size(); ++i) {
    if (uuids[i].empty()) continue;
    const auto it = ordinal_by_uuid.find(uuids[i]);
    // Two devices claiming one ordinal (a broken map): the second is treated as unmapped.
    if (it != ordinal_by_uuid.end() && it->second >= 0 && taken.insert(it->second).second) {
      numbers[i] = it->second;
    }
  }
  for (size_t i = 0; i < uuids.size(); ++i) {
    if (numbers[i] < 0 && taken.insert(static_cast<int>(i)).second) {
      numbers[i] = static_cast<int>(i);
    }
  }
  int next = 0;
  for (int& number : numbers) {
    if (number >= 0) continue;
    while (taken.contains(next)) ++next;
    number = next;
    taken.insert(next);
  }
  return numbers;
}

// Writes one device's samples to the counter line of its plane.
class CounterLineWriter {
 public:
  CounterLineWriter(XSpace* space, int plane_number, int64_t first_sample_ns)
      : plane_(xspace::FindOrAddMutablePlaneWithName(
            space, StrCat(xspace::kGpuPlanePrefix, plane_number))),
        line_(plane_.GetOrCreateLine(kUpstreamCounterLineId)),
        value_(plane_.GetOrCreateStatMetadata(xspace::kCounterValue)) {
    line_.SetNameIfEmpty(xspace::kUpstreamCounterLineName);
    // A new line starts at its first sample; an existing one keeps its origin.
    if (line_.proto()->events_size() == 0) line_.SetTimestampNs(first_sample_ns);
  }
  CounterLineWriter(const CounterLineWriter&) = delete;
  CounterLineWriter& operator=(const CounterLineWriter&) = delete;

  template <typename T>
  void Add(Metric metric, int64_t time_ns, T value) {
    if (event_metadata_[metric] == nullptr) {
      event_metadata_[metric] = plane_.GetOrCreateEventMetadata(kMetricNames[metric]);
      stat_metadata_[metric] = plane_.GetOrCreateStatMetadata(kMetricNames[metric]);
    }
    XEventBuilder event = line_.AddEvent(*event_metadata_[metric]);
    event.SetTimestampNs(time_ns);
    event.AddStatValue(*stat_metadata_[metric], value);
    // Our trace JSON reads a counter's value from `value`.
    event.AddStatValue(*value_, value);
  }

 private:
  XPlaneBuilder plane_;
  XLineBuilder line_;
  const XStatMetadata* value_;
  std::array<const XEventMetadata*, kNumMetrics> event_metadata_{};
  std::array<const XStatMetadata*, kNumMetrics> stat_metadata_{};
};

}  // namespace

GpuMetricsSampler::GpuMetricsSampler(NvmlApi& nvml, Clock& clock, Options options)
    : nvml_(nvml), clock_(clock), options_(options) {
  CLUSTERPROF_CHECK(options_.interval_ms > 0)
      << "GPU metrics interval must be positive, got " << options_.interval_ms << " ms";
}

GpuMetricsSampler::~GpuMetricsSampler() {
  MutexLock run_lock(&run_mu_);
  StopThread();
}

absl::Status GpuMetricsSampler::Prepare() {
  MutexLock sample_lock(&sample_mu_);
  return ListDevicesLocked();
}

absl::Status GpuMetricsSampler::Start(int64_t start_ns) {
  MutexLock run_lock(&run_mu_);
  CLUSTERPROF_CHECK(!thread_.joinable()) << "GPU metrics sampler started twice";
  {
    MutexLock sample_lock(&sample_mu_);
    CLUSTERPROF_RETURN_IF_ERROR(ListDevicesLocked());
  }
  {
    MutexLock lock(&mu_);
    samples_.clear();
    dropped_ = 0;
    warnings_.clear();
    warning_set_.clear();
    start_ns_ = start_ns;
    stop_ns_ = std::numeric_limits<int64_t>::max();
  }
  stop_.store(false, std::memory_order_release);
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void GpuMetricsSampler::Stop(int64_t stop_ns) {
  MutexLock run_lock(&run_mu_);
  StopThread();
  MutexLock lock(&mu_);
  stop_ns_ = stop_ns;
}

void GpuMetricsSampler::StopThread() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  clock_.Wake();
  thread_.join();
}

void GpuMetricsSampler::Run() {
  const int64_t interval_ns = options_.interval_ms * kNanosPerMilli;
  int64_t next_ns = clock_.MonotonicNs();
  while (!stop_.load(std::memory_order_acquire)) {
    SampleOnce();
    next_ns += interval_ns;
    // Behind schedule (a slow NVML call, a stalled machine): skip the missed samples rather than
    // take them in a burst.
    const int64_t now_ns = clock_.MonotonicNs();
    if (next_ns <= now_ns) next_ns += ((now_ns - next_ns) / interval_ns + 1) * interval_ns;
    if (!clock_.SleepUntilMonotonicNsUnless(next_ns, stop_)) break;
  }
}

absl::Status GpuMetricsSampler::ListDevicesLocked() {
  if (listed_) return absl::OkStatus();
  absl::StatusOr<int> count = nvml_.DeviceCount();
  if (!count.ok()) return Annotate(count.status(), "cannot list the GPUs through NVML");
  if (*count <= 0) {
    return absl::FailedPreconditionError(
        "NVML lists no GPU: the sidecar container sees none; with the NVIDIA container runtime "
        "set NVIDIA_VISIBLE_DEVICES in the sidecar container to the workload's GPUs (or \"all\")");
  }
  std::vector<Device> devices;
  std::vector<std::string> uuids;
  std::vector<std::string> errors;
  for (int index = 0; index < *count; ++index) {
    Device& device = devices.emplace_back();
    device.index = index;
    device.label = StrCat("NVML device ", index);
    absl::StatusOr<std::string> uuid = nvml_.DeviceUuid(index);
    if (uuid.ok()) {
      uuids.push_back(*uuid);
    } else {
      uuids.emplace_back();
      errors.push_back(StrCat(
          device.label,
          ": no UUID, so its counters may land on another GPU's plane: ", uuid.status().message()));
    }
    // The name only makes warnings easier to read; a device without one is still sampled.
    absl::StatusOr<std::string> name = nvml_.DeviceName(index);
    if (name.ok() || uuid.ok()) {
      StrAppend(&device.label, " (", name.ok() ? *name : "", name.ok() && uuid.ok() ? ", " : "",
                uuid.ok() ? *uuid : "", ")");
    }
  }
  devices_ = std::move(devices);
  listed_ = true;
  MutexLock lock(&mu_);
  uuids_ = std::move(uuids);
  for (std::string& error : errors) AddWarningLocked(std::move(error));
  return absl::OkStatus();
}

void GpuMetricsSampler::ReadDeviceLocked(Device& device, Sample* sample,
                                         std::vector<std::string>* errors) {
  // Records a failed query: "not supported" turns the query off for the device, anything else
  // becomes a warning and the query is tried again next time.
  auto failed = [&](Query query, std::string_view what, const absl::Status& status) {
    if (absl::IsUnimplemented(status)) {
      device.unsupported |= query;
    } else {
      errors->push_back(StrCat(device.label, ": reading ", what, ": ", status.message()));
    }
  };
  const int index = device.index;
  if (!(device.unsupported & kUtilizationQuery)) {
    absl::StatusOr<NvmlUtilization> utilization = nvml_.Utilization(index);
    if (utilization.ok()) {
      sample->gpu_percent = utilization->gpu_percent;
      sample->memory_percent = utilization->memory_percent;
      sample->present |= kUtilizationQuery;
    } else {
      failed(kUtilizationQuery, "utilization", utilization.status());
    }
  }
  if (!(device.unsupported & kMemoryQuery)) {
    absl::StatusOr<NvmlMemory> memory = nvml_.MemoryUsed(index);
    if (memory.ok()) {
      sample->memory_used_bytes = memory->used_bytes;
      sample->present |= kMemoryQuery;
    } else {
      failed(kMemoryQuery, "memory use", memory.status());
    }
  }
  if (!(device.unsupported & kPowerQuery)) {
    absl::StatusOr<uint32_t> power = nvml_.PowerUsageMilliwatts(index);
    if (power.ok()) {
      sample->power_milliwatts = *power;
      sample->present |= kPowerQuery;
    } else {
      failed(kPowerQuery, "power usage", power.status());
    }
  }
  if (!(device.unsupported & kClockQuery)) {
    absl::StatusOr<uint32_t> clock = nvml_.SmClockMhz(index);
    if (clock.ok()) {
      sample->sm_clock_mhz = *clock;
      sample->present |= kClockQuery;
    } else {
      failed(kClockQuery, "SM clock", clock.status());
    }
  }
}

void GpuMetricsSampler::SampleOnce() {
  MutexLock sample_lock(&sample_mu_);
  if (absl::Status status = ListDevicesLocked(); !status.ok()) {
    MutexLock lock(&mu_);
    AddWarningLocked(StrCat(status.message()));
    return;
  }
  std::vector<Sample> samples;
  samples.reserve(devices_.size());
  std::vector<std::string> errors;
  for (Device& device : devices_) {
    Sample sample;
    sample.time_ns = clock_.WallNs();
    sample.device = device.index;
    ReadDeviceLocked(device, &sample, &errors);
    if (sample.present != 0) samples.push_back(sample);
  }
  MutexLock lock(&mu_);
  for (const Sample& sample : samples) {
    if (samples_.size() < options_.max_samples) {
      samples_.push_back(sample);
    } else {
      ++dropped_;
    }
  }
  for (std::string& error : errors) AddWarningLocked(std::move(error));
}

void GpuMetricsSampler::AddWarningLocked(std::string message) {
  if (warnings_.size() >= kMaxWarnings || warning_set_.contains(message)) return;
  warning_set_.insert(message);
  warnings_.push_back(std::move(message));
}

size_t GpuMetricsSampler::sample_count() const {
  MutexLock lock(&mu_);
  return samples_.size();
}

GpuMetricsSampler::CollectResult GpuMetricsSampler::CollectInto(
    XSpace* space, const absl::flat_hash_map<std::string, int>& ordinal_by_uuid) {
  MutexLock lock(&mu_);
  CollectResult result;
  result.dropped_samples = dropped_;

  const std::vector<int> plane_numbers = PlaneNumbers(uuids_, ordinal_by_uuid);
  auto in_window = [this](const Sample& sample) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return sample.time_ns >= start_ns_ && sample.time_ns <= stop_ns_;
  };
  std::vector<int64_t> first_sample_ns(uuids_.size(), std::numeric_limits<int64_t>::max());
  for (const Sample& sample : samples_) {
    if (!in_window(sample)) continue;
    first_sample_ns[sample.device] = std::min(first_sample_ns[sample.device], sample.time_ns);
  }

  // By NVML index; made for devices with samples in the window only.
  std::vector<std::unique_ptr<CounterLineWriter>> writers(uuids_.size());
  for (const Sample& sample : samples_) {
    if (!in_window(sample)) continue;
    std::unique_ptr<CounterLineWriter>& writer = writers[sample.device];
    if (writer == nullptr) {
      writer = std::make_unique<CounterLineWriter>(space, plane_numbers[sample.device],
                                                   first_sample_ns[sample.device]);
    }
    const int64_t t = sample.time_ns;
    if (sample.present & kUtilizationQuery) {
      writer->Add(kGpuUtilization, t, static_cast<double>(sample.gpu_percent));
      writer->Add(kMemoryUtilization, t, static_cast<double>(sample.memory_percent));
      result.events += 2;
    }
    if (sample.present & kMemoryQuery) {
      writer->Add(kMemoryUsed, t, sample.memory_used_bytes);
      ++result.events;
    }
    if (sample.present & kPowerQuery) {
      writer->Add(kPower, t, sample.power_milliwatts / 1000.0);
      ++result.events;
    }
    if (sample.present & kClockQuery) {
      writer->Add(kSmClock, t, static_cast<uint64_t>(sample.sm_clock_mhz));
      ++result.events;
    }
  }

  std::vector<std::string> warnings;
  for (const std::string& warning : warnings_) warnings.push_back(StrCat(kWarningPrefix, warning));
  if (dropped_ > 0) {
    warnings.push_back(StrCat(kWarningPrefix, "dropped ", dropped_, " samples beyond the cap of ",
                              options_.max_samples,
                              " per capture; sample less often (a longer interval) or capture "
                              "for a shorter time"));
  }
  for (std::string& warning : warnings) {
    if (std::find(space->warnings().begin(), space->warnings().end(), warning) ==
        space->warnings().end()) {
      space->add_warnings(std::move(warning));
    }
  }
  return result;
}

}  // namespace clusterprof::sidecar
