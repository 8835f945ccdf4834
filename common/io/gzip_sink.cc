#include "common/io/gzip_sink.h"

#include <zlib.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/strings.h"

namespace clusterprof::io {
namespace {

// zlib's windowBits for a gzip wrapper around a raw deflate stream.
constexpr int kGzipWindowBits = 15 + 16;
constexpr size_t kOutputChunk = 256 * 1024;

}  // namespace

struct GzipSink::State {
  z_stream stream{};
  bool initialized = false;
};

GzipSink::GzipSink(ByteSink* out, int level) : out_(out), state_(std::make_unique<State>()) {
  const int rc = deflateInit2(&state_->stream, level, Z_DEFLATED, kGzipWindowBits,
                              /*memLevel=*/8, Z_DEFAULT_STRATEGY);
  if (rc != Z_OK) {
    status_ = absl::InternalError(StrCat("zlib deflateInit2 failed with code ", rc));
    return;
  }
  state_->initialized = true;
  output_.resize(kOutputChunk);
}

GzipSink::~GzipSink() {
  if (state_->initialized) deflateEnd(&state_->stream);
}

absl::Status GzipSink::Deflate(const char* data, size_t size, bool finish) {
  z_stream& zs = state_->stream;
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
  zs.avail_in = static_cast<uInt>(size);
  const int flush = finish ? Z_FINISH : Z_NO_FLUSH;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(output_.data());
    zs.avail_out = static_cast<uInt>(output_.size());
    const int rc = deflate(&zs, flush);
    if (rc == Z_STREAM_ERROR) return absl::InternalError("zlib deflate failed: stream error");
    const size_t produced = output_.size() - zs.avail_out;
    if (produced > 0) {
      bytes_out_ += produced;
      if (absl::Status s = out_->Append(std::string_view(output_.data(), produced)); !s.ok()) {
        return s;
      }
    }
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
