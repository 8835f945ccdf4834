#include "sidecar/sdk/control_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace clusterprof::shm {

const ControlPage& ControlReader::OffPage() {
  static const ControlPage* const page = [] {
    auto* p = new ControlPage();
    p->magic = kControlMagic;
    p->version = kVersion;
    p->size = sizeof(ControlPage);
    return p;
  }();
  return *page;
}

std::unique_ptr<ControlWriter> ControlWriter::Create(const std::string& dir, std::string* error) {
  const std::string path = dir + "/" + kControlFileName;
  const std::string temp = path + ".tmp";
  const int fd = open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot create " + temp + ": " + std::strerror(errno);
    return nullptr;
  }
  const size_t size = 4096;
  if (ftruncate(fd, size) != 0) {
    *error = "cannot size " + temp + ": " + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    *error = "cannot map " + temp + ": " + std::strerror(errno);
    return nullptr;
  }
  auto* page = new (base) ControlPage();
  page->magic = kControlMagic;
  page->version = kVersion;
  page->size = sizeof(ControlPage);
  std::atomic_thread_fence(std::memory_order_release);
  if (rename(temp.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + temp + ": " + std::strerror(errno);
    munmap(base, size);
    return nullptr;
  }
  return std::unique_ptr<ControlWriter>(new ControlWriter(path, page));
}

ControlWriter::~ControlWriter() {
  Disarm();
  munmap(page_, 4096);
}

uint64_t ControlWriter::Arm(uint32_t host_level, uint32_t device_level, int64_t start_ns,
                            int64_t stop_ns) {
  page_->start_ns.store(start_ns, std::memory_order_relaxed);
  page_->stop_ns.store(stop_ns, std::memory_order_relaxed);
  const uint64_t seq = page_->session_seq.fetch_add(1, std::memory_order_acq_rel) + 1;
  page_->device_level.store(device_level, std::memory_order_release);
  page_->host_level.store(host_level, std::memory_order_release);
  return seq;
}

void ControlWriter::Disarm() {
  page_->host_level.store(0, std::memory_order_release);
  page_->device_level.store(0, std::memory_order_release);
}

bool ControlReader::TryAttach(const std::string& dir) {
  if (attached()) return true;
  const std::string path = dir + "/" + kControlFileName;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(ControlPage)) {
    close(fd);
    return false;
  }
  void* base = mmap(nullptr, sizeof(ControlPage), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return false;
  const auto* page = static_cast<const ControlPage*>(base);
  if (page->magic != kControlMagic || page->version != kVersion) {
    munmap(base, sizeof(ControlPage));
    return false;
  }
  const ControlPage* expected = &OffPage();
  if (!page_.compare_exchange_strong(expected, page, std::memory_order_acq_rel)) {
    munmap(base, sizeof(ControlPage));  // another thread attached first
  }
  return true;
}

ControlReader::~ControlReader() {
  const ControlPage* page = page_.load(std::memory_order_acquire);
  if (page != &OffPage()) munmap(const_cast<ControlPage*>(page), sizeof(ControlPage));
}

}  // namespace clusterprof::shm
