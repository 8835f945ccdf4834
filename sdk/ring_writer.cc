#include "sdk/ring_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "sdk/shm_file.h"

namespace clusterprof::shm {
uint64_t ProcessStartTicks(const std::string& proc_root, int pid) {
  std::ifstream in(proc_root + "/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  // Fields 3.. follow; the start time is field 22, the 20th after the parenthesis.
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return 0;
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

std::string RingFileName(int pid, uint64_t start_ticks) {
  return std::string(kRingPrefix) + std::to_string(pid) + "-" + std::to_string(start_ticks) +
         kRingSuffix;
}

std::unique_ptr<RingWriter> RingWriter::Create(const std::string& dir, const RingOptions& options,
                                               std::string* error) {
  const uint32_t threads = options.max_threads == 0 ? 1 : options.max_threads;
  const auto slots = static_cast<uint32_t>(
      RoundUpToPowerOfTwo(options.slots_per_thread == 0 ? 1 : options.slots_per_thread, 1u << 30));
  const uint64_t slots_offset = AlignUp(sizeof(RingHeader), 4096);
  const uint64_t records_offset = AlignUp(slots_offset + threads * sizeof(ThreadSlot), 4096);
  const uint64_t strings_offset =
      AlignUp(records_offset + uint64_t{threads} * slots * sizeof(Record), 4096);
  const uint64_t file_size = AlignUp(strings_offset + options.strings_capacity, 4096);

  const int pid = getpid();
  const uint64_t ticks = ProcessStartTicks("/proc", pid);
  const std::string path = dir + "/" + RingFileName(pid, ticks);
  int lock_fd = -1;
  void* base = CreateTempShmFile(path, file_size, error, &lock_fd);
  if (base == nullptr) return nullptr;
  auto* header = new (base) RingHeader();
  header->magic = kRingMagic;
  header->version = kVersion;
  header->header_size = sizeof(RingHeader);
  header->pid = static_cast<uint32_t>(pid);
  header->max_threads = threads;
  header->process_start_ticks = ticks;
  header->slots_per_thread = slots;
  header->record_size = sizeof(Record);
  header->slots_offset = slots_offset;
  header->records_offset = records_offset;
  header->strings_offset = strings_offset;
  header->strings_capacity = options.strings_capacity;
  header->file_size = file_size;
  std::strncpy(header->process_name, options.process_name.c_str(),
               sizeof(header->process_name) - 1);
  auto* slot_array = reinterpret_cast<ThreadSlot*>(static_cast<char*>(base) + slots_offset);
  for (uint32_t i = 0; i < threads; ++i) new (&slot_array[i]) ThreadSlot();
  if (!PublishShmFile(path, base, file_size, error)) {
    close(lock_fd);
    return nullptr;
  }
  return std::unique_ptr<RingWriter>(new RingWriter(path, base, file_size, lock_fd));
}

RingWriter::RingWriter(std::string path, void* base, size_t size, int lock_fd)
    : path_(std::move(path)),
      lock_fd_(lock_fd),
      base_(base),
      size_(size),
      header_(static_cast<RingHeader*>(base)),
      threads_(new std::unique_ptr<ThreadRing>[header_->max_threads]),
      strings_(std::make_unique<StringInterner>(static_cast<char*>(base) + header_->strings_offset,
                                                header_->strings_capacity, header_->strings_used,
                                                header_->dropped_strings)) {}

RingWriter::~RingWriter() {
  munmap(base_, size_);
  close(lock_fd_);  // the sidecar may now remove the file
}

ThreadRing* RingWriter::ClaimThread(uint32_t tid) {
  const uint32_t index = header_->threads_claimed.fetch_add(1, std::memory_order_relaxed);
  if (index >= header_->max_threads) {
    header_->threads_claimed.fetch_sub(1, std::memory_order_relaxed);
    header_->dropped_threads.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  char* base = static_cast<char*>(base_);
  auto* slot = reinterpret_cast<ThreadSlot*>(base + header_->slots_offset) + index;
  auto* records = reinterpret_cast<Record*>(base + header_->records_offset) +
                  uint64_t{index} * header_->slots_per_thread;
  slot->tid.store(tid, std::memory_order_release);
  auto ring = std::make_unique<ThreadRing>(slot, records, header_->slots_per_thread);
  ThreadRing* result = ring.get();
  std::lock_guard<std::mutex> lock(mu_);
  threads_[index] = std::move(ring);
  return result;
}

uint32_t RingWriter::Intern(std::string_view text) { return strings_->Intern(text); }

}  // namespace clusterprof::shm
