#include "sdk/shm_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace clusterprof::shm {

void* CreateTempShmFile(const std::string& path, uint64_t size, std::string* error, int* lock_fd) {
  const std::string temp = path + ".tmp";
  // The directory is shared with the pod's other containers: whatever waits at the temporary
  // name (a stale file, or a link planted to make this process write elsewhere) is removed, and
  // the file is made new, never through a link.
  unlink(temp.c_str());
  const int fd = open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot create " + temp + ": " + std::strerror(errno);
    return nullptr;
  }
  // Read and written by the sidecar, which in Kubernetes runs under its own user id in the same
  // pod: the directory is the pod's own volume, so the file is open to the pod only.
  fchmod(fd, 0666);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    *error = "cannot size " + temp + ": " + std::strerror(errno);
    close(fd);
    unlink(temp.c_str());
    return nullptr;
  }
  // Locked before the file is published: a reader never sees a live writer's ring unlocked.
  if (lock_fd != nullptr && flock(fd, LOCK_SH) != 0) {
    *error = "cannot lock " + temp + ": " + std::strerror(errno);
    close(fd);
    unlink(temp.c_str());
    return nullptr;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *error = "cannot map " + temp + ": " + std::strerror(errno);
    close(fd);
    unlink(temp.c_str());
    return nullptr;
  }
  if (lock_fd != nullptr) {
    *lock_fd = fd;
  } else {
    close(fd);
  }
  return base;
}

bool PublishShmFile(const std::string& path, void* base, uint64_t size, std::string* error) {
  const std::string temp = path + ".tmp";
  std::atomic_thread_fence(std::memory_order_release);
  if (rename(temp.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + temp + ": " + std::strerror(errno);
    munmap(base, size);
    unlink(temp.c_str());
    return false;
  }
  return true;
}

uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

uint64_t RoundUpToPowerOfTwo(uint64_t value, uint64_t max) {
  uint64_t result = 1;
  while (result < value && result < max) result <<= 1;
  return result;
}

}  // namespace clusterprof::shm
