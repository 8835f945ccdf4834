#include "sidecar/session.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/digest_proto.h"
#include "common/base/check.h"
#include "common/base/strings.h"
#include "common/storage/host_files.h"
#include "common/storage/storage.h"
#include "common/storage/storage_set.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "spdlog/spdlog.h"

namespace clusterprof::sidecar {

using clusterprof::v1alpha1::GetSessionResponse;
using clusterprof::v1alpha1::SessionState;
using tensorflow::profiler::XSpace;

namespace {

void AddTaskEnvironment(XSpace* space, const tensorflow::ProfileOptions& options, int64_t start_ns,
                        int64_t stop_ns) {
  xspace::XPlaneBuilder plane(
      xspace::FindOrAddMutablePlaneWithName(space, xspace::kTaskEnvPlaneName));
  plane.AddStatValue(*plane.GetOrCreateStatMetadata(xspace::kProfileStartTime),
                     static_cast<uint64_t>(start_ns));
  plane.AddStatValue(*plane.GetOrCreateStatMetadata(xspace::kProfileStopTime),
                     static_cast<uint64_t>(stop_ns));
  plane.AddStatValue(*plane.GetOrCreateStatMetadata(xspace::kProfileOptions),
                     options.ShortDebugString());
}

// A wake-up later than this after the start instant is logged as a warning.
constexpr int64_t kLateWakeNs = 1'000'000;

std::string FormatMs(int64_t ns) {
  return absl::StrFormat("%.1f ms", static_cast<double>(ns) / 1e6);
}

}  // namespace

namespace {

clusterprof::v1alpha1::UploadState ToProto(storage::UploadState state) {
  switch (state) {
    case storage::UploadState::kSpooled:
      return clusterprof::v1alpha1::UPLOAD_STATE_SPOOLED;
    case storage::UploadState::kUploading:
      return clusterprof::v1alpha1::UPLOAD_STATE_UPLOADING;
    case storage::UploadState::kCommitted:
      return clusterprof::v1alpha1::UPLOAD_STATE_COMMITTED;
    case storage::UploadState::kFailed:
      return clusterprof::v1alpha1::UPLOAD_STATE_FAILED;
  }
  return clusterprof::v1alpha1::UPLOAD_STATE_UNSPECIFIED;
}

}  // namespace

void SetFileResult(const storage::ObjectInfo& info, clusterprof::v1alpha1::FileResult* file) {
  file->set_uri(info.uri);
  file->set_bytes(info.bytes);
  file->set_upload_state(ToProto(info.state));
  file->set_bytes_committed(info.bytes_committed);
  file->set_crc32c(info.crc32c);
  file->set_error(info.error);
}

CaptureSession::CaptureSession(CaptureRequest request, Clock& clock, std::vector<Tracer*> tracers,
                               SessionObserver* observer, storage::StorageSet* storages)
    : request_(std::move(request)),
      clock_(clock),
      tracers_(std::move(tracers)),
      observer_(observer),
      storages_(storages) {
  MutexLock lock(&mu_);
  status_.set_session_id(request_.session_id);
  status_.set_state(clusterprof::v1alpha1::SESSION_STATE_WAITING);
}

void CaptureSession::SetState(SessionState state) {
  MutexLock lock(&mu_);
  status_.set_state(state);
}

void CaptureSession::Run() {
  Recording recording = Record();
  const int64_t collect_mono_ns = clock_.MonotonicNs();
  TracerStats stats;
  XSpace space = Collect(recording, &stats);

  CaptureResult result;
  result.empty_trace = xspace::IsEmpty(space);
  {
    MutexLock lock(&mu_);
    status_.set_events(stats.events);
    status_.set_dropped_events(stats.dropped_events);
    status_.set_lookback_ns(stats.lookback_ns);
    status_.set_empty_trace(result.empty_trace);
    for (const std::string& warning : space.warnings()) status_.add_warnings(warning);
  }
  if (!result.empty_trace) AddDigest(space);
  uint64_t bytes = 0;
  absl::Status write_status;
  if (request_.emit_xspace) {
    result.xspace = std::make_shared<const XSpace>(std::move(space));
  } else {
    write_status = WriteFiles(space, stats, &result, &bytes);
    if (write_status.ok()) write_status = CutShortBy(recording, stats, result);
  }

  const double latency_s = static_cast<double>(clock_.MonotonicNs() - collect_mono_ns) / 1e9;
  if (observer_ != nullptr) {
    std::string_view outcome = !write_status.ok() ? "failed" : result.empty_trace ? "empty" : "ok";
    {
      MutexLock lock(&mu_);
      if (cancelled_ && write_status.ok()) outcome = "cancelled";
    }
    observer_->CaptureFinished(outcome, stats, bytes,
                               static_cast<double>(recording.start_error_ns) / 1e9, latency_s);
  }
  spdlog::info("session {}: {} events, {} dropped, {} bytes written{}", request_.session_id,
               stats.events, stats.dropped_events, bytes,
               write_status.ok() ? "" : StrCat("; ", write_status.message()));
  if (write_status.ok()) {
    Finish(std::move(result));
  } else {
    Finish(write_status);
  }
}

CaptureSession::Recording CaptureSession::Record() {
  Recording recording;
  recording.warnings = request_.warnings;
  for (const std::string& warning : recording.warnings) {
    spdlog::warn("session {}: {}", request_.session_id, warning);
  }
  const int64_t requested = request_.start_timestamp_ns;
  // Slow setup now, so the start instant itself costs little.
  const CaptureWindow planned{requested, requested + request_.duration_ns};
  for (Tracer* tracer : tracers_) {
    if (!tracer->EnabledFor(request_.config.options)) continue;
    if (absl::Status status = tracer->Prepare(planned, request_.config); !status.ok()) {
      spdlog::warn("session {}: {} tracer: {}", request_.session_id, tracer->name(),
                   std::string(status.message()));
    }
  }
  // Whether the session waits for the requested instant (not one already past).
  bool waited = false;
  auto start = [&](int64_t start_ns) {
    recording.window = {start_ns, start_ns + request_.duration_ns,
                        waited && requested <= start_ns ? requested : 0};
    StartTracers(&recording);
  };
  bool started_at_instant = false;
  if (requested > 0) {
    const int64_t now = clock_.WallNs();
    waited = requested >= now;
    if (requested < now) {
      recording.warnings.push_back(StrCat("start_timestamp_ns was ", FormatMs(now - requested),
                                          " in the past when the request arrived; started at "
                                          "once"));
      spdlog::warn("session {}: {}", request_.session_id, recording.warnings.back());
    } else {
      // The clock takes the start reading and starts the tracers in one go, on a busy machine at
      // a raised priority where permitted (RealClock::StartOptions).
      started_at_instant = clock_.RunAtWallNsUnless(requested, stop_, start);
    }
  }
  // At once: no start instant, one in the past, or stopped before it.
  if (!started_at_instant) start(clock_.WallNs());
  const int64_t start_ns = recording.window.start_ns;
  // The time-critical part is done. Other sidecars on this machine may have woken at the same
  // instant and be waiting for a CPU: let them take their start time before this thread logs.
  std::this_thread::yield();
  spdlog::info("session {}: capturing for {} with {} tracer(s){}", request_.session_id,
               FormatMs(request_.duration_ns), recording.started.size(),
               requested > 0 ? absl::StrFormat(", start error %d us, wake error %d us",
                                               recording.start_error_ns / 1000,
                                               recording.wake_error_ns / 1000)
                             : "");
  if (waited && recording.wake_error_ns > kLateWakeNs) {
    spdlog::warn(
        "session {}: woke {} after the start instant (busy CPUs, and SCHED_FIFO not permitted?); "
        "{}",
        request_.session_id, FormatMs(recording.wake_error_ns),
        recording.start_error_ns == 0
            ? "the trace starts at the instant all the same: the annotations come from the "
              "flight recorder"
            : "the trace starts that late (a GPU or framework tracer records only from its "
              "start, or the flight recorder does not cover the instant)");
  }

  // Capture until the planned stop, Terminate, or every client gone.
  clock_.SleepUntilWallNsUnless(recording.window.planned_stop_ns, stop_);
  recording.stop_ns = std::max(start_ns, clock_.WallNs());
  for (Tracer* tracer : recording.started) {
    if (absl::Status status = tracer->Stop(recording.stop_ns); !status.ok()) {
      recording.warnings.push_back(
          StrCat(tracer->name(), " tracer did not stop cleanly: ", status.message()));
    }
  }
  return recording;
}

void CaptureSession::StartTracers(Recording* recording) {
  const CaptureWindow window = recording->window;
  for (Tracer* tracer : tracers_) {
    if (!tracer->EnabledFor(request_.config.options)) continue;
    if (absl::Status status = tracer->Start(window, request_.config); !status.ok()) {
      recording->warnings.push_back(
          StrCat(tracer->name(), " tracer did not start: ", status.message()));
      spdlog::warn("session {}: {}", request_.session_id, recording->warnings.back());
      continue;
    }
    recording->started.push_back(tracer);
  }
  // The capture's data starts where every tracer that records has data: at the requested
  // instant when all of them reached back to it, at the wake-up as soon as one records only
  // from its Start.
  int64_t data_start_ns = window.start_ns;
  if (window.requested_start_ns > 0) {
    int64_t latest = 0;
    for (const Tracer* tracer : recording->started) {
      const int64_t from = tracer->DataStartNs(window);
      if (from > 0) latest = std::max(latest, from);
    }
    if (latest > 0) data_start_ns = std::clamp(latest, window.requested_start_ns, window.start_ns);
  }
  const int64_t requested = request_.start_timestamp_ns;
  recording->window.start_ns = data_start_ns;
  recording->window.planned_stop_ns = data_start_ns + request_.duration_ns;
  recording->start_error_ns = requested > 0 ? data_start_ns - requested : 0;
  recording->wake_error_ns = requested > 0 ? window.start_ns - requested : 0;
  MutexLock lock(&mu_);
  status_.set_state(clusterprof::v1alpha1::SESSION_STATE_CAPTURING);
  status_.set_start_time_ns(data_start_ns);
  status_.set_start_error_ns(recording->start_error_ns);
  status_.set_wake_error_ns(recording->wake_error_ns);
}

void CaptureSession::AddDigest(const XSpace& space) {
  const int64_t begin_ns = clock_.MonotonicNs();
  absl::StatusOr<analysis::HostDigest> digest =
      analysis::DigestXSpace(space, request_.host_name, request_.digest_options);
  clusterprof::v1alpha1::HostDigest proto;
  if (digest.ok()) analysis::DigestToProto(*digest, &proto);
  const double took_ms = static_cast<double>(clock_.MonotonicNs() - begin_ns) / 1e6;
  if (digest.ok()) {
    spdlog::info("session {}: digest of {} steps, {} bytes, in {:.1f} ms", request_.session_id,
                 digest->steps.size(), proto.ByteSizeLong(), took_ms);
  } else {
    spdlog::warn("session {}: no digest: {}", request_.session_id,
                 std::string(digest.status().message()));
  }
  MutexLock lock(&mu_);
  if (digest.ok()) {
    *status_.mutable_digest() = std::move(proto);
  } else {
    status_.set_digest_error(std::string(digest.status().message()));
  }
}

XSpace CaptureSession::Collect(Recording& recording, TracerStats* stats) {
  {
    MutexLock lock(&mu_);
    status_.set_state(clusterprof::v1alpha1::SESSION_STATE_COLLECTING);
    status_.set_stop_time_ns(recording.stop_ns);
  }
  XSpace space;
  for (Tracer* tracer : recording.started) {
    if (absl::Status status = tracer->CollectInto(&space, stats); !status.ok()) {
      recording.warnings.push_back(
          StrCat(tracer->name(), " tracer lost its data: ", status.message()));
    }
  }
  space.add_hostnames(request_.host_name);
  AddTaskEnvironment(&space, request_.config.options, recording.window.start_ns, recording.stop_ns);
  for (std::string& warning : recording.warnings) space.add_warnings(std::move(warning));
  xspace::SortXSpace(&space);
  return space;
}

absl::Status CaptureSession::WriteFiles(const XSpace& space, const TracerStats& stats,
                                        CaptureResult* result, uint64_t* bytes) {
  const storage::RunLayout& layout = *request_.layout;
  // Without a shared set (tests), a set of this session's own serves local logdirs.
  std::unique_ptr<storage::StorageSet> own;
  storage::StorageSet* storages = storages_;
  if (storages == nullptr) {
    own = std::make_unique<storage::StorageSet>(storage::StorageSetOptions{.clock = &clock_});
    storages = own.get();
  }
  absl::StatusOr<storage::Storage*> store = storages->For(layout.logdir());
  absl::StatusOr<storage::HostFiles> files =
      store.ok() ? storage::WriteHostFiles(**store, layout, request_.host_name, space)
                 : absl::StatusOr<storage::HostFiles>(store.status());
  if (!files.ok()) {
    return absl::InternalError(
        StrCat("capture ", request_.session_id, " recorded ", stats.events,
               " events but its files could not be written: ", files.status().message()));
  }
  if (own == nullptr) storage_.store(*store, std::memory_order_release);
  std::vector<std::string> pending;
  {
    MutexLock lock(&mu_);
    for (const storage::ObjectInfo* info : {&files->xplane, &files->trace_json}) {
      if (info->uri.empty()) continue;
      SetFileResult(*info, status_.add_files());
      result->files.push_back(*info);
      *bytes += info->bytes;
      if (info->state != storage::UploadState::kCommitted) {
        pending.push_back(StrCat(info->uri, " ", storage::UploadStateName(info->state),
                                 info->error.empty() ? "" : StrCat(": ", info->error)));
      }
    }
  }
  for (const std::string& file : pending) {
    spdlog::warn("session {}: not uploaded yet: {}", request_.session_id, file);
  }
  return absl::OkStatus();
}

absl::Status CaptureSession::CutShortBy(const Recording& recording, const TracerStats& stats,
                                        const CaptureResult& result) const {
  const int64_t planned_stop_ns = recording.window.planned_stop_ns;
  if (!shutting_down_.load(std::memory_order_acquire) || recording.stop_ns >= planned_stop_ns) {
    return absl::OkStatus();
  }
  // Not the window the client asked for: say so, and where the part recorded went.
  std::vector<std::string> written;
  for (const storage::ObjectInfo& file : result.files) written.push_back(file.uri);
  return absl::AbortedError(StrCat(
      "the sidecar shut down (SIGTERM: its pod is being deleted, or its container restarted) ",
      FormatMs(planned_stop_ns - recording.stop_ns), " before the end of the window; the ",
      FormatMs(recording.stop_ns - recording.window.start_ns), " it recorded (", stats.events,
      " events) are in ", absl::StrJoin(written, ", ")));
}

void CaptureSession::Finish(absl::StatusOr<CaptureResult> result) {
  std::vector<std::pair<ClientId, Done>> clients;
  {
    MutexLock lock(&mu_);
    status_.set_state(result.ok() ? clusterprof::v1alpha1::SESSION_STATE_DONE
                                  : clusterprof::v1alpha1::SESSION_STATE_FAILED);
    if (!result.ok()) {
      status_.set_error(std::string(result.status().message()));
      status_.set_error_code(static_cast<int32_t>(result.status().code()));
    }
    result_ = std::move(result);
    clients.swap(clients_);
  }
  // Outside the lock: a client's callback may call back into the session.
  const absl::StatusOr<CaptureResult>& final_result = *result_;
  for (auto& [id, done] : clients) done(final_result);
}

void CaptureSession::StopEarly() {
  stop_.store(true, std::memory_order_release);
  clock_.Wake();
}

void CaptureSession::Terminate() {
  spdlog::info("session {}: terminated", request_.session_id);
  StopEarly();
}

void CaptureSession::EndForShutdown() {
  spdlog::info("session {}: ending early, the sidecar is shutting down", request_.session_id);
  shutting_down_.store(true, std::memory_order_release);
  StopEarly();
}

bool CaptureSession::succeeded() const {
  MutexLock lock(&mu_);
  return result_.has_value() && result_->ok();
}

void CaptureSession::AdoptEarlierCapture(std::vector<storage::ObjectInfo> files,
                                         storage::Storage* storage) {
  CaptureResult result;
  result.empty_trace = false;
  MutexLock lock(&mu_);
  for (storage::ObjectInfo& file : files) {
    SetFileResult(file, status_.add_files());
    result.files.push_back(std::move(file));
  }
  status_.add_warnings(
      "captured by an earlier process of this sidecar, which ended before it answered; its "
      "files were in the spool and are answered as they are, not captured again");
  status_.set_digest_error("the capture's digest went with the sidecar process that made it");
  status_.set_state(clusterprof::v1alpha1::SESSION_STATE_DONE);
  storage_.store(storage, std::memory_order_release);
  result_ = std::move(result);
}

CaptureSession::ClientId CaptureSession::Attach(Done done) {
  {
    MutexLock lock(&mu_);
    if (!result_.has_value()) {
      const ClientId id = next_client_++;
      clients_.emplace_back(id, std::move(done));
      ever_attached_ = true;
      return id;
    }
  }
  done(*result_);  // finished: result_ no longer changes
  return 0;
}

void CaptureSession::Detach(ClientId client) {
  bool last = false;
  {
    MutexLock lock(&mu_);
    auto it = std::find_if(clients_.begin(), clients_.end(),
                           [client](const auto& c) { return c.first == client; });
    if (it == clients_.end()) return;
    clients_.erase(it);
    last = clients_.empty() && ever_attached_;
    if (last && request_.outlive_client) {
      spdlog::info(
          "session {}: every client went away; capturing to the planned end as asked "
          "({}), for the coordinator to rejoin or read back",
          request_.session_id, kOutliveClientKey);
      return;
    }
    if (last) cancelled_ = true;
  }
  if (last) {
    spdlog::info(
        "session {}: every client went away; stopping early and writing what was "
        "recorded",
        request_.session_id);
    StopEarly();
  }
}

bool CaptureSession::finished() const {
  MutexLock lock(&mu_);
  return result_.has_value();
}

GetSessionResponse CaptureSession::Snapshot() const {
  GetSessionResponse snapshot;
  {
    MutexLock lock(&mu_);
    snapshot = status_;
  }
  // Uploads go on after the session: ask the storage where they stand now.
  if (storage::Storage* storage = storage_.load(std::memory_order_acquire)) {
    for (clusterprof::v1alpha1::FileResult& file : *snapshot.mutable_files()) {
      if (file.upload_state() == clusterprof::v1alpha1::UPLOAD_STATE_COMMITTED) continue;
      if (std::optional<storage::ObjectInfo> info = storage->UploadStatus(file.uri())) {
        SetFileResult(*info, &file);
      }
    }
  }
  return snapshot;
}

SessionManager::SessionManager(Clock& clock, std::vector<Tracer*> tracers,
                               SessionObserver* observer, storage::StorageSet* storages)
    : clock_(clock), tracers_(std::move(tracers)), observer_(observer), storages_(storages) {}

SessionManager::~SessionManager() {
  std::thread thread;
  {
    MutexLock lock(&mu_);
    if (active_ != nullptr && !active_->finished()) active_->Terminate();
    thread = std::move(active_thread_);
  }
  if (thread.joinable()) thread.join();
}

std::pair<std::vector<storage::ObjectInfo>, storage::Storage*> SessionManager::EarlierFiles(
    const CaptureRequest& request) const {
  if (storages_ == nullptr || !request.layout.has_value() || request.emit_xspace) return {};
  absl::StatusOr<storage::Storage*> store = storages_->For(request.layout->logdir());
  absl::StatusOr<std::string> stem = storage::HostFileStem(request.host_name);
  if (!store.ok() || !stem.ok()) return {};
  std::vector<storage::ObjectInfo> files;
  for (const std::string& uri :
       {request.layout->XPlanePath(*stem), request.layout->TraceJsonPath(*stem)}) {
    if (std::optional<storage::ObjectInfo> info = (*store)->UploadStatus(uri)) {
      files.push_back(*std::move(info));
    }
  }
  return {std::move(files), *store};
}

std::shared_ptr<CaptureSession> SessionManager::FindLocked(std::string_view session_id) const {
  if (active_ != nullptr && active_->id() == session_id) return active_;
  for (auto it = finished_.rbegin(); it != finished_.rend(); ++it) {
    if ((*it)->id() == session_id) return *it;
  }
  return nullptr;
}

absl::StatusOr<std::pair<std::shared_ptr<CaptureSession>, CaptureSession::ClientId>>
SessionManager::StartOrJoin(CaptureRequest request, CaptureSession::Done done) {
  std::shared_ptr<CaptureSession> session;
  std::thread previous;
  // Outside the lock: it asks the storage. Only files this process's storage knows count, so a
  // finished session of its own is found first, below.
  auto [earlier_files, earlier_storage] = EarlierFiles(request);
  {
    MutexLock lock(&mu_);
    std::shared_ptr<CaptureSession> same = FindLocked(request.session_id);
    if (active_ != nullptr && !active_->finished()) {
      if (active_->id() == request.session_id) {
        session = active_;
      } else {
        return absl::AlreadyExistsError(
            StrCat("another capture is running on this sidecar (session '", active_->id(),
                   "'); retry when it ends"));
      }
    } else if (same != nullptr && same->succeeded()) {
      // A retry of a capture that is done (its answer was lost on the way): the same result,
      // not a second capture of the run.
      spdlog::info("session {}: asked again after it was done; answering with its result",
                   request.session_id);
      session = same;
    } else if (same == nullptr && !earlier_files.empty()) {
      spdlog::warn(
          "session {}: an earlier process of this sidecar captured it and left its files in the "
          "spool; answering with those files instead of capturing the run again",
          request.session_id);
      session = std::make_shared<CaptureSession>(std::move(request), clock_, tracers_, observer_,
                                                 storages_);
      session->AdoptEarlierCapture(std::move(earlier_files), earlier_storage);
      finished_.push_back(session);
      if (finished_.size() > kFinishedKept) finished_.pop_front();
    } else {
      if (active_ != nullptr) {
        finished_.push_back(active_);
        if (finished_.size() > kFinishedKept) finished_.pop_front();
      }
      previous = std::move(active_thread_);
      session = std::make_shared<CaptureSession>(std::move(request), clock_, tracers_, observer_,
                                                 storages_);
      active_ = session;
      // The previous session has finished; its thread is only returning.
      if (previous.joinable()) previous.join();
      active_thread_ = std::thread([session] { session->Run(); });
    }
  }
  const CaptureSession::ClientId client = session->Attach(std::move(done));
  return std::make_pair(session, client);
}

void SessionManager::Terminate(std::string_view session_id) {
  MutexLock lock(&mu_);
  if (active_ != nullptr && active_->id() == session_id) active_->Terminate();
}

void SessionManager::EndActiveForShutdown() {
  MutexLock lock(&mu_);
  if (active_ != nullptr && !active_->finished()) active_->EndForShutdown();
}

std::shared_ptr<CaptureSession> SessionManager::Find(std::string_view session_id) const {
  MutexLock lock(&mu_);
  return FindLocked(session_id);
}

std::string SessionManager::ActiveSessionId() const {
  MutexLock lock(&mu_);
  return active_ != nullptr && !active_->finished() ? active_->id() : "";
}

}  // namespace clusterprof::sidecar
