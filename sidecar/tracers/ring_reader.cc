#include "sidecar/tracers/ring_reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "sdk/ring_writer.h"
#include "sdk/shm_file.h"
#include "spdlog/spdlog.h"

namespace clusterprof::shm {

absl::StatusOr<std::unique_ptr<RingReader>> RingReader::Open(const std::string& path) {
  CLUSTERPROF_ASSIGN_OR_RETURN(const MappedRing mapped,
                               MapRingFile(path, sizeof(RingHeader), "ring"));
  const size_t size = mapped.size;
  std::unique_ptr<RingReader> reader(new RingReader(path, mapped));

  const RingHeader& h = *reader->header_;
  CLUSTERPROF_RETURN_IF_ERROR((CheckRingFormat<RingHeader, Record>(h, kRingMagic, "ring", path)));
  const uint32_t threads = h.max_threads;
  const uint32_t slots = h.slots_per_thread;
  const uint64_t slots_offset = h.slots_offset;
  const uint64_t records_offset = h.records_offset;
  if (threads == 0 || threads > 65536 || slots == 0 || (slots & (slots - 1)) != 0 ||
      slots > (1u << 30) || slots_offset % alignof(ThreadSlot) != 0 ||
      records_offset % alignof(Record) != 0 ||
      !FitsInFile(size, slots_offset, uint64_t{threads} * sizeof(ThreadSlot)) ||
      !FitsInFile(size, records_offset, uint64_t{threads} * slots * sizeof(Record)) ||
      !reader->file_.TakeHeader(h)) {
    return InconsistentRingLayout("ring", path);
  }
  reader->max_threads_ = threads;
  reader->slots_ = slots;
  reader->slots_offset_ = slots_offset;
  reader->records_offset_ = records_offset;
  reader->last_dropped_.assign(threads, 0);
  return reader;
}

RingReader::RingReader(std::string path, MappedRing mapping)
    : file_(std::move(path), mapping), header_(reinterpret_cast<RingHeader*>(mapping.base)) {}

RingReader::~RingReader() = default;

std::string_view RingReader::String(uint32_t id) const { return file_.String(id); }

uint64_t RingReader::dropped_strings() const {
  return header_->dropped_strings.load(std::memory_order_relaxed);
}

uint32_t RingReader::dropped_threads() const {
  return header_->dropped_threads.load(std::memory_order_relaxed);
}

DrainStats RingReader::Drain(const std::function<void(const ThreadInfo&, const Record&)>& visit) {
  const SpanVisitor each = [&visit](const ThreadInfo& info, std::span<const Record> records) {
    for (const Record& record : records) visit(info, record);
  };
  return DrainImpl(&each);
}

DrainStats RingReader::DrainSpans(const SpanVisitor& visit) { return DrainImpl(&visit); }

DrainStats RingReader::Skip() { return DrainImpl(nullptr); }

DrainStats RingReader::DrainImpl(const SpanVisitor* visit) {
  DrainStats stats;
  auto* slots = reinterpret_cast<ThreadSlot*>(file_.base() + slots_offset_);
  auto* records = reinterpret_cast<const Record*>(file_.base() + records_offset_);
  const uint32_t claimed =
      std::min(header_->threads_claimed.load(std::memory_order_acquire), max_threads_);
  for (uint32_t i = 0; i < claimed; ++i) {
    ThreadSlot& slot = slots[i];
    const uint32_t tid = slot.tid.load(std::memory_order_acquire);
    if (tid == 0) continue;
    const uint64_t dropped = slot.dropped.load(std::memory_order_relaxed);
    stats.dropped += dropped - std::min(dropped, last_dropped_[i]);
    last_dropped_[i] = dropped;
    const uint64_t write = slot.write_index.load(std::memory_order_acquire);
    uint64_t read = slot.read_index.load(std::memory_order_relaxed);
    if (write < read || write - read > slots_) {
      // Only a broken or hostile writer gets here: skip to what can still be in the ring.
      read = write < read ? write : write - slots_;
    }
    if (visit != nullptr) {
      const ThreadInfo info{i, tid, String(slot.name_id.load(std::memory_order_acquire))};
      // At most two contiguous pieces: up to the end of the ring, then from its start.
      const Record* ring = records + uint64_t{i} * slots_;
      uint64_t r = read;
      while (r < write) {
        const uint64_t index = r & (slots_ - 1);
        const uint64_t count = std::min<uint64_t>(write - r, slots_ - index);
        (*visit)(info, std::span<const Record>(ring + index, count));
        r += count;
      }
    }
    stats.records += write - read;
    slot.read_index.store(write, std::memory_order_release);
  }
  return stats;
}

absl::StatusOr<std::vector<std::string>> ListRingFiles(const std::string& dir,
                                                       std::string_view prefix) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoToStatus(errno, "cannot list", dir);
  std::vector<std::string> paths;
  while (dirent* entry = readdir(d)) {
    const std::string_view name = entry->d_name;
    if (name.starts_with(prefix) && name.ends_with(kRingSuffix)) {
      paths.push_back(dir + "/" + std::string(name));
    }
  }
  closedir(d);
  std::sort(paths.begin(), paths.end());
  return paths;
}

bool WriterAlive(const std::string& path, const std::string& proc_root, uint32_t pid,
                 uint64_t start_ticks) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const bool locked_by_writer = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);  // drops the lock if this took it
    if (locked_by_writer) return true;
  }
  return ProcessAlive(proc_root, pid, start_ticks);
}

void RemoveRingIfExited(const std::string& proc_root, const std::string& path, uint32_t pid,
                        uint64_t start_ticks, std::string_view what) {
  if (WriterAlive(path, proc_root, pid, start_ticks)) return;
  if (unlink(path.c_str()) == 0) {
    spdlog::info("removed the {} of exited process {} ({})", what, pid, path);
  }
}

bool ProcessAlive(const std::string& proc_root, uint32_t pid, uint64_t start_ticks) {
  const uint64_t ticks = ProcessStartTicks(proc_root, static_cast<int>(pid));
  if (ticks == 0 || ticks != start_ticks) return false;
  // A zombie (exited, not yet reaped by its parent) writes no more: its ring is final.
  std::ifstream in(StrCat(proc_root, "/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace clusterprof::shm
