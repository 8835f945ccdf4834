// Follows the live steps of many sidecars at once (Sidecar.WatchSteps, docs/triggers.md): one
// stream per sidecar, reconnected with backoff when it breaks, and each sidecar's clock offset
// probed (Sidecar.GetInfo, the smallest round trip of a few) whenever it connects, so the steps of
// all sidecars can be put on one clock. `clusterprof top` and the operator's ProfileTrigger
// controller read it.
//
// One thread per sidecar, blocked in the stream's Read: fine for the pods of one job (tens to
// hundreds); SetTargets adds and removes sidecars without touching the others' streams.
#ifndef CLUSTERPROF_COORDINATOR_STEP_WATCHER_H_
#define CLUSTERPROF_COORDINATOR_STEP_WATCHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "analysis/digest.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/grpc/tls.h"

namespace clusterprof::coordinator {

struct ClockProbe;

// What is known of one sidecar's live steps.
struct WatchedSidecar {
  std::string address;
  // The name the sidecar reports (the pod name in Kubernetes); empty until it answered.
  std::string host_name;
  bool connected = false;
  // Why the stream is down ("UNAVAILABLE: ..."), when it is.
  std::string error;
  // Our wall clock when the last message (steps or heartbeat) arrived; 0: none yet.
  int64_t last_message_ns = 0;
  // The sidecar's clock minus ours, and half the probe's round trip (-1: not probed yet).
  int64_t clock_offset_ns = 0;
  int64_t clock_uncertainty_ns = -1;
  // The latest steps, ascending by number, on the sidecar's clock (collective_entry_ns 0: none).
  std::vector<analysis::StepDigest> steps;
  uint64_t steps_total = 0;
  int64_t last_step_end_ns = 0;  // the sidecar's clock; 0: none yet
  int processes = 0;
  int processes_with_steps = 0;
  std::string step_source;
  // The sidecar's flight recorder (0 level: off).
  int recorder_level = 0;
  int64_t recorder_window_ms = 0;
  int64_t recorder_covered_since_ns = 0;
};

// Where live steps come from: StepWatcher, or a fake in tests.
class StepSource {
 public:
  virtual ~StepSource() = default;
  // Follows exactly these host:port addresses from now on.
  virtual void SetTargets(const std::vector<std::string>& addresses) = 0;
  // Every followed sidecar, in address order.
  virtual std::vector<WatchedSidecar> Snapshot() const = 0;
};

class StepWatcher final : public StepSource {
 public:
  struct Options {
    // "authorization: Bearer <token>" on every call; empty: none.
    std::string auth_token;
    // A file with the token instead (a mounted Secret), reread each time a stream (re)opens, so
    // a rotated token is sent from then on.
    std::string auth_token_file;
    // Plaintext or TLS (common/grpc/tls.h); null: plaintext.
    std::shared_ptr<const tls::ChannelSecurity> security;
    // Steps kept per sidecar, and asked for when a stream (re)opens.
    int max_steps = 1024;
    int history = 256;
    // Reconnects wait this long, doubling up to the maximum.
    int64_t reconnect_min_ms = 250;
    int64_t reconnect_max_ms = 30'000;
    Clock* clock = nullptr;  // null: SystemClock()
  };

  explicit StepWatcher(Options options);
  // Cancels every stream and joins their threads.
  ~StepWatcher();
  StepWatcher(const StepWatcher&) = delete;
  StepWatcher& operator=(const StepWatcher&) = delete;

  // Streams to addresses no longer given are closed; the others are left alone.
  void SetTargets(const std::vector<std::string>& addresses) override;
  std::vector<WatchedSidecar> Snapshot() const override;
  // The update count now; WaitForUpdate returns when it passes `seen` or after `timeout`.
  uint64_t updates() const;
  uint64_t WaitForUpdate(uint64_t seen, absl::Duration timeout) const;

 private:
  struct Stream;
  void Run(Stream* stream);
  // One WatchSteps stream, read until it ends; nullopt when stopped, else whether it delivered.
  std::optional<bool> Follow(Stream* stream, const std::string& token, const ClockProbe& probe,
                             Clock& clock);

  const Options options_;
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  uint64_t updates_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace clusterprof::coordinator

#endif  // CLUSTERPROF_COORDINATOR_STEP_WATCHER_H_
