#include "tests/support/tf_profiler_stand_in.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"

namespace clusterprof::testing {
namespace {

using tensorflow::profiler::XSpace;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

XSpace MakeSpace(const std::string& host, int64_t start_ns, int64_t stop_ns, size_t padding) {
  XSpace space;
  space.add_hostnames(host);
  {
    xspace::XPlaneBuilder plane(xspace::FindOrAddMutablePlaneWithName(&space, "/host:CPU"));
    xspace::XLineBuilder line = plane.GetOrCreateLine(1001);
    line.SetName("python3");
    line.SetTimestampNs(start_ns);
    xspace::XEventBuilder event = line.AddEvent(*plane.GetOrCreateEventMetadata("train_step"));
    event.SetTimestampNs(start_ns);
    event.SetDurationNs(std::max<int64_t>(0, stop_ns - start_ns));
    event.AddStatValue(*plane.GetOrCreateStatMetadata("step_num"), int64_t{7});
  }
  {
    xspace::XPlaneBuilder plane(xspace::FindOrAddMutablePlaneWithName(&space, "/device:TPU:0"));
    xspace::XLineBuilder line = plane.GetOrCreateLine(1);
    line.SetName("XLA Ops");
    line.SetTimestampNs(start_ns);
    for (int64_t t = start_ns; t + 500'000 <= stop_ns; t += 1'000'000) {
      xspace::XEventBuilder op = line.AddEvent(*plane.GetOrCreateEventMetadata("fusion.1"));
      op.SetTimestampNs(t);
      op.SetDurationNs(500'000);
    }
    if (padding > 0) {
      plane.AddStatValue(*plane.GetOrCreateStatMetadata("padding"),
                         xspace::Bytes{std::string(padding, 'p')});
    }
  }
  xspace::XPlaneBuilder task(
      xspace::FindOrAddMutablePlaneWithName(&space, xspace::kTaskEnvPlaneName));
  task.AddStatValue(*task.GetOrCreateStatMetadata(xspace::kProfileStartTime),
                    static_cast<uint64_t>(start_ns));
  task.AddStatValue(*task.GetOrCreateStatMetadata(xspace::kProfileStopTime),
                    static_cast<uint64_t>(stop_ns));
  space.add_warnings("stand-in: synthetic trace");
  return space;
}

}  // namespace

std::unique_ptr<TfProfilerStandIn> TfProfilerStandIn::Start(Options options) {
  std::unique_ptr<TfProfilerStandIn> server(new TfProfilerStandIn(options));
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server.get());
  builder.SetMaxSendMessageSize(INT32_MAX);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) return nullptr;
  return server;
}

TfProfilerStandIn::~TfProfilerStandIn() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    terminate_ = true;
  }
  changed_.notify_all();
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

std::vector<TfProfilerStandIn::Call> TfProfilerStandIn::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

int TfProfilerStandIn::terminates() const {
  std::lock_guard<std::mutex> lock(mu_);
  return terminates_;
}

bool TfProfilerStandIn::WaitUntilCapturing(int64_t timeout_ms) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return active_; });
}

grpc::Status TfProfilerStandIn::Profile(grpc::ServerContext* context,
                                        const tensorflow::ProfileRequest* request,
                                        tensorflow::ProfileResponse* response) {
  Call call;
  call.request = *request;
  call.received_ns = NowNs();
  size_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (active_) {
      call.status = "INTERNAL";
      calls_.push_back(call);
      return grpc::Status(grpc::StatusCode::INTERNAL, "Another profiling session active.");
    }
    active_ = true;
    terminate_ = false;
    active_session_ =
        request->opts().session_id().empty() ? request->session_id() : request->opts().session_id();
    index = calls_.size();
    calls_.push_back(call);
  }
  changed_.notify_all();
  auto finish = [&](const std::string& status) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_[index] = call;
    calls_[index].status = status;
    active_ = false;
  };

  // Version 0: upstream's defaults, every option discarded.
  tensorflow::ProfileOptions opts = request->opts();
  if (opts.version() == 0) {
    opts.Clear();
    opts.set_version(1);
    opts.set_host_tracer_level(2);
    opts.set_device_tracer_level(1);
  }
  const uint64_t duration_ms = opts.duration_ms() > 0 ? opts.duration_ms() : request->duration_ms();
  const int64_t start_at = static_cast<int64_t>(opts.start_timestamp_ns());
  // Wait for the start, then record; Terminate and cancellation end either early.
  auto wait_until = [&](int64_t deadline_ns) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!terminate_ && !context->IsCancelled() && NowNs() < deadline_ns) {
      changed_.wait_for(lock, std::chrono::milliseconds(2));
    }
  };
  if (start_at > 0) wait_until(start_at);
  call.started_ns = NowNs();
  wait_until(call.started_ns + static_cast<int64_t>(duration_ms) * 1'000'000);
  call.stopped_ns = NowNs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    call.terminated = terminate_;
  }
  if (context->IsCancelled()) {
    finish("CANCELLED");
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  }
  if (options_.answer_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.answer_delay_ms));
  }

  std::string host = opts.override_hostname();
  if (host.empty()) {
    if (auto it = opts.advanced_configuration().find("override_hostname");
        it != opts.advanced_configuration().end()) {
      host = it->second.string_value();
    }
  }
  if (host.empty()) host = request->host_name();
  std::replace(host.begin(), host.end(), ':', '_');
  const XSpace space = MakeSpace(host, call.started_ns, call.stopped_ns, options_.padding_bytes);
  if (request->emit_xspace() && !options_.ignore_emit_xspace) {
    *response->mutable_xspace() = space;
  } else {
    const std::filesystem::path dir =
        std::filesystem::path(request->repository_root()) / active_session_;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string file = (dir / (host + ".xplane.pb")).string();
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    if (ec || !space.SerializeToOstream(&out) || !out.flush()) {
      finish("INTERNAL");
      return grpc::Status(grpc::StatusCode::INTERNAL, "Failed to write " + file);
    }
    call.file = file;
  }
  response->set_empty_trace(false);
  finish("OK");
  return grpc::Status::OK;
}

grpc::Status TfProfilerStandIn::Terminate(grpc::ServerContext* context,
                                          const tensorflow::TerminateRequest* request,
                                          tensorflow::TerminateResponse* response) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++terminates_;
    if (active_ && request->session_id() == active_session_) terminate_ = true;
  }
  changed_.notify_all();
  return grpc::Status::OK;
}

}  // namespace clusterprof::testing
