// Writes a synthetic run directory as a capture of a data-parallel training job leaves it: one
// <host>.xplane.pb per host and a clusterprof_run.json manifest with each host's clock offset,
// for measuring `clusterprof report` and `clusterprof convert --run` at scale
// (bench/report_scale.sh).
//
//   make_run --hosts 64 --events-per-host 1000000 --steps 200 --straggler 37 --out /tmp/run
//
// Every host starts a step together (on the reference clock), waits on its input, runs its ops
// (a host op, its cudaLaunchKernel and the kernel on the GPU's compute stream, per op), and
// enters an all-reduce that ends for everyone once the last host has entered, as in
// tests/analysis/synthetic_run.h. A data-loader thread prefetches the next batch meanwhile. The
// straggler's compute takes --straggler-scale times as long. Each host's clock is off the
// reference by up to +-5 ms, and its events carry that offset, as the manifest says. With
// --gpu-detail each launch is tied to its kernel (`_p` / `_c`, correlation_id) and the GPU has an
// NVML counter line (utilization, memory, power, SM clock every 10 ms), as the GPU tracer writes
// them: for measuring `convert --run --format perfetto` (bench/convert_rss.sh --run-hosts).
//
// Hosts are built and written one at a time (each on its own arena, freed before the next), so
// memory stays at one host's trace whatever the number of hosts. The output is deterministic
// for given options.
//
// With --digests, no trace is written: each host's digest (what its sidecar sends when a capture
// ends) is made directly from the same kind of job and handed to the report one host at a time,
// as the coordinator does, and the report's text, JSON and HTML go into --out
// (report.txt, clusterprof_report.json, clusterprof_report.html); the time of each phase goes to
// stderr. For the report over 10,000 hosts of 1,000 steps (bench/report_scale.sh --digests):
//
//   make_run --digests --hosts 10000 --steps 1000 --out /tmp/report
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "analysis/digest.h"
#include "analysis/report.h"
#include "analysis/report_html.h"
#include "common/base/json_writer.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/storage/local_storage.h"
#include "common/storage/logdir.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_io.h"
#include "google/protobuf/arena.h"

namespace clusterprof::bench {
namespace {

using ::tensorflow::profiler::XSpace;

struct RunOptions {
  int hosts = 64;
  int64_t events_per_host = 1'000'000;
  int steps = 200;
  int straggler = -1;  // -1: none
  double straggler_scale = 1.3;
  uint32_t seed = 1;
  std::string out;
  bool digests = false;
  // GPU detail as the GPU tracer records it: each launch tied to its kernel (`_p` / `_c` and
  // correlation_id stats) and an NVML counter line on the GPU (four counters every 10 ms, events
  // beyond --events-per-host).
  bool gpu_detail = false;
};

constexpr int64_t kNvmlPeriodNs = 10'000'000;

// Per step, outside the ops: the step marker, load_batch, the host's all-reduce annotation (main
// thread); prefetch_batch with kDecodesPerStep decode_image inside it (data-loader thread); the
// NCCL kernel (GPU).
constexpr int kDecodesPerStep = 2;
constexpr int64_t kFixedEventsPerStep = 4 + kDecodesPerStep + 1;
// Per op: the host op, its cudaLaunchKernel, the kernel.
constexpr int64_t kEventsPerOp = 3;

constexpr int64_t kT0Ns = 1'767'225'600'000'000'000;  // 2026-01-01 UTC
constexpr int64_t kInputNs = 4'000'000;
constexpr int64_t kComputeNs = 150'000'000;
constexpr int64_t kAllReduceNs = 20'000'000;
constexpr int64_t kStepGapNs = 200'000;
constexpr int64_t kPrefetchNs = 30'000'000;
constexpr double kJitter = 0.05;
constexpr int64_t kMaxClockOffsetNs = 5'000'000;

// Host ops of a transformer block's forward and backward pass, each with the kernel it launches.
// None matches the analysis' collective or input patterns.
struct Op {
  const char* host;
  const char* kernel;
};
constexpr Op kOps[] = {
    {"aten::layer_norm", "void at::native::vectorized_layer_norm_kernel<float, float>"},
    {"aten::linear", "ampere_sgemm_128x64_tn"},
    {"aten::matmul", "ampere_sgemm_64x64_nn"},
    {"aten::softmax", "void at::native::cunn_SoftMaxForward<4, float, float, float>"},
    {"aten::dropout",
     "void at::native::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4>"},
    {"aten::add_", "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor>"},
    {"aten::gelu", "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernel>"},
    {"aten::mul", "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor>"},
    {"aten::mm", "ampere_sgemm_128x128_nt"},
    {"aten::sum", "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>"},
    {"aten::native_layer_norm_backward", "void at::native::layer_norm_grad_input_kernel<float>"},
    {"aten::_softmax_backward_data", "void at::native::cunn_SoftMaxBackward<4, float, float>"},
    {"aten::gelu_backward", "void at::native::vectorized_elementwise_kernel<4, GeluBackward>"},
    {"aten::copy_", "void at::native::unrolled_elementwise_kernel<at::native::copy_kernel>"},
    {"Optimizer.step#AdamW.step", "void at::native::multi_tensor_apply_kernel<AdamFunctor>"},
    {"aten::zero_", "void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>"},
};
constexpr int kNumOps = sizeof(kOps) / sizeof(kOps[0]);

// The job's timeline on the reference clock, shared by all hosts: each step's start and end, and
// each host's input end and collective entry. Small (steps x hosts), computed once.
struct Timeline {
  std::vector<int64_t> step_start, step_end;
  std::vector<int64_t> input_end, entry;  // [step * hosts + host]
  std::vector<int64_t> clock_offset_ns;   // per host: its clock minus the reference
};

Timeline MakeTimeline(const RunOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> noise(1.0 - kJitter, 1.0 + kJitter);
  std::uniform_int_distribution<int64_t> offset(-kMaxClockOffsetNs, kMaxClockOffsetNs);
  const size_t hosts = static_cast<size_t>(options.hosts);
  Timeline t;
  for (size_t h = 0; h < hosts; ++h) t.clock_offset_ns.push_back(offset(rng));
  t.input_end.resize(static_cast<size_t>(options.steps) * hosts);
  t.entry.resize(t.input_end.size());
  int64_t start = kT0Ns + 1'000'000;
  for (int s = 0; s < options.steps; ++s) {
    int64_t last_entry = start;
    for (size_t h = 0; h < hosts; ++h) {
      const double scale = static_cast<int>(h) == options.straggler ? options.straggler_scale : 1.0;
      const size_t i = static_cast<size_t>(s) * hosts + h;
      t.input_end[i] = start + static_cast<int64_t>(static_cast<double>(kInputNs) * noise(rng));
      t.entry[i] = t.input_end[i] +
                   static_cast<int64_t>(static_cast<double>(kComputeNs) * scale * noise(rng));
      last_entry = std::max(last_entry, t.entry[i]);
    }
    const int64_t end =
        last_entry + static_cast<int64_t>(static_cast<double>(kAllReduceNs) * noise(rng));
    t.step_start.push_back(start);
    t.step_end.push_back(end);
    start = end + kStepGapNs;
  }
  return t;
}

std::string HostName(int index, int hosts) {
  std::string digits = StrCat(index);
  const size_t width = StrCat(std::max(hosts - 1, 0)).size();
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return StrCat("trainer-", digits);
}

// Builds host `h`'s trace into `space` (on an arena). Returns its number of events.
int64_t BuildHost(const RunOptions& options, const Timeline& t, int h, XSpace* space) {
  const size_t hosts = static_cast<size_t>(options.hosts);
  const int64_t off = t.clock_offset_ns[static_cast<size_t>(h)];
  std::minstd_rand rng(options.seed * 7919u + static_cast<uint32_t>(h) + 1u);
  std::uniform_real_distribution<double> noise(1.0 - kJitter, 1.0 + kJitter);

  space->add_hostnames(HostName(h, options.hosts));
  xspace::XPlaneBuilder cpu(
      xspace::FindOrAddMutablePlaneWithName(space, xspace::kHostThreadsPlaneName));
  xspace::XPlaneBuilder gpu(
      xspace::FindOrAddMutablePlaneWithName(space, StrCat(xspace::kGpuPlanePrefix, 0)));
  xspace::XLineBuilder main_thread = cpu.GetOrCreateLine(4101);
  main_thread.SetName("python3");
  xspace::XLineBuilder loader = cpu.GetOrCreateLine(4187);
  loader.SetName("pt_data_worker");
  xspace::XLineBuilder compute_stream = gpu.GetOrCreateLine(7);
  compute_stream.SetName("Stream #7(Compute)");
  xspace::XLineBuilder nccl_stream = gpu.GetOrCreateLine(13);
  nccl_stream.SetName("Stream #13(NCCL)");
  for (xspace::XLineBuilder* line : {&main_thread, &loader, &compute_stream, &nccl_stream}) {
    line->SetTimestampNs(kT0Ns + off);
  }

  const xspace::XEventMetadata& step_md = *cpu.GetOrCreateEventMetadata("train_step");
  const xspace::XStatMetadata& step_num = *cpu.GetOrCreateStatMetadata(xspace::kStepNum);
  const xspace::XEventMetadata& load_md = *cpu.GetOrCreateEventMetadata("load_batch");
  const xspace::XEventMetadata& allreduce_md = *cpu.GetOrCreateEventMetadata("ncclAllReduce");
  const xspace::XEventMetadata& launch_md = *cpu.GetOrCreateEventMetadata("cudaLaunchKernel");
  const xspace::XEventMetadata& prefetch_md = *cpu.GetOrCreateEventMetadata("prefetch_batch");
  const xspace::XEventMetadata& decode_md = *cpu.GetOrCreateEventMetadata("decode_image");
  const xspace::XEventMetadata& nccl_md =
      *gpu.GetOrCreateEventMetadata("ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  std::vector<const xspace::XEventMetadata*> host_op_md, kernel_md;
  for (const Op& op : kOps) {
    host_op_md.push_back(cpu.GetOrCreateEventMetadata(op.host));
    kernel_md.push_back(gpu.GetOrCreateEventMetadata(op.kernel));
  }

  const int64_t steps = options.steps;
  const int64_t op_events = options.events_per_host - steps * kFixedEventsPerStep;
  const int64_t ops = op_events / kEventsPerOp;
  const int64_t extra_decodes = op_events % kEventsPerOp;  // in step 0, so the total is exact
  main_thread.ReserveEvents(static_cast<int>(2 * ops + 3 * steps));
  compute_stream.ReserveEvents(static_cast<int>(ops));
  loader.ReserveEvents(static_cast<int>((1 + kDecodesPerStep) * steps + extra_decodes));
  nccl_stream.ReserveEvents(static_cast<int>(steps));

  const auto add = [](xspace::XLineBuilder& line, const xspace::XEventMetadata& md, int64_t start,
                      int64_t end) {
    xspace::XEventBuilder event = line.AddEvent(md);
    event.SetTimestampNs(start);
    event.SetEndTimestampNs(end);
    return event;
  };
  int64_t events = 0;
  int64_t op_index = 0;
  int64_t kernel_free = 0;  // the compute stream runs one kernel at a time
  for (int64_t s = 0; s < steps; ++s) {
    const size_t i = static_cast<size_t>(s) * hosts + static_cast<size_t>(h);
    const int64_t start = t.step_start[static_cast<size_t>(s)] + off;
    const int64_t end = t.step_end[static_cast<size_t>(s)] + off;
    const int64_t input_end = t.input_end[i] + off;
    const int64_t entry = t.entry[i] + off;

    add(main_thread, step_md, start, end).AddStatValue(step_num, int64_t{100} + s);
    add(main_thread, load_md, start, input_end);
    events += 2;
    // This step's share of the ops, spread evenly over its compute.
    const int64_t step_ops = ops / steps + (s < ops % steps ? 1 : 0);
    const double slice = static_cast<double>(entry - input_end) / static_cast<double>(step_ops);
    for (int64_t k = 0; k < step_ops; ++k, ++op_index) {
      const int which = static_cast<int>((op_index * 7 + op_index / 13) % kNumOps);
      const int64_t op_start = input_end + static_cast<int64_t>(slice * static_cast<double>(k));
      const int64_t op_end = input_end + static_cast<int64_t>(slice * static_cast<double>(k + 1)) -
                             std::min<int64_t>(1'000, static_cast<int64_t>(slice / 10));
      const int64_t launch_start = op_start + static_cast<int64_t>(slice * 0.3);
      const int64_t launch_end =
          launch_start + std::min<int64_t>(8'000, static_cast<int64_t>(slice * 0.2));
      add(main_thread, *host_op_md[static_cast<size_t>(which)], op_start, op_end);
      xspace::XEventBuilder launch = add(main_thread, launch_md, launch_start, launch_end);
      const int64_t kernel_start = std::max(launch_end + 5'000, kernel_free + 1'000);
      kernel_free = kernel_start + static_cast<int64_t>(slice * 0.8 * noise(rng));
      xspace::XEventBuilder kernel =
          add(compute_stream, *kernel_md[static_cast<size_t>(which)], kernel_start, kernel_free);
      if (options.gpu_detail) {
        const uint64_t correlation = static_cast<uint64_t>(op_index) + 1;
        launch.AddStatValue(*cpu.GetOrCreateStatMetadata(xspace::kProducerId), correlation);
        launch.AddStatValue(*cpu.GetOrCreateStatMetadata(xspace::kCorrelationId), correlation);
        kernel.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kConsumerId), correlation);
        kernel.AddStatValue(*gpu.GetOrCreateStatMetadata(xspace::kCorrelationId), correlation);
      }
      events += kEventsPerOp;
    }
    add(main_thread, allreduce_md, entry, end);
    add(nccl_stream, nccl_md, std::max(entry + 20'000, kernel_free + 1'000), end);
    events += 2;

    // The next batch, read while this one computes.
    const int64_t prefetch_start = input_end + 1'000'000;
    const int64_t prefetch_end =
        prefetch_start + static_cast<int64_t>(static_cast<double>(kPrefetchNs) * noise(rng));
    add(loader, prefetch_md, prefetch_start, prefetch_end);
    const int64_t decodes = kDecodesPerStep + (s == 0 ? extra_decodes : 0);
    const int64_t decode_ns = (prefetch_end - prefetch_start) / (decodes + 1);
    for (int64_t d = 0; d < decodes; ++d) {
      const int64_t decode_start = prefetch_start + decode_ns / 2 + d * decode_ns;
      add(loader, decode_md, decode_start, decode_start + decode_ns * 9 / 10);
    }
    events += 1 + decodes;
  }
  if (options.gpu_detail && steps > 0) {
    xspace::XLineBuilder counters = gpu.GetOrCreateLine(1000);
    counters.SetName(xspace::kCounterLineName);
    counters.SetTimestampNs(kT0Ns + off);
    const xspace::XStatMetadata& value = *gpu.GetOrCreateStatMetadata(xspace::kCounterValue);
    const xspace::XEventMetadata& util = *gpu.GetOrCreateEventMetadata("gpu_utilization_percent");
    const xspace::XEventMetadata& memory = *gpu.GetOrCreateEventMetadata("memory_used_bytes");
    const xspace::XEventMetadata& power = *gpu.GetOrCreateEventMetadata("power_watts");
    const xspace::XEventMetadata& clock = *gpu.GetOrCreateEventMetadata("sm_clock_mhz");
    int64_t sample = 0;
    for (int64_t ts = t.step_start.front() + off; ts < t.step_end.back() + off;
         ts += kNvmlPeriodNs, ++sample) {
      const auto at = [&](const xspace::XEventMetadata& md) {
        xspace::XEventBuilder event = counters.AddEvent(md);
        event.SetTimestampNs(ts);
        return event;
      };
      at(util).AddStatValue(value, 60.0 + 35.0 * noise(rng) * ((sample % 20) < 17 ? 1.0 : 0.1));
      at(memory).AddStatValue(value, int64_t{30'000'000'000} + (sample % 50) * 1'000'000);
      at(power).AddStatValue(value, 310.0 * noise(rng));
      at(clock).AddStatValue(value, int64_t{1'980});
      events += 4;
    }
  }
  return events;
}

absl::Status WriteRun(const RunOptions& options) {
  const Timeline timeline = MakeTimeline(options);
  // No fsync: this is benchmark input, and fsync of a GB would only slow its making.
  auto storage = storage::NewLocalStorage({.sync = false});
  google::protobuf::ArenaOptions arena_options;
  arena_options.start_block_size = 1 << 20;
  arena_options.max_block_size = 8 << 20;
  struct Written {
    std::string host;
    int64_t events;
    uint64_t bytes;
  };
  std::vector<Written> written;
  int64_t total_events = 0;
  uint64_t total_bytes = 0;
  for (int h = 0; h < options.hosts; ++h) {
    const std::string host = HostName(h, options.hosts);
    absl::StatusOr<std::string> stem = storage::HostFileStem(host);
    if (!stem.ok()) return stem.status();
    google::protobuf::Arena arena(arena_options);
    XSpace* space = google::protobuf::Arena::CreateMessage<XSpace>(&arena);
    const int64_t events = BuildHost(options, timeline, h, space);
    auto writer = storage->NewWriter(StrCat(options.out, "/", *stem, storage::kXPlaneSuffix));
    if (!writer.ok()) return writer.status();
    if (absl::Status status = xspace::WriteXSpace(*space, writer->get()); !status.ok()) {
      return status;
    }
    absl::StatusOr<storage::ObjectInfo> info = (*writer)->Commit();
    if (!info.ok()) return info.status();
    written.push_back({host, events, info->bytes});
    total_events += events;
    total_bytes += info->bytes;
    std::fprintf(stderr, "make_run: %s: %lld events, %llu bytes\n", host.c_str(),
                 static_cast<long long>(events), static_cast<unsigned long long>(info->bytes));
  }

  // The fields of the coordinator's manifest (coordinator/manifest.cc) that readers use.
  std::string manifest;
  JsonWriter json(&manifest);
  const std::string_view out = options.out;
  json.Open('{');
  json.Field("kind", std::string_view("clusterprof.io/v1alpha1/CaptureRun"));
  json.Field("run", out.substr(out.find_last_of('/') + 1));
  json.Field("t0_ns", kT0Ns);
  json.Key("summary");
  json.Open('{');
  json.Field("targets", static_cast<int64_t>(written.size()));
  json.Field("succeeded", static_cast<int64_t>(written.size()));
  json.Field("empty", int64_t{0});
  json.Field("failed", int64_t{0});
  json.Close('}');
  json.Key("targets");
  json.Open('[');
  for (size_t h = 0; h < written.size(); ++h) {
    json.Open('{');
    json.Field("address", StrCat("10.0.", h / 256, ".", h % 256, ":8466"));
    json.Field("host", written[h].host);
    json.Field("outcome", std::string_view("ok"));
    json.Field("clock_offset_ns", timeline.clock_offset_ns[h]);
    json.Field("events", written[h].events);
    json.Field("bytes", written[h].bytes);
    json.Close('}');
  }
  json.Close(']');
  json.Close('}');
  manifest.push_back('\n');
  auto writer = storage->NewWriter(StrCat(options.out, "/", storage::kManifestName));
  if (!writer.ok()) return writer.status();
  if (absl::Status status = (*writer)->Append(manifest); !status.ok()) return status;
  if (absl::StatusOr<storage::ObjectInfo> info = (*writer)->Commit(); !info.ok()) {
    return info.status();
  }
  std::printf("hosts=%d events=%lld bytes=%llu straggler=%s\n", options.hosts,
              static_cast<long long>(total_events), static_cast<unsigned long long>(total_bytes),
              options.straggler >= 0 ? HostName(options.straggler, options.hosts).c_str() : "none");
  return absl::OkStatus();
}

// --digests: per host and step, the time from the step's start to the host's collective entry
// (its input, then its compute), drawn from the host's own generator so that a host's steps can
// be drawn again without holding every host's (10,000 x 1,000 of them would be 80 MB).
struct HostSteps {
  std::vector<int64_t> input_ns, to_entry_ns;
};
HostSteps DrawHostSteps(const RunOptions& options, int h) {
  std::mt19937_64 rng(options.seed * 1'000'003ull + static_cast<uint64_t>(h));
  std::uniform_real_distribution<double> noise(1.0 - kJitter, 1.0 + kJitter);
  const double scale = h == options.straggler ? options.straggler_scale : 1.0;
  HostSteps out;
  for (int s = 0; s < options.steps; ++s) {
    const int64_t input = static_cast<int64_t>(static_cast<double>(kInputNs) * noise(rng));
    out.input_ns.push_back(input);
    out.to_entry_ns.push_back(
        input + static_cast<int64_t>(static_cast<double>(kComputeNs) * scale * noise(rng)));
  }
  return out;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  if (!file.flush()) return absl::UnavailableError(StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status ReportFromDigests(const RunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const size_t steps = static_cast<size_t>(options.steps);
  // The job's steps on the reference clock: each ends when the last host has entered the
  // all-reduce, and the all-reduce is done.
  std::vector<int64_t> last_entry(steps, 0);
  for (int h = 0; h < options.hosts; ++h) {
    const HostSteps drawn = DrawHostSteps(options, h);
    for (size_t s = 0; s < steps; ++s)
      last_entry[s] = std::max(last_entry[s], drawn.to_entry_ns[s]);
  }
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> noise(1.0 - kJitter, 1.0 + kJitter);
  std::uniform_int_distribution<int64_t> offset(-kMaxClockOffsetNs, kMaxClockOffsetNs);
  std::vector<int64_t> step_start(steps), step_end(steps);
  int64_t at = kT0Ns + 1'000'000;
  for (size_t s = 0; s < steps; ++s) {
    step_start[s] = at;
    step_end[s] =
        at + last_entry[s] + static_cast<int64_t>(static_cast<double>(kAllReduceNs) * noise(rng));
    at = step_end[s] + kStepGapNs;
  }

  analysis::RunReportBuilder builder(options.out, {});
  for (int h = 0; h < options.hosts; ++h) {
    const int64_t off = offset(rng);
    const HostSteps drawn = DrawHostSteps(options, h);
    analysis::HostDigest digest;
    digest.host = HostName(h, options.hosts);
    digest.step_source = "step_num stat";
    int64_t compute_total = 0;
    for (size_t s = 0; s < steps; ++s) {
      analysis::StepDigest step;
      step.step = 100 + static_cast<int64_t>(s);
      step.start_ns = step_start[s] + off;
      step.end_ns = step_end[s] + off;
      step.collective_entry_ns = step.start_ns + drawn.to_entry_ns[s];
      step.collective_ns = step.end_ns - step.collective_entry_ns;
      step.input_ns = drawn.input_ns[s];
      const int64_t compute = drawn.to_entry_ns[s] - drawn.input_ns[s];
      step.device_busy_ns = compute * 8 / 10;
      step.host_busy_ns = compute * 9 / 10;
      compute_total += compute;
      digest.steps.push_back(step);
    }
    // The top ops a sidecar keeps: each kernel and host op with its share of the compute.
    for (int k = 0; k < kNumOps; ++k) {
      const int64_t calls = static_cast<int64_t>(steps) * 4;
      digest.top_ops.push_back({kOps[k].kernel, true, calls, compute_total * 8 / 10 / kNumOps});
      digest.top_ops.push_back({kOps[k].host, false, calls, compute_total / 10 / kNumOps});
    }
    builder.Add(std::move(digest), off);
  }
  const double digested_s = SecondsSince(start);
  analysis::RunReport report = std::move(builder).Finish(/*offsets_known=*/true);
  const double verdict_s = SecondsSince(start);
  CLUSTERPROF_RETURN_IF_ERROR(
      WriteText(StrCat(options.out, "/report.txt"), analysis::FormatReportText(report)));
  {
    const std::string path = StrCat(options.out, "/", storage::kReportJsonName);
    std::ofstream json(path, std::ios::binary | std::ios::trunc);
    analysis::WriteReportJson(report, json);
    if (!json.flush()) return absl::UnavailableError(StrCat("cannot write ", path));
  }
  const double json_s = SecondsSince(start);
  CLUSTERPROF_RETURN_IF_ERROR(
      WriteText(StrCat(options.out, "/", storage::kReportHtmlName), analysis::ReportHtml(report)));
  const double html_s = SecondsSince(start);
  size_t packed = 0;
  for (const analysis::ReportHost& host : report.runs) packed += host.steps.bytes();
  std::fprintf(
      stderr,
      "make_run --digests: %d hosts x %d steps: digests made and packed %.2f s (%zu bytes "
      "of packed steps), verdict %.2f s, text and JSON %.2f s, HTML %.2f s; total %.2f s\n",
      options.hosts, options.steps, digested_s, packed, verdict_s - digested_s, json_s - verdict_s,
      html_s - json_s, html_s);
  std::printf("hosts=%d steps=%d straggler=%s\n", options.hosts, options.steps,
              options.straggler >= 0 ? HostName(options.straggler, options.hosts).c_str() : "none");
  return absl::OkStatus();
}

}  // namespace
}  // namespace clusterprof::bench

int main(int argc, char** argv) {
  using clusterprof::bench::kEventsPerOp;
  using clusterprof::bench::kFixedEventsPerStep;
  CLI::App app{"Writes a synthetic run directory: N hosts of a training job, one straggling"};
  clusterprof::bench::RunOptions options;
  app.add_option("--hosts", options.hosts, "Hosts")->check(CLI::Range(1, 100'000));
  app.add_option("--events-per-host", options.events_per_host, "Events in each host's trace")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--steps", options.steps, "Training steps")->check(CLI::Range(1, 10'000'000));
  CLI::Option* straggler =
      app.add_option("--straggler", options.straggler,
                     "Index of the host whose compute is slower (-1: none; default: hosts / 2)")
          ->check(CLI::Range(-1, 100'000));
  app.add_option("--straggler-scale", options.straggler_scale,
                 "How much longer the straggler's compute takes")
      ->check(CLI::Range(1.0, 100.0));
  app.add_option("--seed", options.seed, "Random seed");
  app.add_option("--out", options.out, "Run directory to write (created if absent)")->required();
  app.add_flag("--digests", options.digests,
               "Make the hosts' digests directly and write the report of them into --out "
               "(report.txt, clusterprof_report.json, clusterprof_report.html), no traces");
  app.add_flag("--gpu-detail", options.gpu_detail,
               "Tie each launch to its kernel (_p/_c, correlation_id) and add an NVML counter "
               "line on the GPU (4 counters every 10 ms, beyond --events-per-host)");
  CLI11_PARSE(app, argc, argv);
  if (straggler->count() == 0) options.straggler = options.hosts > 1 ? options.hosts / 2 : -1;
  if (options.straggler >= options.hosts) {
    std::fprintf(stderr, "make_run: --straggler %d is not a host index (0-%d)\n", options.straggler,
                 options.hosts - 1);
    return 2;
  }
  const int64_t minimum = options.steps * (kFixedEventsPerStep + kEventsPerOp);
  if (!options.digests && options.events_per_host < minimum) {
    std::fprintf(stderr,
                 "make_run: --events-per-host %lld is too few for %d steps (at least %lld: %lld "
                 "per step); give more events or fewer steps\n",
                 static_cast<long long>(options.events_per_host), options.steps,
                 static_cast<long long>(minimum),
                 static_cast<long long>(kFixedEventsPerStep + kEventsPerOp));
    return 2;
  }
  absl::StatusOr<clusterprof::storage::Logdir> out = clusterprof::storage::ParseLogdir(options.out);
  if (!out.ok() || out->kind != clusterprof::storage::Logdir::Kind::kLocal) {
    std::fprintf(stderr, "make_run: --out '%s' is not a local directory%s%s\n", options.out.c_str(),
                 out.ok() ? "" : ": ", out.ok() ? "" : std::string(out.status().message()).c_str());
    return 2;
  }
  options.out = out->uri;  // absolute, normalized, without a trailing slash
  if (options.digests) {
    std::error_code error;
    std::filesystem::create_directories(options.out, error);
    if (error) {
      std::fprintf(stderr, "make_run: cannot create %s: %s\n", options.out.c_str(),
                   error.message().c_str());
      return 1;
    }
  }
  if (absl::Status status = options.digests ? clusterprof::bench::ReportFromDigests(options)
                                            : clusterprof::bench::WriteRun(options);
      !status.ok()) {
    std::fprintf(stderr, "make_run: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
