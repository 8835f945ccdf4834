#include "sdk/control_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "sdk/shm_file.h"

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
  const size_t size = 4096;
  void* base = CreateTempShmFile(path, size, error);
  if (base == nullptr) return nullptr;
  auto* page = new (base) ControlPage();
  page->magic = kControlMagic;
  page->version = kVersion;
  page->size = sizeof(ControlPage);
  if (!PublishShmFile(path, base, size, error)) return nullptr;
  return std::unique_ptr<ControlWriter>(new ControlWriter(path, page));
}

ControlWriter::~ControlWriter() {
  Disarm();
  munmap(page_, 4096);
}

uint64_t ControlWriter::ArmHost(uint32_t host_level, int64_t start_ns, int64_t stop_ns) {
  page_->start_ns.store(start_ns, std::memory_order_relaxed);
  page_->stop_ns.store(stop_ns, std::memory_order_relaxed);
  const uint64_t seq = page_->session_seq.fetch_add(1, std::memory_order_acq_rel) + 1;
  page_->host_level.store(host_level, std::memory_order_release);
  return seq;
}

void ControlWriter::DisarmHost() { page_->host_level.store(0, std::memory_order_release); }

uint64_t ControlWriter::ArmDevice(const DeviceArming& arming) {
  page_->gpu_max_activity_events.store(arming.max_activity_events, std::memory_order_relaxed);
  page_->gpu_max_api_events.store(arming.max_api_events, std::memory_order_relaxed);
  page_->gpu_flags.store(arming.flags, std::memory_order_relaxed);
  const uint64_t seq = page_->device_seq.fetch_add(1, std::memory_order_acq_rel) + 1;
  page_->device_level.store(arming.level, std::memory_order_release);
  return seq;
}

void ControlWriter::DisarmDevice() { page_->device_level.store(0, std::memory_order_release); }

void ControlWriter::Disarm() {
  DisarmHost();
  DisarmDevice();
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
