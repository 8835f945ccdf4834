#include "sidecar/tracers/framework_tracer.h"

#include <unistd.h>

#include <filesystem>

#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/xspace/merge.h"
#include "common/xspace/xspace_io.h"
#include "proto/profile_options.h"
#include "tsl/profiler/protos/profiler_service.pb.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using tensorflow::profiler::XSpace;

// What a framework server knows this capture by (it names the run directory of older servers).
constexpr char kFrameworkHost[] = "framework";
constexpr std::string_view kOwnKeyPrefix = "clusterprof_";

}  // namespace

absl::StatusOr<std::unique_ptr<FrameworkTracer>> FrameworkTracer::Create(Options options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("--framework-profiler needs host:port");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.work_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(StrCat(
        "cannot create ", options.work_dir, " for the framework profiler's files: ", ec.message(),
        " (give another --spool-dir)"));
  }
  return std::unique_ptr<FrameworkTracer>(new FrameworkTracer(std::move(options)));
}

FrameworkTracer::FrameworkTracer(Options options)
    : options_(std::move(options)),
      client_(options_.client != nullptr ? options_.client
                                         : MakeGrpcFrameworkClient(options_.address)) {}

FrameworkTracer::~FrameworkTracer() {
  {
    MutexLock lock(&mu_);
    if (launched_ && !done_) client_->Cancel();
  }
  JoinCall();
}

TracerStatus FrameworkTracer::Status() const {
  return {true, StrCat("forwards captures to the TF/JAX profiler at ", options_.address)};
}

absl::Status FrameworkTracer::Prepare(const CaptureWindow& window, const CaptureConfig& config) {
  if (window.start_ns > 0) Launch(window, config);
  return absl::OkStatus();
}

absl::Status FrameworkTracer::Start(const CaptureWindow& window, const CaptureConfig& config) {
  Launch(window, config);
  return absl::OkStatus();
}

void FrameworkTracer::Launch(const CaptureWindow& window, const CaptureConfig& config) {
  {
    MutexLock lock(&mu_);
    window_ = window;
    if (launched_) return;
  }
  // The call of a capture that was never collected has ended, or ends at its deadline.
  JoinCall();
  MutexLock lock(&mu_);
  LaunchLocked(window, config);
}

void FrameworkTracer::LaunchLocked(const CaptureWindow& window, const CaptureConfig& config) {
  ++captures_;
  session_id_ = StrCat("clusterprof_", getpid(), "_", captures_);
  repository_root_ = options_.work_dir;
  const int64_t duration_ms =
      std::max<int64_t>(1, (window.planned_stop_ns - window.start_ns) / 1'000'000);
  tensorflow::ProfileRequest request;
  tensorflow::ProfileOptions* opts = request.mutable_opts();
  *opts = config.options;
  // Our own keys mean nothing to the framework (and its GPU options parser refuses keys it does
  // not know); the host name is ours to give.
  auto* advanced = opts->mutable_advanced_configuration();
  for (auto it = advanced->begin(); it != advanced->end();) {
    if (StdView(it->first).starts_with(kOwnKeyPrefix) || it->first == proto::kOverrideHostnameKey) {
      it = advanced->erase(it);
    } else {
      ++it;
    }
  }
  opts->set_version(1);
  opts->set_start_timestamp_ns(static_cast<uint64_t>(std::max<int64_t>(0, window.start_ns)));
  opts->set_duration_ms(static_cast<uint64_t>(duration_ms));
  opts->set_session_id(session_id_);
  opts->clear_override_hostname();
  opts->clear_repository_path();
  request.set_duration_ms(static_cast<uint64_t>(duration_ms));
  request.set_session_id(session_id_);
  request.set_host_name(kFrameworkHost);
  request.set_repository_root(repository_root_);
  request.set_emit_xspace(true);
  if (config.max_events > 0) request.set_max_events(config.max_events);

  const int64_t deadline_ns = window.planned_stop_ns + options_.grace_ms * 1'000'000;
  response_ = std::make_unique<tensorflow::ProfileResponse>();
  done_ = false;
  launched_ = true;
  call_status_ = absl::OkStatus();
  call_ = std::thread([this, request = std::move(request), deadline_ns] {
    absl::StatusOr<tensorflow::ProfileResponse> answer = client_->Profile(request, deadline_ns);
    MutexLock lock(&mu_);
    call_status_ = answer.status();
    if (answer.ok()) *response_ = std::move(*answer);
    done_ = true;
  });
}

void FrameworkTracer::JoinCall() {
  if (call_.joinable()) call_.join();
}

absl::Status FrameworkTracer::Stop(int64_t stop_ns) {
  std::string session;
  {
    MutexLock lock(&mu_);
    if (!launched_ || done_ || stop_ns + 1'000'000 >= window_.planned_stop_ns) {
      return absl::OkStatus();
    }
    session = session_id_;
  }
  // Stopped early (Terminate, a client gone): the framework ends its capture too, and its data
  // is still collected.
  (void)client_->Terminate(session, 5 * kNanosPerSecond);
  return absl::OkStatus();
}

absl::Status FrameworkTracer::CollectInto(XSpace* space, TracerStats* stats) {
  JoinCall();
  MutexLock lock(&mu_);
  if (!launched_) return absl::OkStatus();
  launched_ = false;
  const std::string run_dir = StrCat(repository_root_, "/", session_id_);
  const absl::Status status = call_status_;
  if (!status.ok()) {
    const std::string message(status.message());
    if (status.code() == absl::StatusCode::kUnavailable) {
      space->add_warnings(
          StrCat("framework: no TF/JAX profiler answered at ", options_.address, " (", message,
                 "); start one in the workload (jax.profiler.start_server(port) or "
                 "tf.profiler.experimental.server.start(port)), or drop --framework-profiler"));
    } else if (message.find("Another profiling session active") != std::string::npos) {
      space->add_warnings(StrCat("framework: the TF/JAX profiler at ", options_.address,
                                 " is busy with another capture (", message,
                                 "); its trace is missing from this one"));
    } else if (status.code() == absl::StatusCode::kDeadlineExceeded) {
      space->add_warnings(StrCat("framework: the TF/JAX profiler at ", options_.address,
                                 " did not answer within ", options_.grace_ms,
                                 " ms of the capture's end; its trace is missing"));
    } else {
      space->add_warnings(StrCat("framework: the TF/JAX profiler at ", options_.address,
                                 " failed: ", status.ToString()));
    }
    std::error_code ec;
    std::filesystem::remove_all(run_dir, ec);
    return absl::OkStatus();
  }
  XSpace framework;
  bool found = false;
  if (response_->has_xspace() && response_->xspace().planes_size() > 0) {
    framework = std::move(*response_->mutable_xspace());
    found = true;
  } else {
    // An older server: it ignores emit_xspace and writes under repository_root.
    const std::string file = StrCat(run_dir, "/", kFrameworkHost, ".xplane.pb");
    if (std::filesystem::exists(file)) {
      absl::StatusOr<std::unique_ptr<xspace::LoadedXSpace>> loaded = xspace::ReadXSpaceFile(file);
      if (loaded.ok()) {
        framework = (*loaded)->space();
        found = true;
      } else {
        space->add_warnings(StrCat("framework: cannot read the file the TF/JAX profiler wrote: ",
                                   loaded.status().message()));
      }
    } else if (!response_->empty_trace()) {
      space->add_warnings(StrCat("framework: the TF/JAX profiler at ", options_.address,
                                 " answered with neither an XSpace nor a file"));
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(run_dir, ec);
  if (found) {
    const xspace::MergeStats merged = xspace::MergeXSpace(std::move(framework), space, "framework");
    stats->events += static_cast<uint64_t>(merged.events);
  }
  return absl::OkStatus();
}

}  // namespace clusterprof::sidecar
