#include "sdk/gpu_ring_writer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "sdk/ring_writer.h"
#include "sdk/shm_file.h"

namespace clusterprof::shm {

std::string GpuRingFileName(int pid, uint64_t start_ticks) {
  return std::string(kGpuRingPrefix) + std::to_string(pid) + "-" + std::to_string(start_ticks) +
         kRingSuffix;
}

std::unique_ptr<GpuRingWriter> GpuRingWriter::Create(const std::string& dir, uint64_t capacity,
                                                     const std::string& process_name,
                                                     std::string* error) {
  const uint64_t records = RoundUpToPowerOfTwo(std::max<uint64_t>(capacity, 1), uint64_t{1} << 26);
  const uint64_t records_offset = AlignUp(sizeof(GpuRingHeader), 4096);
  const uint64_t strings_offset = AlignUp(records_offset + records * sizeof(GpuRecord), 4096);
  const uint64_t file_size = AlignUp(strings_offset + kDefaultGpuStringsCapacity, 4096);

  const int pid = getpid();
  const uint64_t ticks = ProcessStartTicks("/proc", pid);
  const std::string path = dir + "/" + GpuRingFileName(pid, ticks);
  int lock_fd = -1;
  void* base = CreateTempShmFile(path, file_size, error, &lock_fd);
  if (base == nullptr) return nullptr;
  auto* header = new (base) GpuRingHeader();
  header->magic = kGpuRingMagic;
  header->version = kVersion;
  header->header_size = sizeof(GpuRingHeader);
  header->pid = static_cast<uint32_t>(pid);
  header->record_size = sizeof(GpuRecord);
  header->process_start_ticks = ticks;
  header->capacity = records;
  header->records_offset = records_offset;
  header->strings_offset = strings_offset;
  header->strings_capacity = kDefaultGpuStringsCapacity;
  header->file_size = file_size;
  std::strncpy(header->process_name, process_name.c_str(), sizeof(header->process_name) - 1);
  if (!PublishShmFile(path, base, file_size, error)) {
    close(lock_fd);
    return nullptr;
  }
  return std::unique_ptr<GpuRingWriter>(new GpuRingWriter(path, base, file_size, lock_fd));
}

GpuRingWriter::GpuRingWriter(std::string path, void* base, size_t size, int lock_fd)
    : path_(std::move(path)),
      lock_fd_(lock_fd),
      base_(base),
      size_(size),
      header_(static_cast<GpuRingHeader*>(base)),
      records_(reinterpret_cast<GpuRecord*>(static_cast<char*>(base) + header_->records_offset)),
      strings_(std::make_unique<StringInterner>(static_cast<char*>(base) + header_->strings_offset,
                                                header_->strings_capacity, header_->strings_used,
                                                header_->dropped_strings)) {}

GpuRingWriter::~GpuRingWriter() {
  munmap(base_, size_);
  close(lock_fd_);  // the sidecar may now remove the file
}

size_t GpuRingWriter::Append(std::span<const GpuRecord> records, std::chrono::microseconds max_wait,
                             const SleepFn& sleep) {
  std::lock_guard<std::mutex> lock(append_mu_);
  const uint64_t capacity = header_->capacity;
  const uint64_t mask = capacity - 1;
  std::chrono::microseconds waited{0};
  std::chrono::microseconds pause{100};
  size_t written = 0;
  while (!records.empty()) {
    const uint64_t write = header_->write_index.load(std::memory_order_relaxed);
    const uint64_t read = header_->read_index.load(std::memory_order_acquire);
    const uint64_t room = capacity - std::min(write - read, capacity);
    if (room == 0) {
      if (waited >= max_wait) break;
      sleep(pause);
      waited += pause;
      pause = std::min(pause * 2, std::chrono::microseconds(5000));
      continue;
    }
    const size_t count = static_cast<size_t>(std::min<uint64_t>(room, records.size()));
    for (size_t i = 0; i < count; ++i) records_[(write + i) & mask] = records[i];
    header_->write_index.store(write + count, std::memory_order_release);
    records = records.subspan(count);
    written += count;
  }
  if (!records.empty()) header_->dropped.fetch_add(records.size(), std::memory_order_relaxed);
  return written;
}

uint32_t GpuRingWriter::Intern(std::string_view text) { return strings_->Intern(text); }

void GpuRingWriter::SetError(std::string_view message) {
  const size_t n = std::min(message.size(), sizeof(header_->error) - 1);
  std::memcpy(header_->error, message.data(), n);
  header_->error[n] = '\0';
  header_->error_seq.fetch_add(1, std::memory_order_release);
  header_->state.store(static_cast<uint32_t>(GpuState::kFailed), std::memory_order_release);
}

}  // namespace clusterprof::shm
