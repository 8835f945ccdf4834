#include "common/io/gzip_sink.h"

#include <isa-l/igzip_lib.h>
#include <zlib.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/base/strings.h"

namespace clusterprof::io {
namespace {

// zlib's windowBits for a gzip wrapper around a raw deflate stream.
constexpr int kGzipWindowBits = 15 + 16;
constexpr size_t kOutputChunk = 256 * 1024;

}  // namespace

struct GzipSink::State {
  bool use_isal = false;
  z_stream zlib{};
  bool zlib_initialized = false;
  isal_zstream isal{};
  std::vector<uint8_t> isal_level_buffer;
};

GzipSink::GzipSink(ByteSink* out, int level) : out_(out), state_(std::make_unique<State>()) {
  output_.resize(kOutputChunk);
  if (level < 0 || level > 9) {
    status_ = absl::InvalidArgumentError(StrCat("gzip level must be 0 to 9, not ", level));
    return;
  }
  if (level >= 1 && level <= 3) {
    state_->use_isal = true;
    isal_zstream& zs = state_->isal;
    isal_deflate_init(&zs);
    zs.level = static_cast<uint32_t>(level);
    const size_t buffer_size = level == 1   ? ISAL_DEF_LVL1_DEFAULT
                               : level == 2 ? ISAL_DEF_LVL2_DEFAULT
                                            : ISAL_DEF_LVL3_DEFAULT;
    state_->isal_level_buffer.resize(buffer_size);
    zs.level_buf = state_->isal_level_buffer.data();
    zs.level_buf_size = static_cast<uint32_t>(buffer_size);
    zs.gzip_flag = IGZIP_GZIP;
    zs.flush = NO_FLUSH;
    return;
  }
  const int rc = deflateInit2(&state_->zlib, level, Z_DEFLATED, kGzipWindowBits,
                              /*memLevel=*/8, Z_DEFAULT_STRATEGY);
  if (rc != Z_OK) {
    status_ = absl::InternalError(StrCat("zlib deflateInit2 failed with code ", rc));
    return;
  }
  state_->zlib_initialized = true;
}

GzipSink::~GzipSink() {
  if (state_->zlib_initialized) deflateEnd(&state_->zlib);
}

absl::Status GzipSink::Emit(size_t produced) {
  if (produced == 0) return absl::OkStatus();
  bytes_out_ += produced;
  return out_->Append(std::string_view(output_.data(), produced));
}

absl::Status GzipSink::Deflate(const char* data, size_t size, bool finish) {
  return state_->use_isal ? DeflateIsal(data, size, finish) : DeflateZlib(data, size, finish);
}

absl::Status GzipSink::DeflateIsal(const char* data, size_t size, bool finish) {
  isal_zstream& zs = state_->isal;
  zs.next_in = reinterpret_cast<uint8_t*>(const_cast<char*>(data));
  zs.avail_in = static_cast<uint32_t>(size);
  zs.end_of_stream = finish ? 1 : 0;
  while (true) {
    zs.next_out = reinterpret_cast<uint8_t*>(output_.data());
    zs.avail_out = static_cast<uint32_t>(output_.size());
    const int rc = isal_deflate(&zs);
    if (rc != COMP_OK) return absl::InternalError(StrCat("isa-l deflate failed with code ", rc));
    CLUSTERPROF_RETURN_IF_ERROR(Emit(output_.size() - zs.avail_out));
    if (finish) {
      if (zs.internal_state.state == ZSTATE_END) return absl::OkStatus();
    } else if (zs.avail_in == 0) {
      return absl::OkStatus();
    }
  }
}

absl::Status GzipSink::DeflateZlib(const char* data, size_t size, bool finish) {
  z_stream& zs = state_->zlib;
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
  zs.avail_in = static_cast<uInt>(size);
  const int flush = finish ? Z_FINISH : Z_NO_FLUSH;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(output_.data());
    zs.avail_out = static_cast<uInt>(output_.size());
    const int rc = deflate(&zs, flush);
    if (rc == Z_STREAM_ERROR) return absl::InternalError("zlib deflate failed: stream error");
    CLUSTERPROF_RETURN_IF_ERROR(Emit(output_.size() - zs.avail_out));
    if (finish) {
      if (rc == Z_STREAM_END) return absl::OkStatus();
    } else if (zs.avail_in == 0 && zs.avail_out != 0) {
      return absl::OkStatus();
    }
  }
}

absl::Status GzipSink::Append(std::string_view data) {
  if (!status_.ok()) return status_;
  if (finished_) return absl::FailedPreconditionError("append to a finished gzip stream");
  bytes_in_ += data.size();
  // zlib's avail_in is 32-bit; feed very large inputs in pieces.
  constexpr size_t kMaxPiece = 1u << 30;
  while (!data.empty()) {
    const size_t piece = std::min(data.size(), kMaxPiece);
    status_ = Deflate(data.data(), piece, /*finish=*/false);
    if (!status_.ok()) return status_;
    data.remove_prefix(piece);
  }
  return absl::OkStatus();
}

absl::Status GzipSink::Finish() {
  if (!status_.ok()) return status_;
  if (finished_) return absl::OkStatus();
  finished_ = true;
  status_ = Deflate(nullptr, 0, /*finish=*/true);
  return status_;
}

absl::Status GunzipString(std::string_view compressed, std::string* out) {
  z_stream zs{};
  if (inflateInit2(&zs, kGzipWindowBits) != Z_OK) return absl::InternalError("inflateInit2 failed");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  zs.avail_in = static_cast<uInt>(compressed.size());
  char buffer[64 * 1024];
  absl::Status status;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(buffer);
    zs.avail_out = sizeof(buffer);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out->append(buffer, sizeof(buffer) - zs.avail_out);
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      // Another gzip member follows.
      inflateReset(&zs);
      continue;
    }
    if (rc != Z_OK) {
      status = absl::DataLossError(StrCat("gzip data is corrupt or truncated (zlib code ", rc,
                                          zs.msg ? StrCat(": ", zs.msg) : "", ")"));
      break;
    }
    if (zs.avail_in == 0 && zs.avail_out != 0) {
      status = absl::DataLossError("gzip data is truncated");
      break;
    }
  }
  inflateEnd(&zs);
  return status;
}

}  // namespace clusterprof::io
