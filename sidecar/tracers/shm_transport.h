// The pod's shared-memory directory as the tracers see it. The sidecar publishes one control page
// there (the annotation tracer arms its host part, the GPU tracer its device part), and every
// instrumented process creates ring files beside it: annotation rings (libclusterprof_annotate)
// and GPU rings (libclusterprof_cupti). ShmTransport owns the page and finds the rings;
// RingSet is the open rings of one kind inside a tracer.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_SHM_TRANSPORT_H_
#define CLUSTERPROF_SIDECAR_TRACERS_SHM_TRANSPORT_H_

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/strings.h"
#include "sdk/control_page.h"
#include "sdk/shm_format.h"

namespace clusterprof::sidecar {

class ShmTransport {
 public:
  struct Options {
    // The shared-memory directory ($CLUSTERPROF_DIR of the workloads).
    std::string dir = shm::kDefaultDir;
    // Where process liveness is checked; tests point it elsewhere.
    std::string proc_root = "/proc";
  };

  // Creates the directory if needed (with a warning when it is not on tmpfs) and publishes the
  // control page, disarmed.
  static absl::StatusOr<std::unique_ptr<ShmTransport>> Create(Options options);

  const std::string& dir() const { return options_.dir; }
  shm::ControlWriter& control() const { return *control_; }

  // The ring files of one kind (shm::kRingPrefix, shm::kGpuRingPrefix), sorted.
  absl::StatusOr<std::vector<std::string>> ListRings(std::string_view prefix) const;
  // Whether the directory changed since `*seen` (one stat), which is then updated: a process
  // that starts mid-capture shows up as a new file.
  bool DirectoryChanged(timespec* seen) const;
  // Whether the process that wrote the ring at `path` still runs (shm::WriterAlive).
  bool WriterAlive(const std::string& path, uint32_t pid, uint64_t start_ticks) const;
  // Deletes the ring at `path` once its writer is gone; `what` names the ring in the log.
  void RemoveIfExited(const std::string& path, uint32_t pid, uint64_t start_ticks,
                      std::string_view what) const;

 private:
  ShmTransport(Options options, std::unique_ptr<shm::ControlWriter> control)
      : options_(std::move(options)), control_(std::move(control)) {}

  const Options options_;
  const std::unique_ptr<shm::ControlWriter> control_;
};

// The open rings of one kind, by path. `Entry` holds the ring's reader as
// `std::unique_ptr<Reader> reader` beside what the tracer keeps per ring; Reader has
// `static Open(path)`, `pid()` and `process_start_ticks()`. Not thread-safe: the tracer's mutex
// guards it.
template <typename Entry>
class RingSet {
 public:
  using Reader = typename decltype(Entry::reader)::element_type;

  // `prefix` picks the ring files; `what` names them in logs ("ring", "GPU ring").
  RingSet(const ShmTransport& shm, std::string_view prefix, std::string_view what)
      : shm_(shm), prefix_(prefix), what_(what) {}

  // Opens the ring files not open yet, calling `opened(entry)` for each new one. An error
  // (listing, or a file that cannot be opened) is added to `errors`, prefixed with
  // `error_prefix`, once per message: the capture goes on with the other rings.
  template <typename Opened>
  void Refresh(std::vector<std::string>* errors, std::string_view error_prefix, Opened opened) {
    absl::StatusOr<std::vector<std::string>> files = shm_.ListRings(prefix_);
    if (!files.ok()) {
      AddOnce(errors, StrCat(error_prefix, files.status().message()));
      return;
    }
    for (const std::string& path : *files) {
      if (entries_.count(path) > 0) continue;
      auto reader = Reader::Open(path);
      if (!reader.ok()) {
        AddOnce(errors, StrCat(error_prefix, reader.status().message()));
        continue;
      }
      Entry& entry = entries_[path];
      entry.reader = std::move(*reader);
      opened(entry);
    }
  }
  void Refresh(std::vector<std::string>* errors, std::string_view error_prefix) {
    Refresh(errors, error_prefix, [](Entry&) {});
  }

  // Closes the rings for which `close(entry)` is true, deleting the files of processes that are
  // gone (their records drained).
  template <typename Pred>
  void CloseIf(Pred close) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (!close(it->second)) {
        ++it;
        continue;
      }
      shm_.RemoveIfExited(it->first, it->second.reader->pid(),
                          it->second.reader->process_start_ticks(), what_);
      it = entries_.erase(it);
    }
  }

  // Closes every ring, deleting the files of processes that are gone (their records drained).
  void Release() {
    for (auto& [path, entry] : entries_) {
      shm_.RemoveIfExited(path, entry.reader->pid(), entry.reader->process_start_ticks(), what_);
    }
    entries_.clear();
  }

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }

 private:
  static void AddOnce(std::vector<std::string>* errors, std::string message) {
    if (std::find(errors->begin(), errors->end(), message) == errors->end()) {
      errors->push_back(std::move(message));
    }
  }

  const ShmTransport& shm_;
  const std::string prefix_;
  const std::string what_;
  std::map<std::string, Entry> entries_;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_SHM_TRANSPORT_H_
