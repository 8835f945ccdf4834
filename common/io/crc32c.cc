#include "common/io/crc32c.h"

#include <algorithm>
#include <climits>

#include "absl/strings/escaping.h"
#include "isa-l/crc.h"

namespace clusterprof {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  // crc32_iscsi neither pre- nor post-inverts, and takes an int length.
  uint32_t state = ~crc;
  auto* bytes = static_cast<unsigned char*>(const_cast<void*>(data));
  while (size > 0) {
    const size_t n = std::min<size_t>(size, INT_MAX & ~size_t{4095});
    state = crc32_iscsi(bytes, static_cast<int>(n), state);
    bytes += n;
    size -= n;
  }
  return ~state;
}

std::string Crc32cToBase64(uint32_t crc) {
  const char bytes[4] = {static_cast<char>(crc >> 24), static_cast<char>(crc >> 16),
                         static_cast<char>(crc >> 8), static_cast<char>(crc)};
  return absl::Base64Escape(absl::string_view(bytes, 4));
}

std::optional<uint32_t> Crc32cFromBase64(std::string_view text) {
  std::string bytes;
  if (!absl::Base64Unescape(absl::string_view(text.data(), text.size()), &bytes) ||
      bytes.size() != 4) {
    return std::nullopt;
  }
  uint32_t crc = 0;
  for (unsigned char c : bytes) crc = (crc << 8) | c;
  return crc;
}

}  // namespace clusterprof
