#include "sidecar/tracers/gpu_xplane.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "common/base/saturating.h"
#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "sidecar/tracers/gpu_occupancy.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using tensorflow::profiler::XSpace;
using xspace::XEventBuilder;
using xspace::XLineBuilder;
using xspace::XPlaneBuilder;

// Synchronization lines get ids far above any stream id.
constexpr int64_t kSyncLineBase = int64_t{1} << 40;
constexpr uint32_t kInvalidId = 0xFFFFFFFFu;
constexpr uint64_t kGpuLaunchCategory = 9;  // upstream ContextType::kGpuLaunch
constexpr std::string_view kFlowStat = "flow";

// What a stream line has carried, for its name "Stream #<id>(<kinds>)".
enum StreamKinds : uint32_t {
  kKernelKind = 1,
  kMemcpyH2DKind = 2,
  kMemcpyD2HKind = 4,
  kMemcpyD2DKind = 8,
  kMemcpyP2PKind = 16,
  kMemcpyOtherKind = 32,
  kMemsetKind = 64,
};
constexpr std::pair<uint32_t, std::string_view> kKindNames[] = {
    {kKernelKind, "Kernel"},       {kMemcpyH2DKind, "MemcpyH2D"}, {kMemcpyD2HKind, "MemcpyD2H"},
    {kMemcpyD2DKind, "MemcpyD2D"}, {kMemcpyP2PKind, "MemcpyP2P"}, {kMemcpyOtherKind, "MemcpyOther"},
    {kMemsetKind, "Memset"},
};

std::pair<std::string_view, uint32_t> MemcpyName(uint8_t subkind) {
  switch (static_cast<shm::GpuCopyKind>(subkind)) {
    case shm::GpuCopyKind::kHtoD:
      return {"MemcpyH2D", kMemcpyH2DKind};
    case shm::GpuCopyKind::kDtoH:
      return {"MemcpyD2H", kMemcpyD2HKind};
    case shm::GpuCopyKind::kDtoD:
      return {"MemcpyD2D", kMemcpyD2DKind};
    case shm::GpuCopyKind::kPtoP:
      return {"MemcpyP2P", kMemcpyP2PKind};
    default:
      return {"MemcpyOther", kMemcpyOtherKind};
  }
}

// CUPTI's memory kinds, named as upstream names them.
std::string_view MemoryKindName(uint32_t kind) {
  static constexpr std::string_view kNames[] = {"unknown",       "pageable",      "pinned",
                                                "device",        "array",         "managed",
                                                "device_static", "managed_static"};
  return kind < std::size(kNames) ? kNames[kind] : "unknown";
}

std::string_view SyncName(uint8_t type) {
  switch (type) {
    case 1:
      return "Event synchronize";
    case 2:
      return "Stream wait event";
    case 3:
      return "Stream synchronize";
    case 4:
      return "Context synchronize";
    default:
      return "Synchronize";
  }
}

}  // namespace

void GpuClockMap::Add(uint64_t cupti_ns, int64_t wall_ns) {
  points_.emplace_back(cupti_ns, wall_ns);
}

int64_t GpuClockMap::ToWall(uint64_t cupti_ns) const {
  if (points_.empty()) return static_cast<int64_t>(cupti_ns);
  const auto& [c0, w0] = points_.front();
  const auto& [c1, w1] = points_.back();
  const double delta = static_cast<double>(cupti_ns) - static_cast<double>(c0);
  double rate = 1.0;
  // Drift is only measurable over a while; under a millisecond the pairs' own error dominates.
  if (c1 > c0 + 1'000'000) {
    rate = static_cast<double>(SaturatingSub(w1, w0)) / static_cast<double>(c1 - c0);
    if (rate < 0.999 || rate > 1.001) rate = 1.0;  // a stepped wall clock: keep the offset only
  }
  // Saturating: the pairs and timestamps come from the process's ring and may be anything.
  return SaturatingAdd(w0, SaturatingCast(delta * rate));
}

uint64_t EncodeGpuLaunchFlow(uint64_t flow_id, bool out) {
  const uint64_t direction = out ? 2 : 1;
  return direction | ((flow_id & ((uint64_t{1} << 56) - 1)) << 2) | (kGpuLaunchCategory << 58);
}

uint64_t GpuLaunchFlowId(uint32_t pid, uint32_t correlation_id) {
  return ((uint64_t{pid} & 0xFFFFFF) << 32) | correlation_id;
}

std::string DemangleKernelName(std::string_view name) {
  const std::string mangled(name);
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && demangled != nullptr ? std::string(demangled.get()) : mangled;
}

std::string FormatGpuUuid(const char (&uuid)[16]) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid);
  char text[64];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

GpuXPlaneConverter::GpuXPlaneConverter(XSpace* space, int64_t start_ns, int64_t stop_ns)
    : space_(space), start_ns_(start_ns), stop_ns_(stop_ns) {}

// The state of one process's conversion: its clock, which launches and which work are linked,
// its planes and lines; the converter's own state (lines owned across processes, devices
// described, counts) through `converter`.
class GpuXPlaneConverter::Process {
 public:
  Process(GpuXPlaneConverter& converter, uint32_t pid, std::string_view process_name,
          std::span<const shm::GpuDeviceInfo> devices,
          const std::function<std::string_view(uint32_t)>& strings)
      : converter_(converter),
        pid_(pid),
        process_name_(process_name),
        devices_(devices),
        strings_(strings) {}

  // First pass: the clock, which launches have work and which work has a launch, and the
  // device of each context (synchronization records name only the context). False when the
  // records cannot be placed in time (no clock record).
  bool Scan(const ForEachRecord& records) {
    records([&](const shm::GpuRecord& r) {
      switch (r.kind) {
        case shm::GpuRecordKind::kClock:
          clock_.Add(r.start, static_cast<int64_t>(r.end));
          break;
        case shm::GpuRecordKind::kKernel:
        case shm::GpuRecordKind::kMemcpy:
        case shm::GpuRecordKind::kMemset:
          device_correlations_.insert(r.correlation_id);
          device_of_context_.try_emplace(r.context_id, r.device_id);
          break;
        case shm::GpuRecordKind::kRuntimeApi:
        case shm::GpuRecordKind::kDriverApi:
          api_correlations_.insert(r.correlation_id);
          break;
        default:
          break;
      }
    });
    if (clock_.empty()) return false;
    host_ = std::make_unique<XPlaneBuilder>(
        xspace::FindOrAddMutablePlaneWithName(converter_.space_, xspace::kHostThreadsPlaneName));
    return true;
  }

  // Second pass: one record into its plane, when it lies wholly inside the capture (as
  // upstream).
  void Add(const shm::GpuRecord& r) {
    if (r.kind == shm::GpuRecordKind::kClock) return;
    const int64_t start = clock_.ToWall(r.start);
    const int64_t end = std::max(start, clock_.ToWall(r.end));
    if (start < converter_.start_ns_ || end > converter_.stop_ns_) {
      ++converter_.stats_.outside_window;
      return;
    }
    switch (r.kind) {
      case shm::GpuRecordKind::kKernel:
      case shm::GpuRecordKind::kMemcpy:
      case shm::GpuRecordKind::kMemset:
        AddDeviceActivity(r, start, end);
        break;
      case shm::GpuRecordKind::kSync:
        AddSync(r, start, end);
        break;
      case shm::GpuRecordKind::kRuntimeApi:
      case shm::GpuRecordKind::kDriverApi:
        AddApiCall(r, start, end);
        break;
      case shm::GpuRecordKind::kNvtxRange:
        AddNvtxRange(r, start, end);
        break;
      default:
        return;  // a kind from a newer library
    }
    ++converter_.stats_.events;
  }

  // Names each stream line after the kinds of work it holds: "Stream #7(Kernel,MemcpyH2D)".
  void NameStreamLines() {
    for (const auto& [key, kinds] : kinds_of_line_) {
      std::vector<std::string_view> names;
      for (const auto& [bit, name] : kKindNames) {
        if ((kinds & bit) != 0) names.push_back(name);
      }
      const int64_t stream = key.second & 0xFFFFFFFF;
      std::string line_name = StrCat("Stream #", stream, "(", names.front());
      for (size_t i = 1; i < names.size(); ++i) line_name += StrCat(",", names[i]);
      line_name += ")";
      DevicePlane(key.first).GetOrCreateLine(key.second).SetName(line_name);
    }
  }

 private:
  // What a kernel, copy or memset is called, its kind bit, and its details stat.
  struct Activity {
    std::string_view name;
    uint32_t kind = 0;
    std::string_view details_stat;
    std::string details;
  };

  Activity DescribeActivity(const shm::GpuRecord& r, int64_t start, int64_t end) {
    Activity out;
    if (r.kind == shm::GpuRecordKind::kKernel) {
      out.name = KernelName(r.name_id);
      out.kind = kKernelKind;
      out.details_stat = xspace::kKernelDetails;
      out.details =
          StrCat("regs:", r.kernel.registers, " static_shared:", r.kernel.static_shared,
                 " dynamic_shared:", r.kernel.dynamic_shared, " grid:", r.kernel.grid[0], ",",
                 r.kernel.grid[1], ",", r.kernel.grid[2], " block:", r.kernel.block[0], ",",
                 r.kernel.block[1], ",", r.kernel.block[2]);
      // Theoretical occupancy, as XProf's kernel stats read it (docs/gpu.md).
      auto device = std::find_if(devices_.begin(), devices_.end(),
                                 [&r](const auto& d) { return d.ordinal == r.device_id; });
      if (device != devices_.end()) {
        const KernelShape shape{
            .block_threads = uint32_t{r.kernel.block[0]} * r.kernel.block[1] * r.kernel.block[2],
            .registers = r.kernel.registers,
            .static_shared = static_cast<uint32_t>(std::max(0, r.kernel.static_shared)),
            .dynamic_shared = static_cast<uint32_t>(std::max(0, r.kernel.dynamic_shared))};
        if (std::optional<double> pct = OccupancyPercent(*device, shape)) {
          char text[16];
          std::snprintf(text, sizeof(text), "%.1f", *pct);
          StrAppend(&out.details, " occ_pct:", text);
        }
      }
    } else if (r.kind == shm::GpuRecordKind::kMemcpy) {
      std::tie(out.name, out.kind) = MemcpyName(r.subkind);
      out.details_stat = xspace::kMemcpyDetails;
      const double seconds = static_cast<double>(end - start) / 1e9;
      char bandwidth[32];
      std::snprintf(bandwidth, sizeof(bandwidth), "%.3f",
                    seconds > 0 ? static_cast<double>(r.memcpy.bytes) / seconds / 1e9 : 0.0);
      // uint64_t{...}: copies of the packed 8-byte fields, which are only 4-byte aligned (a
      // reference to one, as StrCat takes, is undefined behavior).
      out.details = StrCat("kind_src:", MemoryKindName(r.memcpy.src_kind),
                           " kind_dst:", MemoryKindName(r.memcpy.dst_kind),
                           " size:", uint64_t{r.memcpy.bytes}, " dest:", r.memcpy.dst_device,
                           " async:", r.memcpy.async ? 1 : 0, " bandwidth_gbps:", bandwidth);
    } else {
      out.name = "Memset";
      out.kind = kMemsetKind;
      out.details_stat = xspace::kMemsetDetails;
      out.details =
          StrCat("kind:", MemoryKindName(r.memset.memory_kind),
                 " num_bytes:", uint64_t{r.memset.bytes}, " async:", r.memset.async ? 1 : 0);
    }
    return out;
  }

  void AddDeviceActivity(const shm::GpuRecord& r, int64_t start, int64_t end) {
    auto [line, key] = DeviceLine(r.device_id, r.stream_id);
    XPlaneBuilder& plane = DevicePlane(r.device_id);
    const Activity activity = DescribeActivity(r, start, end);
    kinds_of_line_[key] |= activity.kind;
    XEventBuilder event = line.AddEvent(*plane.GetOrCreateEventMetadata(activity.name));
    event.SetTimestampNs(start);
    event.SetDurationNs(end - start);
    AddLaunchLink(plane, event, r, /*launch_side=*/false);
    event.AddStatValue(*plane.GetOrCreateStatMetadata(xspace::kContextId),
                       StrCat("$$", r.context_id));
    if (r.kind == shm::GpuRecordKind::kKernel) {
      // Kernels repeat their launch shapes: intern the text.
      event.AddStatValue(*plane.GetOrCreateStatMetadata(activity.details_stat),
                         *plane.GetOrCreateStatMetadata(activity.details));
    } else {
      event.AddStatValue(*plane.GetOrCreateStatMetadata(activity.details_stat), activity.details);
    }
  }

  void AddSync(const shm::GpuRecord& r, int64_t start, int64_t end) {
    auto device = device_of_context_.find(r.context_id);
    const int ordinal = device != device_of_context_.end() ? device->second : 0;
    const bool stream_sync = r.stream_id != kInvalidId;
    auto [line, key] =
        DeviceLine(ordinal, kSyncLineBase + (stream_sync ? r.stream_id : kInvalidId));
    line.SetNameIfEmpty(stream_sync ? StrCat("Stream #", r.stream_id, " synchronization")
                                    : std::string("Synchronization"));
    XPlaneBuilder& plane = DevicePlane(ordinal);
    XEventBuilder event = line.AddEvent(*plane.GetOrCreateEventMetadata(SyncName(r.subkind)));
    event.SetTimestampNs(start);
    event.SetDurationNs(end - start);
    event.AddStatValue(*plane.GetOrCreateStatMetadata(xspace::kCorrelationId),
                       uint64_t{r.correlation_id});
    event.AddStatValue(*plane.GetOrCreateStatMetadata(xspace::kContextId),
                       StrCat("$$", r.context_id));
  }

  void AddApiCall(const shm::GpuRecord& r, int64_t start, int64_t end) {
    XLineBuilder line = ThreadLine(*host_, r.stream_id, "");
    std::string_view name = strings_(r.name_id);
    if (name.empty()) name = "(CUDA call)";
    XEventBuilder event = line.AddEvent(*host_->GetOrCreateEventMetadata(name));
    event.SetTimestampNs(start);
    event.SetDurationNs(end - start);
    AddLaunchLink(*host_, event, r, /*launch_side=*/true);
  }

  void AddNvtxRange(const shm::GpuRecord& r, int64_t start, int64_t end) {
    if (nvtx_ == nullptr) {
      nvtx_ = std::make_unique<XPlaneBuilder>(
          xspace::FindOrAddMutablePlaneWithName(converter_.space_, xspace::kNvtxPlaneName));
    }
    XLineBuilder line = ThreadLine(*nvtx_, r.stream_id, " NVTX");
    std::string_view name = strings_(r.name_id);
    if (name.empty()) name = "(unnamed range)";
    XEventBuilder event = line.AddEvent(*nvtx_->GetOrCreateEventMetadata(name));
    event.SetTimestampNs(start);
    event.SetDurationNs(end - start);
    if (const std::string_view domain = strings_(r.nvtx.domain_id); !domain.empty()) {
      event.AddStatValue(*nvtx_->GetOrCreateStatMetadata("domain"), domain);
    }
  }

  // The correlation id, and a flow between a launch and its work when both were recorded.
  void AddLaunchLink(XPlaneBuilder& plane, XEventBuilder& event, const shm::GpuRecord& r,
                     bool launch_side) {
    event.AddStatValue(*plane.GetOrCreateStatMetadata(xspace::kCorrelationId),
                       uint64_t{r.correlation_id});
    const bool linked = launch_side ? device_correlations_.contains(r.correlation_id)
                                    : api_correlations_.contains(r.correlation_id);
    if (linked) {
      event.AddStatValue(*plane.GetOrCreateStatMetadata(kFlowStat),
                         EncodeGpuLaunchFlow(GpuLaunchFlowId(pid_, r.correlation_id), launch_side));
    }
  }

  XPlaneBuilder& DevicePlane(int ordinal) {
    std::unique_ptr<XPlaneBuilder>& plane = device_planes_[ordinal];
    if (plane != nullptr) return *plane;
    plane = std::make_unique<XPlaneBuilder>(xspace::FindOrAddMutablePlaneWithName(
        converter_.space_, StrCat(xspace::kGpuPlanePrefix, ordinal)));
    DescribeDevice(ordinal, *plane);
    return *plane;
  }

  // The device's capabilities on its plane, once per converter.
  void DescribeDevice(int ordinal, XPlaneBuilder& p) {
    auto it = std::find_if(devices_.begin(), devices_.end(), [ordinal](const auto& d) {
      return static_cast<int>(d.ordinal) == ordinal;
    });
    if (it == devices_.end() || converter_.device_described_[ordinal]) return;
    converter_.device_described_[ordinal] = true;
    p.AddStatValue(*p.GetOrCreateStatMetadata(xspace::kDevVendor), xspace::kDeviceVendorNvidia);
    p.AddStatValue(*p.GetOrCreateStatMetadata(xspace::kGpuDeviceName),
                   std::string_view(it->name, strnlen(it->name, sizeof(it->name))));
    p.AddStatValue(*p.GetOrCreateStatMetadata(xspace::kDevCapClockRateKHz), it->clock_rate_khz);
    p.AddStatValue(*p.GetOrCreateStatMetadata(xspace::kDevCapCoreCount), uint64_t{it->core_count});
    p.AddStatValue(*p.GetOrCreateStatMetadata(xspace::kDevCapMemoryBandwidth),
                   it->memory_bandwidth);
    p.AddStatValue(*p.GetOrCreateStatMetadata(xspace::kDevCapMemorySize), it->memory_size);
    p.AddStatValue(*p.GetOrCreateStatMetadata(xspace::kDevCapComputeCapMajor),
                   int64_t{it->compute_cap_major});
    p.AddStatValue(*p.GetOrCreateStatMetadata(xspace::kDevCapComputeCapMinor),
                   int64_t{it->compute_cap_minor});
    const char zero[16] = {};
    if (std::memcmp(it->uuid, zero, sizeof(zero)) != 0) {
      converter_.ordinal_by_uuid_.try_emplace(FormatGpuUuid(it->uuid), ordinal);
    }
  }

  // A device line of this process. A (device, id) another process already has (or this one, for
  // another of its streams) gets an id of its own: processes in two PID namespaces may share a
  // pid, so ownership is per process converted, not per pid.
  std::pair<XLineBuilder, std::pair<int, int64_t>> DeviceLine(int ordinal, int64_t id) {
    auto [chosen, first_use] = line_ids_.try_emplace({ordinal, id}, id);
    if (first_use && !converter_.device_lines_.insert({ordinal, id}).second) {
      // Unsigned: the pid comes from the ring file and may be anything.
      uint64_t other = (uint64_t{pid_} << 32) | (static_cast<uint64_t>(id) & 0xFFFFFFFF);
      while (!converter_.device_lines_.insert({ordinal, static_cast<int64_t>(other)}).second) {
        ++other;
      }
      chosen->second = static_cast<int64_t>(other);
    }
    id = chosen->second;
    XLineBuilder line = DevicePlane(ordinal).GetOrCreateLine(id);
    if (line.proto()->events_size() == 0 && line.proto()->timestamp_ns() == 0) {
      line.SetTimestampNs(converter_.start_ns_);
    }
    return {line, {ordinal, id}};
  }

  XLineBuilder ThreadLine(XPlaneBuilder& plane, uint32_t tid, std::string_view suffix) {
    XLineBuilder line = plane.GetOrCreateLine(tid);
    if (line.proto()->name().empty()) {
      line.SetName(tid == pid_ ? StrCat(process_name_, suffix)
                               : StrCat(process_name_, "/", tid, suffix));
    }
    if (line.proto()->events_size() == 0 && line.proto()->timestamp_ns() == 0) {
      line.SetTimestampNs(converter_.start_ns_);
    }
    return line;
  }

  const std::string& KernelName(uint32_t id) {
    auto [it, inserted] = kernel_names_.try_emplace(id);
    if (inserted) {
      const std::string_view mangled = strings_(id);
      it->second = mangled.empty() ? "(unnamed kernel)" : DemangleKernelName(mangled);
    }
    return it->second;
  }

  GpuXPlaneConverter& converter_;
  const uint32_t pid_;
  const std::string_view process_name_;
  const std::span<const shm::GpuDeviceInfo> devices_;
  const std::function<std::string_view(uint32_t)>& strings_;
  GpuClockMap clock_;
  absl::flat_hash_set<uint32_t> device_correlations_;
  absl::flat_hash_set<uint32_t> api_correlations_;
  absl::flat_hash_map<uint32_t, int> device_of_context_;
  std::map<int, std::unique_ptr<XPlaneBuilder>> device_planes_;
  std::unique_ptr<XPlaneBuilder> host_;  // set by Scan
  std::unique_ptr<XPlaneBuilder> nvtx_;
  std::map<std::pair<int, int64_t>, uint32_t> kinds_of_line_;
  absl::flat_hash_map<uint32_t, std::string> kernel_names_;
  // (device, stream or synchronization line id) -> the id of this process's line for it.
  std::map<std::pair<int, int64_t>, int64_t> line_ids_;
};

void GpuXPlaneConverter::AddProcess(uint32_t pid, std::string_view process_name,
                                    std::span<const shm::GpuDeviceInfo> devices,
                                    const ForEachRecord& records,
                                    const std::function<std::string_view(uint32_t)>& strings) {
  Process process(*this, pid, process_name, devices, strings);
  if (!process.Scan(records)) return;  // nothing to place the records in time with
  records([&process](const shm::GpuRecord& r) { process.Add(r); });
  process.NameStreamLines();
}

}  // namespace clusterprof::sidecar
