// The control page: the sidecar arms and disarms captures; every instrumented process reads it
// on each annotation (one relaxed load). Dependency-free like the rest of sdk.
#ifndef CLUSTERPROF_SDK_CONTROL_PAGE_H_
#define CLUSTERPROF_SDK_CONTROL_PAGE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "sdk/shm_format.h"

namespace clusterprof::shm {

// The sidecar's side: creates <dir>/control (replacing a stale one atomically) and maps it shared.
// Thread-safe.
class ControlWriter {
 public:
  static std::unique_ptr<ControlWriter> Create(const std::string& dir, std::string* error);
  ~ControlWriter();
  ControlWriter(const ControlWriter&) = delete;
  ControlWriter& operator=(const ControlWriter&) = delete;

  // Starts recording annotations at `host_level` for the window [start_ns, stop_ns]. Returns the
  // new session sequence number.
  uint64_t ArmHost(uint32_t host_level, int64_t start_ns, int64_t stop_ns);
  void DisarmHost();

  // Starts GPU tracing (libclusterprof_cupti) at `level` with these caps and GpuFlags. Returns the
  // new device sequence number, which the processes echo in their GPU rings.
  struct DeviceArming {
    uint32_t level = 1;
    uint64_t max_activity_events = kDefaultGpuMaxEvents;
    uint64_t max_api_events = kDefaultGpuMaxEvents;
    uint32_t flags = 0;
  };
  uint64_t ArmDevice(const DeviceArming& arming);
  void DisarmDevice();

  // Stops everything.
  void Disarm();
  const ControlPage& page() const { return *page_; }
  const std::string& path() const { return path_; }

 private:
  ControlWriter(std::string path, ControlPage* page) : path_(std::move(path)), page_(page) {}
  std::string path_;
  ControlPage* page_;
};

// A process's view of the control page. Until the page exists (the sidecar may start later), it
// reads a static page with every level 0, so an annotation never faults and costs the same.
class ControlReader {
 public:
  // Maps <dir>/control read-only if it exists and is valid; otherwise stays on the static page.
  // Returns whether the real page is mapped now. Safe to call again (e.g. periodically).
  bool TryAttach(const std::string& dir);
  ~ControlReader();

  const ControlPage& page() const { return *page_.load(std::memory_order_acquire); }
  bool attached() const { return page_.load(std::memory_order_acquire) != &OffPage(); }

  // A page with every level 0, for processes without a sidecar.
  static const ControlPage& OffPage();

 private:
  std::atomic<const ControlPage*> page_{&OffPage()};
};

}  // namespace clusterprof::shm

#endif  // CLUSTERPROF_SDK_CONTROL_PAGE_H_
