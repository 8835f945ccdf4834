// CRC32C (Castagnoli), the checksum GCS keeps for every object, computed with ISA-L's
// crc32_iscsi (SSE4.2/PCLMUL when the CPU has them).
//
// GCS reports it as base64 of the 4 bytes in big-endian order ("crc32c": "yZRlqg==").
#ifndef CLUSTERPROF_COMMON_IO_CRC32C_H_
#define CLUSTERPROF_COMMON_IO_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace clusterprof {

// The CRC32C of `crc`'s data followed by `data`; start with 0 for an empty prefix.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(std::string_view data) { return Crc32cExtend(0, data.data(), data.size()); }

// GCS's text form: base64 of the big-endian bytes.
std::string Crc32cToBase64(uint32_t crc);
// The inverse; nullopt when `text` is not base64 of exactly 4 bytes.
std::optional<uint32_t> Crc32cFromBase64(std::string_view text);

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_IO_CRC32C_H_
