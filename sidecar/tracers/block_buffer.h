// Records copied out of a shared-memory ring, kept in fixed-size blocks: appending never moves
// what is there (a growing vector would copy hundreds of MB while a tracer's drainer holds its
// lock). Not thread-safe.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_BLOCK_BUFFER_H_
#define CLUSTERPROF_SIDECAR_TRACERS_BLOCK_BUFFER_H_

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

namespace clusterprof::sidecar {

// `T` is a plain record type (copied with memcpy); a block holds 512 KiB of 64-byte records.
template <typename T, size_t kBlock = 8192>
class BlockBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  void Append(std::span<const T> records) {
    while (!records.empty()) {
      const size_t offset = size_ % kBlock;
      if (offset == 0 && size_ / kBlock == blocks_.size()) {
        blocks_.push_back(std::make_unique_for_overwrite<T[]>(kBlock));
      }
      const size_t count = std::min(records.size(), kBlock - offset);
      std::memcpy(&blocks_[size_ / kBlock][offset], records.data(), count * sizeof(T));
      size_ += count;
      records = records.subspan(count);
    }
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (size_t i = 0; i < size_; ++i) fn(blocks_[i / kBlock][i % kBlock]);
  }

 private:
  std::vector<std::unique_ptr<T[]>> blocks_;
  size_t size_ = 0;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_BLOCK_BUFFER_H_
