#include "coordinator/step_watcher.h"

#include <algorithm>
#include <thread>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/grpc_status.h"
#include "common/base/strings.h"
#include "common/base/token_file.h"
#include "grpcpp/grpcpp.h"

namespace clusterprof::coordinator {

// One sidecar: its channel, the thread that follows it, and what is known of it (guarded by the
// watcher's mutex).
struct StepWatcher::Stream {
  WatchedSidecar state;
  std::unique_ptr<v1alpha1::Sidecar::Stub> stub;  // the stream thread's
  std::thread thread;
  // Set (under the watcher's mutex) to end the thread; `context` is the open stream's, to cancel.
  bool stop = false;
  grpc::ClientContext* context = nullptr;
};

// A sidecar's clock against ours, from the probe with the smallest round trip.
struct ClockProbe {
  int64_t offset_ns = 0;
  int64_t rtt_ns = INT64_MAX;
  std::string error;  // the first probe that failed; empty when all answered
};

namespace {

constexpr int kClockProbes = 3;
constexpr int64_t kProbeTimeoutMs = 2'000;

void AddToken(const std::string& token, grpc::ClientContext* context) {
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
}

ClockProbe ProbeClock(v1alpha1::Sidecar::Stub& stub, const std::string& token, Clock& clock) {
  ClockProbe probe;
  for (int i = 0; i < kClockProbes; ++i) {
    grpc::ClientContext context;
    AddToken(token, &context);
    context.set_deadline(GrpcTimeout(kProbeTimeoutMs * kNanosPerMilli));
    v1alpha1::GetInfoResponse info;
    const int64_t sent = clock.WallNs();
    const grpc::Status status = stub.GetInfo(&context, v1alpha1::GetInfoRequest(), &info);
    const int64_t received = clock.WallNs();
    if (!status.ok()) {
      probe.error = FromGrpcStatus(status).ToString();
      return probe;
    }
    if (received - sent < probe.rtt_ns) {
      probe.rtt_ns = received - sent;
      probe.offset_ns = info.wall_time_ns() - (sent + (received - sent) / 2);
    }
  }
  return probe;
}

// One WatchSteps message into what is known of its sidecar: its figures, and its steps merged
// by number (a reconnect re-sends history that may overlap), the newest `max_steps` kept.
void ApplyMessage(const v1alpha1::WatchStepsResponse& message, int64_t now_ns, int64_t max_steps,
                  WatchedSidecar& s) {
  s.connected = true;
  s.error.clear();
  s.last_message_ns = now_ns;
  s.host_name = message.host_name();
  s.steps_total = message.steps_total();
  s.last_step_end_ns = message.last_step_end_ns();
  s.processes = message.processes();
  s.processes_with_steps = message.processes_with_steps();
  s.step_source = message.step_source();
  s.recorder_level = message.recorder_level();
  s.recorder_window_ms = message.recorder_window_ms();
  s.recorder_covered_since_ns = message.recorder_covered_since_ns();
  for (const v1alpha1::LiveStep& step : message.steps()) {
    analysis::StepDigest digest;
    digest.step = step.step();
    digest.start_ns = step.start_ns();
    digest.end_ns = step.end_ns();
    digest.collective_entry_ns = step.collective_entry_ns();
    // Usually after the last one.
    auto it = std::lower_bound(
        s.steps.begin(), s.steps.end(), digest.step,
        [](const analysis::StepDigest& a, int64_t number) { return a.step < number; });
    if (it != s.steps.end() && it->step == digest.step) {
      *it = digest;
    } else {
      s.steps.insert(it, digest);
    }
  }
  if (s.steps.size() > static_cast<size_t>(max_steps)) {
    s.steps.erase(s.steps.begin(), s.steps.end() - static_cast<std::ptrdiff_t>(max_steps));
  }
}

}  // namespace

StepWatcher::StepWatcher(Options options) : options_(std::move(options)) {}

StepWatcher::~StepWatcher() { SetTargets({}); }

void StepWatcher::SetTargets(const std::vector<std::string>& addresses) {
  std::vector<std::unique_ptr<Stream>> ended;
  {
    MutexLock lock(&mu_);
    for (auto it = streams_.begin(); it != streams_.end();) {
      if (std::find(addresses.begin(), addresses.end(), it->first) != addresses.end()) {
        ++it;
        continue;
      }
      it->second->stop = true;
      if (it->second->context != nullptr) it->second->context->TryCancel();
      ended.push_back(std::move(it->second));
      it = streams_.erase(it);
    }
    for (const std::string& address : addresses) {
      if (streams_.count(address) > 0) continue;
      auto stream = std::make_unique<Stream>();
      stream->state.address = address;
      Stream* raw = stream.get();
      streams_.emplace(address, std::move(stream));
      raw->thread = std::thread([this, raw] { Run(raw); });
    }
    ++updates_;
  }
  for (std::unique_ptr<Stream>& stream : ended) stream->thread.join();
}

std::vector<WatchedSidecar> StepWatcher::Snapshot() const {
  MutexLock lock(&mu_);
  std::vector<WatchedSidecar> out;
  out.reserve(streams_.size());
  for (const auto& [address, stream] : streams_) out.push_back(stream->state);
  return out;
}

uint64_t StepWatcher::updates() const {
  MutexLock lock(&mu_);
  return updates_;
}

uint64_t StepWatcher::WaitForUpdate(uint64_t seen, absl::Duration timeout) const {
  MutexLock lock(&mu_);
  mu_.AwaitWithTimeout([this, seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return updates_ != seen; },
                       absl::ToChronoNanoseconds(timeout));
  return updates_;
}

void StepWatcher::Run(Stream* stream) {
  Clock& clock = options_.clock != nullptr ? *options_.clock : SystemClock();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  const std::shared_ptr<const tls::ChannelSecurity> security =
      options_.security != nullptr ? options_.security : tls::ChannelSecurity::Insecure();
  security->ConfigureArgs(&args);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(stream->state.address, security->credentials(), args);
  stream->stub = v1alpha1::Sidecar::NewStub(channel);
  int64_t backoff_ms = options_.reconnect_min_ms;
  std::string last_token;
  while (true) {
    std::string token = options_.auth_token;
    if (!options_.auth_token_file.empty()) {
      // A file that cannot be read now (being rewritten) keeps the token last read.
      if (absl::StatusOr<std::string> read = ReadTokenFile(options_.auth_token_file); read.ok()) {
        last_token = *std::move(read);
      }
      token = last_token;
    }
    const ClockProbe probe = ProbeClock(*stream->stub, token, clock);
    bool opened = false;
    if (probe.error.empty()) {
      const std::optional<bool> followed = Follow(stream, token, probe, clock);
      if (!followed.has_value()) return;
      opened = *followed;
    } else {
      MutexLock lock(&mu_);
      if (stream->stop) return;
      stream->state.connected = false;
      stream->state.error = probe.error;
      ++updates_;
    }
    // A stream that delivered starts the backoff over; one that never opened doubles it.
    backoff_ms =
        opened ? options_.reconnect_min_ms : std::min(backoff_ms * 2, options_.reconnect_max_ms);
    MutexLock lock(&mu_);
    mu_.AwaitWithTimeout([stream]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stream->stop; },
                         std::chrono::milliseconds(backoff_ms));
    if (stream->stop) return;
  }
}

std::optional<bool> StepWatcher::Follow(Stream* stream, const std::string& token,
                                        const ClockProbe& probe, Clock& clock) {
  grpc::ClientContext context;
  AddToken(token, &context);
  {
    MutexLock lock(&mu_);
    if (stream->stop) return std::nullopt;
    stream->context = &context;
    stream->state.clock_offset_ns = probe.offset_ns;
    stream->state.clock_uncertainty_ns = probe.rtt_ns / 2;
  }
  v1alpha1::WatchStepsRequest request;
  request.set_history(options_.history);
  std::unique_ptr<grpc::ClientReader<v1alpha1::WatchStepsResponse>> reader =
      stream->stub->WatchSteps(&context, request);
  v1alpha1::WatchStepsResponse message;
  bool opened = false;
  while (reader->Read(&message)) {
    opened = true;
    MutexLock lock(&mu_);
    ApplyMessage(message, clock.WallNs(), options_.max_steps, stream->state);
    ++updates_;
  }
  const grpc::Status status = reader->Finish();
  MutexLock lock(&mu_);
  stream->context = nullptr;
  if (stream->stop) return std::nullopt;
  stream->state.connected = false;
  stream->state.error =
      status.ok() ? "the sidecar ended the stream" : FromGrpcStatus(status).ToString();
  ++updates_;
  return opened;
}

}  // namespace clusterprof::coordinator
