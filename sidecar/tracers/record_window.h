// One thread's annotations kept by the flight recorder (docs/triggers.md): records in the order
// the thread wrote them, in small blocks, so the oldest can be let go a block at a time without
// moving the rest. Not thread-safe.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_RECORD_WINDOW_H_
#define CLUSTERPROF_SIDECAR_TRACERS_RECORD_WINDOW_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "sdk/shm_format.h"

namespace clusterprof::sidecar {

class RecordWindow {
 public:
  // 16 KiB of 64-byte records: a thread that annotates rarely holds little.
  static constexpr size_t kBlockRecords = 256;

  void Append(std::span<const shm::Record> records) {
    while (!records.empty()) {
      if (front_ == blocks_.size() || blocks_.back()->size == kBlockRecords) {
        blocks_.push_back(std::make_unique<Block>());
      }
      Block& block = *blocks_.back();
      const size_t count = std::min(records.size(), kBlockRecords - block.size);
      std::memcpy(&block.records[block.size], records.data(), count * sizeof(shm::Record));
      for (size_t i = 0; i < count; ++i) {
        block.max_end_ns = std::max(block.max_end_ns, records[i].end_ns);
      }
      block.size += count;
      size_ += count;
      records = records.subspan(count);
    }
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The latest end among the records of the oldest block: the block may go once that is older
  // than the window. INT64_MAX when empty.
  int64_t OldestBlockEnd() const {
    return front_ == blocks_.size() ? std::numeric_limits<int64_t>::max()
                                    : blocks_[front_]->max_end_ns;
  }
  // Lets the oldest block go; returns how many records it held.
  size_t DropOldestBlock() {
    if (front_ == blocks_.size()) return 0;
    const size_t count = blocks_[front_]->size;
    blocks_[front_++].reset();
    size_ -= count;
    // The vector of block pointers is compacted now and then, not on every drop.
    if (front_ == blocks_.size() || front_ >= 64) {
      blocks_.erase(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(front_));
      front_ = 0;
    }
    return count;
  }
  // Calls `fn(record)` for each record that ends at or after `cutoff_ns`, oldest first.
  template <typename Fn>
  void ForEachEndingSince(int64_t cutoff_ns, Fn&& fn) const {
    for (size_t b = front_; b < blocks_.size(); ++b) {
      const Block* block = blocks_[b].get();
      if (block->max_end_ns < cutoff_ns) continue;
      for (size_t i = 0; i < block->size; ++i) {
        if (block->records[i].end_ns >= cutoff_ns) fn(block->records[i]);
      }
    }
  }

 private:
  struct Block {
    std::array<shm::Record, kBlockRecords> records;
    size_t size = 0;
    int64_t max_end_ns = std::numeric_limits<int64_t>::min();
  };
  // Blocks before front_ have been let go (null).
  std::vector<std::unique_ptr<Block>> blocks_;
  size_t front_ = 0;
  size_t size_ = 0;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_RECORD_WINDOW_H_
