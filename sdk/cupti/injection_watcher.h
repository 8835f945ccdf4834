// The watcher of libclusterprof_cupti: follows the control page (re-attaching when a restarted
// sidecar replaces it), and turns the CuptiRecorder on when the sidecar arms a GPU capture and
// off when it disarms. The GPU ring is created
// on the first capture, so a process never profiled leaves no file.
//
// Not thread-safe: one thread (the injection's) calls Poll; Shutdown runs after it stopped.
#ifndef CLUSTERPROF_SDK_CUPTI_INJECTION_WATCHER_H_
#define CLUSTERPROF_SDK_CUPTI_INJECTION_WATCHER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "sdk/control_page.h"
#include "sdk/cupti/cupti_api.h"
#include "sdk/cupti/cupti_recorder.h"
#include "sdk/gpu_ring_writer.h"

namespace clusterprof::cupti {

class InjectionWatcher {
 public:
  struct Options {
    std::string dir = shm::kDefaultDir;
    uint64_t ring_records = shm::kDefaultGpuRingRecords;
    std::string process_name;
    // Polls between flushes while a capture runs; 0: CUPTI hands over each buffer as it fills,
    // and the rest at the stop. A flush during the capture stalls the workload's CUDA calls
    // (3-5% of a GEMM-bound loop on an H100 at one per 100 ms: bench/RESULTS.md), so none by
    // default. Also how many polls between looks for a new control page.
    int flush_every_polls = 0;
    int reattach_every_polls = 200;
    // Synchronization records ($CLUSTERPROF_CUPTI_SYNC=0 leaves them out).
    bool synchronization = true;
    CuptiRecorder::WallClockFn wall_ns;
    CuptiRecorder::SleepFn sleep;
    // Where the watcher says what went wrong (once per problem); stderr in the workload.
    std::function<void(const std::string&)> log;
  };

  // `api` may be null when libcupti could not be loaded; `load_error` then says why, and the
  // sidecar hears it at the next capture.
  InjectionWatcher(Options options, std::unique_ptr<CuptiApi> api, std::string load_error);

  // One look at the control page; the injection's thread calls it every 5 ms.
  void Poll();
  // Ends a capture in progress with its records flushed (at process exit).
  void Shutdown();

  shm::GpuRingWriter* ring() { return ring_.get(); }
  CuptiRecorder* recorder() { return recorder_.get(); }

 private:
  void Attach();
  bool EnsureRecorder();

  const Options options_;
  std::unique_ptr<CuptiApi> api_;
  const std::string load_error_;
  std::unique_ptr<shm::ControlReader> control_;
  ino_t control_inode_ = 0;
  std::unique_ptr<shm::GpuRingWriter> ring_;
  std::unique_ptr<CuptiRecorder> recorder_;
  uint64_t armed_seq_ = 0;
  bool reported_failure_ = false;
  int polls_ = 0;
  int armed_polls_ = 0;
};

}  // namespace clusterprof::cupti

#endif  // CLUSTERPROF_SDK_CUPTI_INJECTION_WATCHER_H_
