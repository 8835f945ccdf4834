#include "sidecar/tracers/shm_transport.h"

#include <sys/vfs.h>

#include <filesystem>

#include "sidecar/tracers/ring_reader.h"
#include "spdlog/spdlog.h"

namespace clusterprof::sidecar {

absl::StatusOr<std::unique_ptr<ShmTransport>> ShmTransport::Create(Options options) {
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        StrCat("cannot create the shared-memory directory ", options.dir, ": ", ec.message()));
  }
  struct statfs fs;
  constexpr long kTmpfsMagic = 0x01021994;
  if (statfs(options.dir.c_str(), &fs) == 0 && fs.f_type != kTmpfsMagic) {
    spdlog::warn(
        "the shared-memory directory {} is not on tmpfs: the kernel will write the workloads' "
        "ring pages back to disk, which slows annotations down; use tmpfs (in Kubernetes an "
        "emptyDir with medium: Memory)",
        options.dir);
  }
  std::string error;
  std::unique_ptr<shm::ControlWriter> control = shm::ControlWriter::Create(options.dir, &error);
  if (control == nullptr) return absl::FailedPreconditionError(error);
  return std::unique_ptr<ShmTransport>(new ShmTransport(std::move(options), std::move(control)));
}

absl::StatusOr<std::vector<std::string>> ShmTransport::ListRings(std::string_view prefix) const {
  return shm::ListRingFiles(options_.dir, prefix);
}

bool ShmTransport::DirectoryChanged(timespec* seen) const {
  struct stat st;
  if (stat(options_.dir.c_str(), &st) != 0) return false;
  if (st.st_mtim.tv_sec == seen->tv_sec && st.st_mtim.tv_nsec == seen->tv_nsec) return false;
  *seen = st.st_mtim;
  return true;
}

bool ShmTransport::WriterAlive(const std::string& path, uint32_t pid, uint64_t start_ticks) const {
  return shm::WriterAlive(path, options_.proc_root, pid, start_ticks);
}

void ShmTransport::RemoveIfExited(const std::string& path, uint32_t pid, uint64_t start_ticks,
                                  std::string_view what) const {
  shm::RemoveRingIfExited(options_.proc_root, path, pid, start_ticks, what);
}

}  // namespace clusterprof::sidecar
