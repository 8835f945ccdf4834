// libclusterprof_cupti.so: loaded into a CUDA process by the driver when CUDA_INJECTION64_PATH
// names it, which then calls InitializeInjection() from cuInit. It stays dormant (no CUPTI
// activity enabled, one thread looking at the control page every 5 ms) until the sidecar arms a
// capture with device_tracer_level >= 1 (docs/gpu.md).
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "sdk/cupti/cupti_api.h"
#include "sdk/cupti/injection_watcher.h"
#include "sdk/shm_format.h"

namespace clusterprof::cupti {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(5);

int64_t WallNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::string ProcessName() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

void Log(const std::string& message) {
  // On stderr, once per problem: the workload's logs are where its operators look.
  std::fprintf(stderr, "clusterprof_cupti: %s\n", message.c_str());
}

// The process-wide injection: the watcher and the thread that polls it.
class Injection {
 public:
  void Start() {
    InjectionWatcher::Options options;
    const char* dir = std::getenv(shm::kDirEnv);
    options.dir = dir != nullptr && *dir != '\0' ? dir : shm::kDefaultDir;
    if (const char* records = std::getenv(shm::kGpuRingRecordsEnv); records != nullptr) {
      const uint64_t value = std::strtoull(records, nullptr, 10);
      if (value >= 1024 && value <= (uint64_t{1} << 24)) options.ring_records = value;
    }
    // Tuning (docs/gpu.md): how often CUPTI's buffers are handed over during a capture, and
    // whether synchronization is recorded.
    if (const char* flush_ms = std::getenv("CLUSTERPROF_CUPTI_FLUSH_MS"); flush_ms != nullptr) {
      const long ms = std::strtol(flush_ms, nullptr, 10);
      // 0 turns periodic flushes off; any other value flushes at least every poll.
      if (ms == 0) options.flush_every_polls = 0;
      if (ms > 0) {
        options.flush_every_polls = static_cast<int>(std::max<long>(1, ms / kPollInterval.count()));
      }
    }
    if (const char* sync = std::getenv("CLUSTERPROF_CUPTI_SYNC"); sync != nullptr) {
      options.synchronization = std::string(sync) != "0";
    }
    options.process_name = ProcessName();
    options.wall_ns = &WallNs;
    options.sleep = [](std::chrono::microseconds d) { std::this_thread::sleep_for(d); };
    options.log = &Log;
    std::string error;
    std::string cupti_path;
    std::unique_ptr<CuptiApi> api = LoadCuptiApi(&error, &cupti_path);
    if (api == nullptr) Log("GPU tracing is off: " + error);
    // NVTX hands its ranges to the library this names, on the process's first NVTX call: CUPTI,
    // for gpu_enable_nvtx_tracking. Runs on the thread in cuInit, before the watcher starts.
    if (!cupti_path.empty()) setenv("NVTX_INJECTION64_PATH", cupti_path.c_str(), /*overwrite=*/0);
    watcher_ = std::make_unique<InjectionWatcher>(std::move(options), std::move(api), error);
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_acquire)) {
        watcher_->Poll();
        std::this_thread::sleep_for(kPollInterval);
      }
    });
  }

  // At exit: a capture in progress gets its records flushed.
  void Shutdown() {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
    watcher_->Shutdown();
  }

 private:
  std::unique_ptr<InjectionWatcher> watcher_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Injection* g_injection = nullptr;

}  // namespace
}  // namespace clusterprof::cupti

// Called by the CUDA driver (cuInit) when CUDA_INJECTION64_PATH names this library. Returns 1
// ("initialized") in every case: a failure to trace must not fail the workload's CUDA.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: the exit handler may run while CUDA still calls into CUPTI.
    clusterprof::cupti::g_injection = new clusterprof::cupti::Injection();
    clusterprof::cupti::g_injection->Start();
    std::atexit([] { clusterprof::cupti::g_injection->Shutdown(); });
  });
  return 1;
}
