// Capture sessions: one capture at a time, from a Profile request to the files it writes.
//
//   WAITING --start_timestamp_ns--> CAPTURING --duration, Terminate, every client gone-->
//   COLLECTING --XSpace built and written--> DONE (or FAILED)
//
// Each session runs on a thread of its own; time comes from the injected Clock, so tests drive
// the whole state machine with a SimulatedClock. A second request with the same session_id joins
// the running session (a restarted coordinator re-asks without capturing twice); any other is
// refused with ALREADY_EXISTS until the session is done. A session is never captured twice: a
// request for one that finished DONE gets that result, and one whose files an earlier process of
// this sidecar left in the spool (killed mid-upload, then restarted) gets those files.
#ifndef CLUSTERPROF_SIDECAR_SESSION_H_
#define CLUSTERPROF_SIDECAR_SESSION_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "clusterprof/v1alpha1/sidecar.pb.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/storage/storage.h"
#include "sidecar/capture_request.h"
#include "sidecar/tracers/tracer.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::storage {
class StorageSet;
}  // namespace clusterprof::storage

namespace clusterprof::sidecar {

// What a finished session hands its clients.
struct CaptureResult {
  bool empty_trace = true;
  // The files written and where their uploads stand (empty with emit_xspace).
  std::vector<storage::ObjectInfo> files;
  // Set when the request asked for emit_xspace.
  std::shared_ptr<const tensorflow::profiler::XSpace> xspace;
};

// A file's outcome in the sidecar protocol.
void SetFileResult(const storage::ObjectInfo& info, clusterprof::v1alpha1::FileResult* file);

// Observes sessions (metrics); every method may be called from session threads.
class SessionObserver {
 public:
  virtual ~SessionObserver() = default;
  // outcome: "ok", "empty", "failed", "cancelled".
  virtual void CaptureFinished(std::string_view outcome, const TracerStats& stats,
                               uint64_t bytes_written, double start_error_seconds,
                               double latency_seconds) = 0;
};

class CaptureSession {
 public:
  // Called once with the outcome; from the session thread, or at once for a session that is
  // already finished.
  using Done = std::function<void(const absl::StatusOr<CaptureResult>&)>;

  // `storages` gives the storage of the request's logdir (storage_set.h); with nullptr the
  // session makes its own for local logdirs only.
  CaptureSession(CaptureRequest request, Clock& clock, std::vector<Tracer*> tracers,
                 SessionObserver* observer, storage::StorageSet* storages = nullptr);

  const std::string& id() const { return request_.session_id; }
  // Runs the whole session; returns when it is DONE or FAILED.
  void Run();
  // Stops the capture now; what was recorded is kept and written.
  void Terminate();
  // Stops the capture now because the sidecar is shutting down (SIGTERM: its pod is being
  // deleted, or its container restarted). What was recorded is written as after Terminate, but
  // a window cut short this way answers ABORTED, naming what was written: the target did not
  // capture the window it was asked for.
  void EndForShutdown();

  // A client waiting for the outcome. A client that goes away (cancelled RPC) detaches; when no
  // client is left the capture stops early, and its files are still written.
  using ClientId = uint64_t;
  ClientId Attach(Done done);
  void Detach(ClientId client);

  bool finished() const;
  // Finished, and DONE (not FAILED).
  bool succeeded() const;
  // Makes this session one that an earlier process of the sidecar captured: DONE at once with
  // `files` (found in `storage`'s spool, their uploads resumed there), with a warning saying so
  // and no digest. Called before the session runs, instead of Run().
  void AdoptEarlierCapture(std::vector<storage::ObjectInfo> files, storage::Storage* storage);
  // The session's state, with the current state of uploads that outlived the session.
  clusterprof::v1alpha1::GetSessionResponse Snapshot() const;

 private:
  // What the capture recorded, handed from one phase of Run to the next.
  struct Recording {
    // The data's start (the requested instant when every recording tracer reached back to it,
    // else the wake-up) and the planned stop.
    CaptureWindow window;
    int64_t start_error_ns = 0;
    // When the sidecar woke and started the tracers, minus the requested instant.
    int64_t wake_error_ns = 0;
    int64_t stop_ns = 0;
    std::vector<Tracer*> started;
    std::vector<std::string> warnings;
  };

  // Prepares the tracers, waits for the start instant, starts them, records until the planned
  // stop (or an early one) and stops them.
  Recording Record();
  // Starts the tracers at `recording->window.start_ns` (the wake-up); those that refuse become
  // warnings. Then moves the window's start to where the started tracers' data begins
  // (DataStartNs) and sets the start and wake errors.
  void StartTracers(Recording* recording);
  // Builds the XSpace from what the started tracers recorded.
  tensorflow::profiler::XSpace Collect(Recording& recording, TracerStats* stats);
  // The capture's digest for cross-host analysis, into the session's status.
  void AddDigest(const tensorflow::profiler::XSpace& space);
  // Writes the host's files into the request's run directory, filling in `result`; an error says
  // what was recorded and why it could not be written.
  absl::Status WriteFiles(const tensorflow::profiler::XSpace& space, const TracerStats& stats,
                          CaptureResult* result, uint64_t* bytes);
  // ABORTED when the sidecar's shutdown cut the window short, naming where the part went.
  absl::Status CutShortBy(const Recording& recording, const TracerStats& stats,
                          const CaptureResult& result) const;
  void SetState(clusterprof::v1alpha1::SessionState state);
  void StopEarly();
  void Finish(absl::StatusOr<CaptureResult> result);

  const CaptureRequest request_;
  Clock& clock_;
  const std::vector<Tracer*> tracers_;
  SessionObserver* const observer_;
  storage::StorageSet* const storages_;
  // The storage the files went to (for UploadStatus); set once the files are written.
  std::atomic<storage::Storage*> storage_{nullptr};
  std::atomic<bool> stop_{false};
  std::atomic<bool> shutting_down_{false};

  mutable Mutex mu_;
  clusterprof::v1alpha1::GetSessionResponse status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<ClientId, Done>> clients_ ABSL_GUARDED_BY(mu_);
  ClientId next_client_ ABSL_GUARDED_BY(mu_) = 1;
  bool ever_attached_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::StatusOr<CaptureResult>> result_ ABSL_GUARDED_BY(mu_);
};

class SessionManager {
 public:
  SessionManager(Clock& clock, std::vector<Tracer*> tracers, SessionObserver* observer = nullptr,
                 storage::StorageSet* storages = nullptr);
  // Terminates a running session and waits for it to finish writing.
  ~SessionManager();

  // Starts a session for `request`, or joins the running one with the same id, or the finished
  // one with the same id that succeeded, or adopts the files an earlier process left in the
  // spool for it; `done` gets the outcome. ALREADY_EXISTS while another session runs.
  absl::StatusOr<std::pair<std::shared_ptr<CaptureSession>, CaptureSession::ClientId>> StartOrJoin(
      CaptureRequest request, CaptureSession::Done done);
  // Ends the running session `session_id` early. Unknown or finished sessions are not an error
  // (Terminate may race with the natural end).
  void Terminate(std::string_view session_id);
  // Ends the running session, if any, because the sidecar shuts down (EndForShutdown).
  void EndActiveForShutdown();
  // The running session, or one of the last finished ones; nullptr if unknown.
  std::shared_ptr<CaptureSession> Find(std::string_view session_id) const;
  // Empty when idle.
  std::string ActiveSessionId() const;

 private:
  static constexpr size_t kFinishedKept = 32;
  // The files of `request`'s host and run that the spool holds from an earlier process, and the
  // storage they are in; empty when there are none (or the logdir is not spooled).
  std::pair<std::vector<storage::ObjectInfo>, storage::Storage*> EarlierFiles(
      const CaptureRequest& request) const;
  std::shared_ptr<CaptureSession> FindLocked(std::string_view session_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock& clock_;
  const std::vector<Tracer*> tracers_;
  SessionObserver* const observer_;
  storage::StorageSet* const storages_;

  mutable Mutex mu_;
  std::shared_ptr<CaptureSession> active_ ABSL_GUARDED_BY(mu_);
  std::thread active_thread_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<CaptureSession>> finished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_SESSION_H_
