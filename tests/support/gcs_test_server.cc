#include "tests/support/gcs_test_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "common/base/check.h"
#include "common/base/json_escape.h"
#include "common/base/strings.h"
#include "common/http/status.h"
#include "common/io/crc32c.h"
#include "cpprest/json.h"

namespace clusterprof::testing {
namespace {

// Limits on a request head, and the size of the pieces bodies are read, hashed and written in.
constexpr size_t kMaxHeadBytes = size_t{64} * 1024;
constexpr size_t kIoBytes = size_t{1} << 20;
// Bodies at least this large have their MD5 computed on a helper thread, beside the reads.
constexpr uint64_t kPipelineBytes = uint64_t{8} << 20;
// Resumable-initiation and multipart metadata larger than this are rejected.
constexpr size_t kMaxMetadataBytes = size_t{1} << 20;
// How long a request waits for another request on the same resumable session to finish.
constexpr auto kSessionBusyWait = std::chrono::seconds(30);

using Headers = std::vector<std::pair<std::string, std::string>>;

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool ContainsIgnoreCase(std::string_view text, std::string_view word) {
  for (size_t i = 0; i + word.size() <= text.size(); ++i) {
    if (EqualsIgnoreCase(text.substr(i, word.size()), word)) return true;
  }
  return false;
}

const std::string* FindHeader(const Headers& headers, std::string_view name) {
  for (const auto& [key, value] : headers) {
    if (EqualsIgnoreCase(key, name)) return &value;
  }
  return nullptr;
}

// A whole decimal (or hex) number, nothing else but surrounding whitespace.
std::optional<uint64_t> ParseUint(std::string_view text, int base = 10) {
  text = StripAsciiWhitespace(text);
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

std::optional<int64_t> ParseInt(std::string_view text) {
  text = StripAsciiWhitespace(text);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

bool ParseHeaders(std::string_view block, Headers* headers) {
  for (std::string_view line : SplitSkipEmpty(block, '\n')) {
    ConsumeSuffix(&line, "\r");
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return false;
    headers->emplace_back(std::string(line.substr(0, colon)),
                          std::string(StripAsciiWhitespace(line.substr(colon + 1))));
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoding; with `plus_is_space` (query strings) '+' is a space. Malformed escapes are kept
// as they are.
std::string PercentDecode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%' && i + 2 < text.size() && HexValue(text[i + 1]) >= 0 &&
        HexValue(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2])));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Escapes everything but RFC 3986 unreserved characters, as for a path segment or query value.
std::string PercentEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  AppendJsonEscaped(text, &out);
  out.push_back('"');
  return out;
}

std::string Rfc3339(int64_t wall_ns) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixNanos(wall_ns),
                          absl::UTCTimeZone());
}

// Writes all of `data`; false when the peer is gone.
bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t sent = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    data.remove_prefix(static_cast<size_t>(sent));
  }
  return true;
}

// Reads a connection: heads line-wise through a buffer, bodies straight into the caller's
// memory once the buffer is empty (no copy for large uploads).
class SocketReader {
 public:
  explicit SocketReader(int fd) : fd_(fd), buffer_(new char[kBufferBytes]) {}

  // Reads through the "\r\n\r\n" ending a request head. False at the end of the stream, on an
  // error, or when the head is too long; `*idle_end` tells a clean end between requests.
  bool ReadHead(std::string* head, bool* idle_end) {
    *idle_end = false;
    size_t scan = 0;
    while (true) {
      const std::string_view view(buffer_.get() + begin_, end_ - begin_);
      const size_t found = view.find("\r\n\r\n", scan);
      if (found != std::string_view::npos) {
        head->assign(view.substr(0, found + 4));
        begin_ += found + 4;
        return true;
      }
      if (view.size() > kMaxHeadBytes) return false;
      scan = view.size() >= 3 ? view.size() - 3 : 0;
      if (!Fill()) {
        *idle_end = view.empty();
        return false;
      }
    }
  }

  // Reads one line without its "\r\n"; false at the end of the stream or after kMaxHeadBytes.
  bool ReadLine(std::string* line) {
    while (true) {
      const std::string_view view(buffer_.get() + begin_, end_ - begin_);
      const size_t found = view.find("\r\n");
      if (found != std::string_view::npos) {
        line->assign(view.substr(0, found));
        begin_ += found + 2;
        return true;
      }
      if (view.size() > kMaxHeadBytes || !Fill()) return false;
    }
  }

  // What is buffered, or else what one recv() brings, at most `max` bytes: > 0, 0 at the end of
  // the stream, < 0 on an error.
  ssize_t ReadSome(char* out, size_t max) {
    if (begin_ < end_) {
      const size_t n = std::min(max, end_ - begin_);
      std::memcpy(out, buffer_.get() + begin_, n);
      begin_ += n;
      return static_cast<ssize_t>(n);
    }
    while (true) {
      const ssize_t received = recv(fd_, out, max, 0);
      if (received < 0 && errno == EINTR) continue;
      return received;
    }
  }

 private:
  static constexpr size_t kBufferBytes = size_t{256} * 1024;

  bool Fill() {
    if (begin_ > 0) {
      std::memmove(buffer_.get(), buffer_.get() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == kBufferBytes) return false;
    while (true) {
      const ssize_t received = recv(fd_, buffer_.get() + end_, kBufferBytes - end_, 0);
      if (received < 0 && errno == EINTR) continue;
      if (received <= 0) return false;
      end_ += static_cast<size_t>(received);
      return true;
    }
  }

  const int fd_;
  std::unique_ptr<char[]> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

// A request body, Content-Length or chunked framing, read piece by piece. Sends 100 Continue
// before the first read when the client asked for it. Applies the server's read-rate limit and
// injected reset.
class BodyReader {
 public:
  static constexpr ssize_t kEnd = 0;
  static constexpr ssize_t kBroken = -1;
  static constexpr ssize_t kReset = -2;

  BodyReader(SocketReader* socket, int fd, bool chunked, uint64_t length, bool expect_continue)
      : socket_(socket),
        fd_(fd),
        chunked_(chunked),
        remaining_(length),
        expect_continue_(expect_continue) {}

  void set_rate(uint64_t bytes_per_second) { rate_ = bytes_per_second; }
  void set_reset_after(uint64_t bytes) { reset_after_ = bytes; }

  // > 0 bytes read into `out`, kEnd at the end of the body, kBroken when the connection broke or
  // the framing is malformed, kReset when an injected reset is due.
  ssize_t Read(char* out, size_t max) {
    if (reset_after_.has_value()) {
      if (bytes_read_ >= *reset_after_) return kReset;
      max = std::min<uint64_t>(max, *reset_after_ - bytes_read_);
    }
    if (rate_ > 0) {
      max = std::min<uint64_t>(max, std::max<uint64_t>(rate_ / 20, 1));
      if (bytes_read_ == 0) throttle_start_ = std::chrono::steady_clock::now();
    }
    const ssize_t n = ReadRaw(out, max);
    if (n == kEnd && reset_after_.has_value()) return kReset;
    if (n <= 0) return n;
    bytes_read_ += static_cast<uint64_t>(n);
    if (rate_ > 0) {
      std::this_thread::sleep_until(throttle_start_ + std::chrono::nanoseconds(static_cast<int64_t>(
                                                          static_cast<double>(bytes_read_) * 1e9 /
                                                          static_cast<double>(rate_))));
    }
    return n;
  }

  // Reads the rest of the body as Read() does and drops it: kEnd, kBroken or kReset.
  ssize_t Skip() {
    std::unique_ptr<char[]> scratch(new char[kIoBytes]);
    while (true) {
      const ssize_t n = Read(scratch.get(), kIoBytes);
      if (n <= 0) return n;
    }
  }

  // Reads the rest of the body and drops it, ignoring the rate limit and an injected reset;
  // false when the connection broke.
  bool Drain() {
    std::unique_ptr<char[]> scratch(new char[kIoBytes]);
    while (true) {
      const ssize_t n = ReadRaw(scratch.get(), kIoBytes);
      if (n == kEnd) return true;
      if (n < 0) return false;
      bytes_read_ += static_cast<uint64_t>(n);
    }
  }

  bool finished() const { return finished_; }
  bool continue_pending() const { return expect_continue_ && !continue_sent_; }
  uint64_t bytes_read() const { return bytes_read_; }
  bool chunked() const { return chunked_; }

 private:
  ssize_t ReadRaw(char* out, size_t max) {
    if (finished_) return kEnd;
    if (continue_pending()) {
      continue_sent_ = true;
      if (!SendAll(fd_, "HTTP/1.1 100 Continue\r\n\r\n")) return kBroken;
    }
    if (!chunked_) {
      if (remaining_ == 0) {
        finished_ = true;
        return kEnd;
      }
      const ssize_t n = socket_->ReadSome(out, std::min<uint64_t>(max, remaining_));
      if (n <= 0) return kBroken;
      remaining_ -= static_cast<uint64_t>(n);
      if (remaining_ == 0) finished_ = true;
      return n;
    }
    if (remaining_ == 0) {
      std::string line;
      if (in_chunk_ && (!socket_->ReadLine(&line) || !line.empty())) return kBroken;
      in_chunk_ = false;
      if (!socket_->ReadLine(&line)) return kBroken;
      const std::string_view size_text = std::string_view(line).substr(0, line.find(';'));
      const std::optional<uint64_t> size = ParseUint(size_text, 16);
      if (!size.has_value()) return kBroken;
      if (*size == 0) {
        // Trailers, dropped, up to the empty line.
        do {
          if (!socket_->ReadLine(&line)) return kBroken;
        } while (!line.empty());
        finished_ = true;
        return kEnd;
      }
      remaining_ = *size;
      in_chunk_ = true;
    }
    const ssize_t n = socket_->ReadSome(out, std::min<uint64_t>(max, remaining_));
    if (n <= 0) return kBroken;
    remaining_ -= static_cast<uint64_t>(n);
    return n;
  }

  SocketReader* const socket_;
  const int fd_;
  const bool chunked_;
  // Content-Length framing: body bytes left; chunked: bytes left in the current chunk.
  uint64_t remaining_;
  bool in_chunk_ = false;
  const bool expect_continue_;
  bool continue_sent_ = false;
  bool finished_ = false;
  uint64_t bytes_read_ = 0;
  uint64_t rate_ = 0;
  std::chrono::steady_clock::time_point throttle_start_;
  std::optional<uint64_t> reset_after_;
};

struct EvpMdCtxFree {
  void operator()(EVP_MD_CTX* context) const { EVP_MD_CTX_free(context); }
};
using Md5Context = std::unique_ptr<EVP_MD_CTX, EvpMdCtxFree>;

// The running CRC32C and MD5 of an object's bytes.
class Hashes {
 public:
  explicit Hashes(bool md5) {
    if (md5) {
      md5_.reset(EVP_MD_CTX_new());
      CLUSTERPROF_CHECK(md5_ != nullptr && EVP_DigestInit_ex(md5_.get(), EVP_md5(), nullptr) == 1);
    }
  }
  Hashes(const Hashes& other) : crc_(other.crc_) {
    if (other.md5_ != nullptr) {
      md5_.reset(EVP_MD_CTX_new());
      CLUSTERPROF_CHECK(md5_ != nullptr && EVP_MD_CTX_copy_ex(md5_.get(), other.md5_.get()) == 1);
    }
  }
  Hashes& operator=(const Hashes& other) {
    if (this != &other) {
      Hashes copy(other);
      crc_ = copy.crc_;
      md5_ = std::move(copy.md5_);
    }
    return *this;
  }

  void UpdateCrc(const char* data, size_t size) { crc_ = Crc32cExtend(crc_, data, size); }
  void UpdateMd5(const char* data, size_t size) {
    if (md5_ != nullptr) EVP_DigestUpdate(md5_.get(), data, size);
  }
  bool has_md5() const { return md5_ != nullptr; }

  std::string Crc32cBase64() const { return Crc32cToBase64(crc_); }
  // "" without MD5.
  std::string Md5Base64() const {
    if (md5_ == nullptr) return "";
    Hashes copy(*this);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_DigestFinal_ex(copy.md5_.get(), digest, &size);
    return absl::Base64Escape(absl::string_view(reinterpret_cast<const char*>(digest), size));
  }

 private:
  uint32_t crc_ = 0;
  Md5Context md5_;
};

// A header like X-Goog-Hash: "crc32c=AAAAAA==,md5=1B2M2Y8AsgTpgAmY7PhCfg==".
void ParseGoogHash(std::string_view header, std::optional<std::string>* crc32c,
                   std::optional<std::string>* md5) {
  for (std::string_view item : SplitSkipEmpty(header, ',')) {
    item = StripAsciiWhitespace(item);
    if (ConsumePrefix(&item, "crc32c=")) {
      *crc32c = std::string(item);
    } else if (ConsumePrefix(&item, "md5=")) {
      *md5 = std::string(item);
    }
  }
}

bool IsMd5Base64(std::string_view text) {
  std::string bytes;
  return absl::Base64Unescape(AbslView(text), &bytes) && bytes.size() == 16;
}

}  // namespace

namespace gcs_internal {

// Bytes of an object or of a resumable session: in memory, or in a scratch file that goes away
// with the object. Not thread-safe; immutable once it belongs to a stored object.
struct Content {
  std::string memory;
  std::string path;
  int fd = -1;
  uint64_t size = 0;
  // Options::discard_data: only the size is kept.
  bool discard = false;

  Content() = default;
  Content(const Content&) = delete;
  Content& operator=(const Content&) = delete;
  ~Content() {
    if (fd >= 0) close(fd);
    if (!path.empty()) unlink(path.c_str());
  }

  absl::Status Append(const char* data, size_t n) {
    if (discard) {
      size += n;
      return absl::OkStatus();
    }
    if (fd < 0) {
      memory.append(data, n);
      size += n;
      return absl::OkStatus();
    }
    while (n > 0) {
      const ssize_t written = pwrite(fd, data, n, static_cast<off_t>(size));
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) {
        return absl::InternalError(StrCat("cannot write ", path, ": ", std::strerror(errno)));
      }
      data += written;
      n -= static_cast<size_t>(written);
      size += static_cast<uint64_t>(written);
    }
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t new_size) {
    if (discard) {
    } else if (fd < 0) {
      memory.resize(new_size);
    } else if (ftruncate(fd, static_cast<off_t>(new_size)) != 0) {
      return absl::InternalError(StrCat("cannot truncate ", path, ": ", std::strerror(errno)));
    }
    size = new_size;
    return absl::OkStatus();
  }

  absl::Status ReadAt(uint64_t offset, size_t n, char* out) const {
    if (discard) {
      return absl::FailedPreconditionError(
          "object bytes are not kept: the server runs with discard_data (--discard-data)");
    }
    if (fd < 0) {
      std::memcpy(out, memory.data() + offset, n);
      return absl::OkStatus();
    }
    while (n > 0) {
      const ssize_t got = pread(fd, out, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        return absl::InternalError(StrCat("cannot read ", path, ": ", std::strerror(errno)));
      }
      out += got;
      n -= static_cast<size_t>(got);
      offset += static_cast<uint64_t>(got);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadAll() const {
    if (fd < 0) return memory;
    std::string data(size, '\0');
    if (absl::Status status = ReadAt(0, size, data.data()); !status.ok()) return status;
    return data;
  }
};

}  // namespace gcs_internal

namespace {

using gcs_internal::Content;

// Appends upload bytes to a Content and extends the Hashes. With `pipelined`, MD5 (the slowest
// part, about 0.6 GB/s) runs on a helper thread over copies of the pieces, so that reading,
// CRC32C and storing go on meanwhile. Finish() (or destruction) waits for it.
class UploadWriter {
 public:
  UploadWriter(Content* content, Hashes* hashes, bool pipelined)
      : content_(content), hashes_(hashes) {
    if (pipelined && hashes->has_md5()) {
      for (int i = 0; i < kSlots; ++i) {
        slots_[i].data.reset(new char[kIoBytes]);
        free_.push_back(i);
      }
      md5_thread_ = std::thread([this] { HashLoop(); });
    }
  }
  ~UploadWriter() { Finish(); }
  UploadWriter(const UploadWriter&) = delete;
  UploadWriter& operator=(const UploadWriter&) = delete;

  absl::Status Write(const char* data, size_t size) {
    if (absl::Status status = content_->Append(data, size); !status.ok()) return status;
    hashes_->UpdateCrc(data, size);
    if (!md5_thread_.joinable()) {
      hashes_->UpdateMd5(data, size);
      return absl::OkStatus();
    }
    while (size > 0) {
      const size_t n = std::min(size, kIoBytes);
      int slot;
      {
        MutexLock lock(&mu_);
        mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !free_.empty(); });
        slot = free_.back();
        free_.pop_back();
      }
      std::memcpy(slots_[slot].data.get(), data, n);
      slots_[slot].size = n;
      {
        MutexLock lock(&mu_);
        ready_.push_back(slot);
      }
      data += n;
      size -= n;
    }
    return absl::OkStatus();
  }

  void Finish() {
    if (!md5_thread_.joinable()) return;
    {
      MutexLock lock(&mu_);
      done_ = true;
    }
    md5_thread_.join();
  }

 private:
  static constexpr int kSlots = 8;
  struct Slot {
    std::unique_ptr<char[]> data;
    size_t size = 0;
  };

  void HashLoop() {
    while (true) {
      int slot;
      {
        MutexLock lock(&mu_);
        mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !ready_.empty() || done_; });
        if (ready_.empty()) return;
        slot = ready_.front();
        ready_.pop_front();
      }
      hashes_->UpdateMd5(slots_[slot].data.get(), slots_[slot].size);
      MutexLock lock(&mu_);
      free_.push_back(slot);
    }
  }

  Content* const content_;
  Hashes* const hashes_;
  Slot slots_[kSlots];
  Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  std::deque<int> ready_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread md5_thread_;
};

// Streams the parts of a multipart/related body: the bytes between delimiters go to a sink, only
// a delimiter's length of them held back at a time.
class MultipartReader {
 public:
  enum class Result { kOk, kMalformed, kBroken, kReset };

  MultipartReader(BodyReader* body, std::string_view boundary)
      : body_(body), delimiter_(StrCat("\r\n--", boundary)), buffer_("\r\n") {}

  // Skips the preamble through the first delimiter and its line end.
  Result Begin() {
    bool last = false;
    return ReadData([](const char*, size_t) { return absl::OkStatus(); }, &last, nullptr);
  }

  // Reads a part's header block.
  Result ReadHeaders(Headers* headers) {
    while (true) {
      if (StartsWith(buffer_, "\r\n")) {
        buffer_.erase(0, 2);
        return Result::kOk;
      }
      const size_t end = buffer_.find("\r\n\r\n");
      if (end != std::string::npos) {
        const bool ok = ParseHeaders(std::string_view(buffer_).substr(0, end), headers);
        buffer_.erase(0, end + 4);
        return ok ? Result::kOk : Result::kMalformed;
      }
      if (buffer_.size() > kMaxHeadBytes) return Result::kMalformed;
      if (Result result = Fill(); result != Result::kOk) return result;
    }
  }

  // Streams a part's bytes to `sink` up to the next delimiter; `*last` tells the closing one.
  // `*sink_status` receives the sink's error, if any (then the result is kOk and reading stops).
  template <typename Sink>
  Result ReadData(Sink sink, bool* last, absl::Status* sink_status) {
    while (true) {
      const size_t found = buffer_.find(delimiter_);
      if (found != std::string::npos) {
        if (absl::Status status = sink(buffer_.data(), found); !status.ok()) {
          if (sink_status != nullptr) *sink_status = status;
          return Result::kOk;
        }
        buffer_.erase(0, found + delimiter_.size());
        break;
      }
      const size_t keep = delimiter_.size() - 1;
      if (buffer_.size() > keep) {
        const size_t emit = buffer_.size() - keep;
        if (absl::Status status = sink(buffer_.data(), emit); !status.ok()) {
          if (sink_status != nullptr) *sink_status = status;
          return Result::kOk;
        }
        buffer_.erase(0, emit);
      }
      if (Result result = Fill(); result != Result::kOk) return result;
    }
    while (buffer_.size() < 2) {
      if (Result result = Fill(); result != Result::kOk) return result;
    }
    if (StartsWith(buffer_, "--")) {
      *last = true;
      buffer_.clear();
      return Result::kOk;
    }
    // Transport padding (spaces and tabs) may follow a delimiter before its line end.
    while (true) {
      const size_t non_blank = buffer_.find_first_not_of(" \t");
      if (non_blank != std::string::npos) {
        buffer_.erase(0, non_blank);
        break;
      }
      buffer_.clear();
      if (Result result = Fill(); result != Result::kOk) return result;
    }
    while (buffer_.size() < 2) {
      if (Result result = Fill(); result != Result::kOk) return result;
    }
    if (!StartsWith(buffer_, "\r\n")) return Result::kMalformed;
    buffer_.erase(0, 2);
    *last = false;
    return Result::kOk;
  }

 private:
  Result Fill() {
    const size_t old_size = buffer_.size();
    buffer_.resize(old_size + kIoBytes);
    const ssize_t n = body_->Read(buffer_.data() + old_size, kIoBytes);
    buffer_.resize(old_size + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) return Result::kOk;
    if (n == BodyReader::kEnd) return Result::kMalformed;
    return n == BodyReader::kReset ? Result::kReset : Result::kBroken;
  }

  BodyReader* const body_;
  const std::string delimiter_;
  std::string buffer_;
};

// Object metadata a client sends with an upload (resumable initiation, multipart first part).
struct UploadMetadata {
  std::optional<std::string> name;
  std::optional<std::string> content_type;
  std::map<std::string, std::string> metadata;
  std::optional<std::string> crc32c;
  std::optional<std::string> md5_hash;
};

absl::StatusOr<UploadMetadata> ParseUploadMetadata(const std::string& text) {
  UploadMetadata result;
  if (StripAsciiWhitespace(text).empty()) return result;
  std::error_code error;
  const web::json::value json = web::json::value::parse(text, error);
  if (error || !json.is_object()) {
    return absl::InvalidArgumentError(
        StrCat("Invalid JSON payload received. The object metadata is not a JSON object: ",
               error ? error.message() : "not an object"));
  }
  for (const auto& [key, value] : json.as_object()) {
    auto string_field = [&, &key = key,
                         &value = value](std::optional<std::string>* out) -> absl::Status {
      if (value.is_null()) return absl::OkStatus();
      if (!value.is_string()) {
        return absl::InvalidArgumentError(
            StrCat("Invalid value for field '", key, "': expected a string."));
      }
      *out = value.as_string();
      return absl::OkStatus();
    };
    absl::Status status;
    if (key == "name") {
      status = string_field(&result.name);
    } else if (key == "contentType") {
      status = string_field(&result.content_type);
    } else if (key == "crc32c") {
      status = string_field(&result.crc32c);
      if (status.ok() && result.crc32c.has_value() &&
          !Crc32cFromBase64(*result.crc32c).has_value()) {
        status =
            absl::InvalidArgumentError(StrCat("Invalid value for field 'crc32c': ", *result.crc32c,
                                              " is not the base64 of a big-endian 32-bit CRC32C."));
      }
    } else if (key == "md5Hash") {
      status = string_field(&result.md5_hash);
      if (status.ok() && result.md5_hash.has_value() && !IsMd5Base64(*result.md5_hash)) {
        status = absl::InvalidArgumentError(
            StrCat("Invalid value for field 'md5Hash': ", *result.md5_hash,
                   " is not the base64 of a 16-byte digest."));
      }
    } else if (key == "metadata" && !value.is_null()) {
      if (!value.is_object()) {
        status = absl::InvalidArgumentError("Invalid value for field 'metadata': not an object.");
      } else {
        for (const auto& [metadata_key, metadata_value] : value.as_object()) {
          if (metadata_value.is_null()) continue;
          if (!metadata_value.is_string()) {
            status = absl::InvalidArgumentError(
                StrCat("Invalid value for field 'metadata.", metadata_key, "': not a string."));
            break;
          }
          result.metadata[metadata_key] = metadata_value.as_string();
        }
      }
    }
    if (!status.ok()) return status;
  }
  return result;
}

struct Preconditions {
  std::optional<int64_t> if_generation_match;
  std::optional<int64_t> if_generation_not_match;
  std::optional<int64_t> if_metageneration_match;
  std::optional<int64_t> if_metageneration_not_match;
};

}  // namespace

namespace gcs_internal {

struct StoredObject {
  std::string bucket;
  std::string name;
  std::string content_type;
  std::map<std::string, std::string> metadata;
  int64_t generation = 0;
  int64_t metageneration = 1;
  int64_t created_ns = 0;
  std::string crc32c;
  std::string md5_hash;
  std::shared_ptr<const Content> content;
};

// A resumable upload. `state`, `busy`, `persisted` and `finalized` are guarded by the server's
// mu_; the rest is written only at creation, or by the one request that set `busy`.
struct Session {
  enum class State { kActive, kFinalized, kGone };

  std::string id;
  std::string bucket;
  std::string name;
  std::string content_type;
  std::map<std::string, std::string> metadata;
  std::optional<std::string> expected_crc32c;
  std::optional<std::string> expected_md5;
  Preconditions preconditions;
  std::optional<uint64_t> total;
  std::unique_ptr<Content> content;
  std::unique_ptr<Hashes> hashes;

  State state = State::kActive;
  bool busy = false;
  std::shared_ptr<const StoredObject> finalized;
};

struct Request {
  std::string method;
  std::string target;
  std::string path;
  Headers headers;
  std::vector<std::pair<std::string, std::string>> query;
  bool keep_alive = true;
  bool has_body = false;
  std::unique_ptr<BodyReader> body;
  // "http://HOST" from the Host header, for the links in answers.
  std::string base_url;

  const std::string* Header(std::string_view name) const { return FindHeader(headers, name); }
  const std::string* Query(std::string_view name) const {
    for (const auto& [key, value] : query) {
      if (key == name) return &value;
    }
    return nullptr;
  }
};

struct Reply {
  int code = 200;
  Headers headers;
  std::string body;
  std::string content_type = "application/json; charset=UTF-8";
  // A media body streamed from stored content instead of `body`.
  std::shared_ptr<const Content> media;
  uint64_t media_offset = 0;
  uint64_t media_length = 0;
  // Reset the connection instead of answering.
  bool reset = false;
  // Close the connection after answering (the request body was not read to its end).
  bool close = false;
};

}  // namespace gcs_internal

// One client connection and the thread that serves it. The thread owns the socket and closes
// it; the destructor only shuts it down. `fd` and `done` are guarded by mu_ (the serving thread
// reads `fd` freely: only it changes it).
struct GcsTestServer::Connection {
  int fd = -1;
  bool done = false;
  std::thread thread;
};

namespace {

using gcs_internal::Reply;
using gcs_internal::Request;
using gcs_internal::StoredObject;

const char* DefaultReason(int code) {
  switch (code) {
    case 400:
      return "invalid";
    case 401:
      return "required";
    case 403:
      return "forbidden";
    case 404:
      return "notFound";
    case 405:
      return "methodNotAllowed";
    case 408:
      return "requestTimeout";
    case 410:
      return "gone";
    case 412:
      return "conditionNotMet";
    case 416:
      return "requestedRangeNotSatisfiable";
    case 429:
      return "rateLimitExceeded";
    default:
      return code >= 500 ? "backendError" : "invalid";
  }
}

Reply ErrorReply(int code, std::string_view message, std::string_view reason = "",
                 std::string_view location_type = "", std::string_view location = "") {
  if (reason.empty()) reason = DefaultReason(code);
  Reply reply;
  reply.code = code;
  std::string error = StrCat(R"({"message":)", JsonString(message), R"(,"domain":"global",)",
                             R"("reason":)", JsonString(reason));
  if (!location_type.empty()) {
    StrAppend(&error, R"(,"locationType":)", JsonString(location_type), R"(,"location":)",
              JsonString(location));
  }
  error.push_back('}');
  reply.body = StrCat(R"({"error":{"code":)", code, R"(,"message":)", JsonString(message),
                      R"(,"errors":[)", error, "]}}");
  return reply;
}

// The error an injected fault answers with.
Reply FaultReply(int code) {
  switch (code) {
    case 429:
      return ErrorReply(code,
                        "The object exceeded the rate limit for object mutation operations "
                        "(create, update, and delete). Please reduce your request rate.");
    case 408:
      return ErrorReply(code, "The request timed out. Please try again.");
    default:
      if (code >= 500) {
        return ErrorReply(code, "We encountered an internal error. Please try again.");
      }
      return ErrorReply(code, StrCat("Injected error ", code, "."));
  }
}

std::string ObjectLink(std::string_view base_url, std::string_view bucket, std::string_view name) {
  return StrCat(base_url, "/storage/v1/b/", PercentEncode(bucket), "/o/", PercentEncode(name));
}

absl::StatusOr<Preconditions> ParsePreconditions(const Request& request) {
  Preconditions result;
  const std::pair<const char*, std::optional<int64_t>*> fields[] = {
      {"ifGenerationMatch", &result.if_generation_match},
      {"ifGenerationNotMatch", &result.if_generation_not_match},
      {"ifMetagenerationMatch", &result.if_metageneration_match},
      {"ifMetagenerationNotMatch", &result.if_metageneration_not_match},
  };
  for (const auto& [name, out] : fields) {
    const std::string* value = request.Query(name);
    if (value == nullptr) continue;
    *out = ParseInt(*value);
    if (!out->has_value()) {
      return absl::InvalidArgumentError(
          StrCat("Invalid value for parameter '", name, "': ", *value, " is not an integer."));
    }
  }
  return result;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GcsTestServer>> GcsTestServer::Start(Options options) {
  if (!options.data_dir.empty()) {
    const std::string probe = StrCat(options.data_dir, "/.gcs-test-server-probe");
    const int fd = open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::InvalidArgumentError(StrCat("cannot create files in the data directory ",
                                               options.data_dir, ": ", std::strerror(errno)));
    }
    close(fd);
    unlink(probe.c_str());
  }
  std::unique_ptr<GcsTestServer> server(new GcsTestServer(std::move(options)));
  server->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (server->listen_fd_ < 0) {
    return absl::InternalError(StrCat("socket: ", std::strerror(errno)));
  }
  const int one = 1;
  setsockopt(server->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  if (inet_pton(AF_INET, server->options_.address.c_str(), &address.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        StrCat("'", server->options_.address, "' is not an IPv4 address to listen on"));
  }
  address.sin_port = htons(static_cast<uint16_t>(server->port_));
  socklen_t length = sizeof(address);
  if (bind(server->listen_fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(server->listen_fd_, 128) != 0 ||
      getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return absl::UnavailableError(StrCat("cannot listen on ", server->options_.address, ":",
                                         server->port_, ": ", std::strerror(errno)));
  }
  server->port_ = ntohs(address.sin_port);
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

GcsTestServer::GcsTestServer(Options options) : options_(std::move(options)), port_(options_.port) {
  if (options_.clock == nullptr) {
    owned_clock_ = std::make_unique<RealClock>();
    clock_ = owned_clock_.get();
  } else {
    clock_ = options_.clock;
  }
  std::random_device device;
  session_salt_ = (uint64_t{device()} << 32) | device();
}

GcsTestServer::~GcsTestServer() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    for (const std::unique_ptr<Connection>& connection : connections_) {
      if (connection->fd >= 0) shutdown(connection->fd, SHUT_RDWR);
    }
  }
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Connection>> connections;
  {
    MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (const std::unique_ptr<Connection>& connection : connections) connection->thread.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

std::string GcsTestServer::endpoint() const {
  return StrCat("http://", options_.address, ":", port_);
}

void GcsTestServer::CreateBucket(std::string_view name) {
  MutexLock lock(&mu_);
  buckets_.try_emplace(std::string(name));
}

int64_t GcsTestServer::DistinctContents(std::string_view bucket, std::string_view name) const {
  MutexLock lock(&mu_);
  const auto found = contents_.find(StrCat(bucket, "/", name));
  return found == contents_.end() ? 0 : static_cast<int64_t>(found->second.size());
}

int64_t GcsTestServer::Writes(std::string_view bucket, std::string_view name) const {
  MutexLock lock(&mu_);
  const auto found = writes_.find(StrCat(bucket, "/", name));
  return found == writes_.end() ? 0 : found->second;
}

std::optional<GcsObjectSnapshot> GcsTestServer::GetObject(std::string_view bucket,
                                                          std::string_view name) const {
  std::shared_ptr<const StoredObject> object;
  {
    MutexLock lock(&mu_);
    const auto b = buckets_.find(bucket);
    if (b == buckets_.end()) return std::nullopt;
    const auto o = b->second.find(name);
    if (o == b->second.end()) return std::nullopt;
    object = o->second;
  }
  GcsObjectSnapshot snapshot;
  snapshot.bucket = object->bucket;
  snapshot.name = object->name;
  absl::StatusOr<std::string> data = object->content->ReadAll();
  if (!data.ok()) return std::nullopt;
  snapshot.data = *std::move(data);
  snapshot.content_type = object->content_type;
  snapshot.crc32c = object->crc32c;
  snapshot.md5_hash = object->md5_hash;
  snapshot.generation = object->generation;
  snapshot.metageneration = object->metageneration;
  snapshot.size = object->content->size;
  snapshot.metadata = object->metadata;
  return snapshot;
}

std::vector<std::string> GcsTestServer::ListObjectNames(std::string_view bucket) const {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  const auto b = buckets_.find(bucket);
  if (b == buckets_.end()) return names;
  for (const auto& [name, object] : b->second) names.push_back(name);
  return names;
}

void GcsTestServer::PutObject(std::string_view bucket, std::string_view name,
                              std::string_view data) {
  absl::StatusOr<std::unique_ptr<Content>> content = NewContent();
  if (!content.ok()) std::abort();
  Hashes hashes(options_.compute_md5);
  {
    UploadWriter writer(content->get(), &hashes, false);
    if (!writer.Write(data.data(), data.size()).ok()) std::abort();
  }
  auto object = std::make_shared<StoredObject>();
  object->bucket = std::string(bucket);
  object->name = std::string(name);
  object->content_type = "application/octet-stream";
  object->crc32c = hashes.Crc32cBase64();
  object->md5_hash = hashes.Md5Base64();
  object->content = std::shared_ptr<const Content>(*std::move(content));
  MutexLock lock(&mu_);
  object->generation = NextGeneration();
  object->created_ns = clock_->WallNs();
  ++writes_[StrCat(bucket, "/", name)];
  contents_[StrCat(bucket, "/", name)].insert(object->crc32c);
  buckets_[std::string(bucket)][std::string(name)] = std::move(object);
}

void GcsTestServer::SetAuthorizer(
    std::function<GcsAuthDecision(std::string_view authorization, std::string_view bucket)>
        authorizer) {
  MutexLock lock(&mu_);
  authorizer_ = std::move(authorizer);
}

void GcsTestServer::FailNext(int count, int http_code, std::string_view match) {
  if (count <= 0) return;
  MutexLock lock(&mu_);
  rules_.push_back({count, http_code, std::string(match)});
}

void GcsTestServer::SetFailureRate(double probability, int http_code, uint64_t seed) {
  MutexLock lock(&mu_);
  failure_probability_ = probability;
  failure_code_ = http_code;
  failure_rng_.seed(seed);
}

void GcsTestServer::ResetNextUpload(uint64_t after_body_bytes, int count) {
  MutexLock lock(&mu_);
  reset_after_bytes_ = after_body_bytes;
  resets_left_ = std::max(count, 0);
}

void GcsTestServer::FinalizeShortOnNextStatusQuery(int count) {
  MutexLock lock(&mu_);
  finalize_short_left_ = count;
}

void GcsTestServer::SetLatency(absl::Duration latency) {
  MutexLock lock(&mu_);
  latency_ = std::max(latency, absl::ZeroDuration());
}

void GcsTestServer::SetBodyReadRate(uint64_t bytes_per_second) {
  MutexLock lock(&mu_);
  body_read_rate_ = bytes_per_second;
}

void GcsTestServer::ClearFaults() {
  MutexLock lock(&mu_);
  rules_.clear();
  failure_probability_ = 0;
  resets_left_ = 0;
  latency_ = absl::ZeroDuration();
  body_read_rate_ = 0;
  finalize_short_left_ = 0;
}

std::vector<GcsRequestRecord> GcsTestServer::Requests() const {
  MutexLock lock(&mu_);
  return requests_;
}

void GcsTestServer::ClearRequests() {
  MutexLock lock(&mu_);
  requests_.clear();
}

int GcsTestServer::active_resumable_sessions() const {
  MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(sessions_.begin(), sessions_.end(), [](const auto& entry) {
    return entry.second->state == Session::State::kActive;
  }));
}

int64_t GcsTestServer::NextGeneration() {
  last_generation_ = std::max(last_generation_ + 1, clock_->WallNs() / 1000);
  return last_generation_;
}

absl::StatusOr<std::unique_ptr<GcsTestServer::Content>> GcsTestServer::NewContent() {
  auto content = std::make_unique<Content>();
  content->discard = options_.discard_data;
  if (options_.data_dir.empty() || options_.discard_data) return content;
  uint64_t id;
  {
    MutexLock lock(&mu_);
    id = ++next_id_;
  }
  content->path = StrCat(options_.data_dir, "/blob-", getpid(), "-", id);
  content->fd = open(content->path.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  if (content->fd < 0) {
    const std::string error = std::strerror(errno);
    content->path.clear();
    return absl::InternalError(StrCat("cannot create a file in ", options_.data_dir, ": ", error));
  }
  return content;
}

std::optional<int> GcsTestServer::TakeFault(const Request& request) {
  const std::string line = StrCat(request.method, " ", request.target);
  MutexLock lock(&mu_);
  for (auto it = rules_.begin(); it != rules_.end(); ++it) {
    if (line.find(it->match) == std::string::npos) continue;
    const int code = it->code;
    if (--it->remaining <= 0) rules_.erase(it);
    return code;
  }
  if (failure_probability_ > 0) {
    const double draw = static_cast<double>(failure_rng_() >> 11) * 0x1.0p-53;
    if (draw < failure_probability_) return failure_code_;
  }
  return std::nullopt;
}

std::optional<uint64_t> GcsTestServer::TakeReset() {
  MutexLock lock(&mu_);
  if (resets_left_ <= 0) return std::nullopt;
  --resets_left_;
  return reset_after_bytes_;
}

void GcsTestServer::Record(const Request& request, int code) {
  GcsRequestRecord record;
  record.method = request.method;
  record.target = request.target;
  record.code = code;
  record.body_bytes = request.body != nullptr ? request.body->bytes_read() : 0;
  if (const std::string* authorization = request.Header("Authorization")) {
    record.authorization = *authorization;
  }
  if (const std::string* range = request.Header("Content-Range")) record.content_range = *range;
  MutexLock lock(&mu_);
  requests_.push_back(std::move(record));
}

void GcsTestServer::ReapConnections() {
  std::list<std::unique_ptr<Connection>> finished;
  {
    MutexLock lock(&mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const std::unique_ptr<Connection>& connection : finished) connection->thread.join();
}

void GcsTestServer::AcceptLoop() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    {
      MutexLock lock(&mu_);
      if (stopping_) {
        if (fd >= 0) close(fd);
        return;
      }
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        if (errno == EMFILE || errno == ENFILE) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        continue;
      }
      return;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ReapConnections();
    MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    Connection* raw = connection.get();
    connection->thread = std::thread([this, raw] { Serve(raw); });
    connections_.push_back(std::move(connection));
  }
}

void GcsTestServer::Serve(Connection* connection) {
  const int fd = connection->fd;
  SocketReader reader(fd);
  bool reset = false;
  while (true) {
    std::string head;
    bool idle_end = false;
    if (!reader.ReadHead(&head, &idle_end)) {
      if (!idle_end && !head.empty()) {
        SendAll(fd, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
      }
      break;
    }
    Request request;
    const std::string_view head_view = head;
    const size_t line_end = head_view.find("\r\n");
    const std::string_view line = head_view.substr(0, line_end);
    const size_t first_space = line.find(' ');
    const size_t last_space = line.rfind(' ');
    if (first_space == std::string_view::npos || first_space == last_space ||
        !ParseHeaders(head_view.substr(line_end + 2), &request.headers)) {
      Reply bad = ErrorReply(400, "Malformed HTTP request head.", "badRequest");
      SendAll(fd, StrCat("HTTP/1.1 400 Bad Request\r\nContent-Type: ", bad.content_type,
                         "\r\nContent-Length: ", bad.body.size(), "\r\nConnection: close\r\n\r\n",
                         bad.body));
      break;
    }
    request.method = std::string(line.substr(0, first_space));
    request.target = std::string(line.substr(first_space + 1, last_space - first_space - 1));
    const std::string_view version = line.substr(last_space + 1);
    const size_t question = request.target.find('?');
    request.path = request.target.substr(0, question);
    if (question != std::string::npos) {
      for (std::string_view parameter :
           SplitSkipEmpty(std::string_view(request.target).substr(question + 1), '&')) {
        const size_t equals = parameter.find('=');
        request.query.emplace_back(PercentDecode(parameter.substr(0, equals), true),
                                   equals == std::string_view::npos
                                       ? std::string()
                                       : PercentDecode(parameter.substr(equals + 1), true));
      }
    }
    const std::string* connection_header = request.Header("Connection");
    request.keep_alive =
        version == "HTTP/1.1" &&
        (connection_header == nullptr || !ContainsIgnoreCase(*connection_header, "close"));
    const std::string* host = request.Header("Host");
    request.base_url = host != nullptr && !host->empty() ? StrCat("http://", *host) : endpoint();

    const std::string* transfer_encoding = request.Header("Transfer-Encoding");
    const std::string* content_length = request.Header("Content-Length");
    const std::string* expect = request.Header("Expect");
    const bool expect_continue = expect != nullptr && ContainsIgnoreCase(*expect, "100-continue");
    bool chunked = false;
    uint64_t length = 0;
    if (transfer_encoding != nullptr && ContainsIgnoreCase(*transfer_encoding, "chunked")) {
      chunked = true;
      request.has_body = true;
    } else if (content_length != nullptr) {
      const std::optional<uint64_t> parsed = ParseUint(*content_length);
      if (!parsed.has_value()) {
        Reply bad = ErrorReply(400, "Invalid Content-Length header.", "badRequest");
        SendAll(fd, StrCat("HTTP/1.1 400 Bad Request\r\nContent-Type: ", bad.content_type,
                           "\r\nContent-Length: ", bad.body.size(), "\r\nConnection: close\r\n\r\n",
                           bad.body));
        break;
      }
      length = *parsed;
      request.has_body = length > 0;
    }
    request.body = std::make_unique<BodyReader>(&reader, fd, chunked, length, expect_continue);
    if (!HandleRequest(connection, request, &reset) || !request.keep_alive) break;
  }

  if (reset) {
    // An abortive close: the peer sees RST, not FIN.
    const linger hard{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  }
  MutexLock lock(&mu_);
  close(fd);
  connection->fd = -1;
  connection->done = true;
}

bool GcsTestServer::HandleRequest(Connection* connection, Request& request, bool* reset) {
  const int fd = connection->fd;
  {
    MutexLock lock(&mu_);
    if (latency_ > absl::ZeroDuration()) {
      const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(latency_);
      mu_.AwaitWithDeadline([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; }, deadline);
    }
    if (stopping_) return false;
    request.body->set_rate(body_read_rate_);
  }

  Reply reply;
  if (const std::optional<int> fault = TakeFault(request); fault.has_value()) {
    reply = FaultReply(*fault);
  } else {
    reply = Dispatch(request);
  }

  if (reply.reset) {
    Record(request, 0);
    *reset = true;
    return false;
  }
  BodyReader& body = *request.body;
  if (!body.finished() && !reply.close) {
    // The request's body was not (all) read: read and drop it, unless the client still waits
    // for 100 Continue (then it will not send it; the connection closes after the answer).
    if (body.continue_pending()) {
      reply.close = true;
    } else if (!body.Drain()) {
      Record(request, 0);
      return false;
    }
  }
  const bool keep_alive = request.keep_alive && !reply.close;

  std::string head = StrCat("HTTP/1.1 ", reply.code, " ", http::ReasonPhrase(reply.code), "\r\n");
  const bool has_content = reply.media != nullptr || !reply.body.empty();
  if (has_content) StrAppend(&head, "Content-Type: ", reply.content_type, "\r\n");
  for (const auto& [name, value] : reply.headers) StrAppend(&head, name, ": ", value, "\r\n");
  const uint64_t length = reply.media != nullptr ? reply.media_length : reply.body.size();
  if (reply.code != 204 && reply.code != 304) StrAppend(&head, "Content-Length: ", length, "\r\n");
  StrAppend(&head, "Cache-Control: no-cache, no-store, max-age=0, must-revalidate\r\n");
  if (!keep_alive) StrAppend(&head, "Connection: close\r\n");
  StrAppend(&head, "\r\n");
  Record(request, reply.code);

  bool sent;
  if (reply.media == nullptr) {
    if (reply.code != 204 && reply.code != 304) head.append(reply.body);
    sent = SendAll(fd, head);
  } else if (reply.media->fd < 0) {
    sent =
        SendAll(fd, head) &&
        SendAll(
            fd,
            std::string_view(reply.media->memory).substr(reply.media_offset, reply.media_length));
  } else {
    sent = SendAll(fd, head);
    std::unique_ptr<char[]> buffer(new char[kIoBytes]);
    uint64_t offset = reply.media_offset;
    uint64_t left = reply.media_length;
    while (sent && left > 0) {
      const size_t n = std::min<uint64_t>(left, kIoBytes);
      sent = reply.media->ReadAt(offset, n, buffer.get()).ok() &&
             SendAll(fd, std::string_view(buffer.get(), n));
      offset += n;
      left -= n;
    }
  }
  return sent && keep_alive;
}

Reply GcsTestServer::Dispatch(Request& request) {
  std::string_view path = request.path;
  enum class Api { kMetadata, kDownload, kUpload } api;
  if (ConsumePrefix(&path, "/storage/v1/b/")) {
    api = Api::kMetadata;
  } else if (ConsumePrefix(&path, "/download/storage/v1/b/")) {
    api = Api::kDownload;
  } else if (ConsumePrefix(&path, "/upload/storage/v1/b/")) {
    api = Api::kUpload;
  } else {
    return ErrorReply(404, StrCat("Not Found: ", request.path), "notFound");
  }
  const size_t slash = path.find('/');
  const std::string bucket = PercentDecode(path.substr(0, slash), false);
  const std::string_view rest = slash == std::string_view::npos ? "" : path.substr(slash);
  std::optional<std::string> object_name;
  if (StartsWith(rest, "/o/") && rest.size() > 3) {
    object_name = PercentDecode(rest.substr(3), false);
  } else if (!rest.empty() && rest != "/o" && rest != "/o/") {
    return ErrorReply(404, StrCat("Not Found: ", request.path), "notFound");
  }
  const bool is_collection = !rest.empty() && !object_name.has_value();
  const std::string& method = request.method;

  // The operation, for the permission an authorization failure names.
  std::string permission;
  std::string resource = "object";
  if (api == Api::kUpload) {
    permission = method == "DELETE" && request.Query("upload_id") == nullptr
                     ? "storage.objects.delete"
                     : "storage.objects.create";
  } else if (rest.empty()) {
    permission = "storage.buckets.get";
    resource = "bucket";
  } else if (is_collection) {
    permission = method == "GET" ? "storage.objects.list" : "storage.objects.create";
    resource = "bucket";
  } else {
    permission = method == "DELETE" ? "storage.objects.delete" : "storage.objects.get";
  }

  Authorizer authorizer;
  {
    MutexLock lock(&mu_);
    authorizer = authorizer_;
  }
  if (authorizer) {
    const std::string* header = request.Header("Authorization");
    const std::string authorization = header != nullptr ? *header : "";
    switch (authorizer(authorization, bucket)) {
      case GcsAuthDecision::kAllow:
        break;
      case GcsAuthDecision::kUnauthenticated:
        if (authorization.empty()) {
          return ErrorReply(
              401,
              StrCat("Anonymous caller does not have ", permission,
                     " access to the Google Cloud Storage ", resource, ". Permission '", permission,
                     "' denied on resource (or it may not exist)."),
              "required", "header", "Authorization");
        }
        return ErrorReply(401, "Invalid Credentials", "authError", "header", "Authorization");
      case GcsAuthDecision::kForbidden:
        return ErrorReply(403,
                          StrCat("test-caller@clusterprof.test does not have ", permission,
                                 " access to the Google Cloud Storage ", resource, ". Permission '",
                                 permission, "' denied on resource (or it may not exist)."),
                          "forbidden");
    }
  }

  auto not_allowed = [&] {
    return ErrorReply(405, StrCat("Method ", method, " is not allowed on ", request.path, "."),
                      "methodNotAllowed");
  };
  switch (api) {
    case Api::kMetadata:
      if (rest.empty()) return method == "GET" ? BucketGet(request, bucket) : not_allowed();
      if (is_collection) return method == "GET" ? ObjectList(request, bucket) : not_allowed();
      if (method == "GET") {
        const std::string* alt = request.Query("alt");
        return ObjectGet(request, bucket, *object_name, alt != nullptr && *alt == "media");
      }
      if (method == "DELETE") return ObjectDelete(request, bucket, *object_name);
      return not_allowed();
    case Api::kDownload:
      if (!object_name.has_value() || method != "GET") return not_allowed();
      return ObjectGet(request, bucket, *object_name, true);
    case Api::kUpload: {
      if (object_name.has_value() || !is_collection) return not_allowed();
      if (const std::string* upload_id = request.Query("upload_id")) {
        if (method == "PUT" || method == "POST") {
          return ResumableChunk(request, bucket, *upload_id);
        }
        if (method == "DELETE") return CancelResumable(request, *upload_id);
        return not_allowed();
      }
      if (method != "POST") return not_allowed();
      const std::string* upload_type = request.Query("uploadType");
      if (upload_type == nullptr) {
        return ErrorReply(400,
                          "Upload requests must include an uploadType URL parameter and a URL "
                          "path beginning with /upload/",
                          "wrongUrlForUpload", "parameter", "uploadType");
      }
      if (*upload_type == "media") return InsertSimple(request, bucket, false);
      if (*upload_type == "multipart") return InsertSimple(request, bucket, true);
      if (*upload_type == "resumable") return StartResumable(request, bucket);
      return ErrorReply(400, StrCat("Invalid upload type: ", *upload_type), "invalidParameter",
                        "parameter", "uploadType");
    }
  }
  return not_allowed();
}

namespace {

Reply MissingBucket() {
  return ErrorReply(404, "The specified bucket does not exist.", "notFound");
}

Reply MissingObject(std::string_view bucket, std::string_view name) {
  return ErrorReply(404, StrCat("No such object: ", bucket, "/", name), "notFound");
}

Reply PreconditionFailed() {
  return ErrorReply(412, "At least one of the pre-conditions you specified did not hold.",
                    "conditionNotMet", "header", "If-Match");
}

}  // namespace

// Builds an object resource.
static std::string ObjectJson(const StoredObject& object, std::string_view base_url) {
  const std::string self_link = ObjectLink(base_url, object.bucket, object.name);
  const std::string time = JsonString(Rfc3339(object.created_ns));
  std::string json =
      StrCat(R"({"kind":"storage#object","id":)",
             JsonString(StrCat(object.bucket, "/", object.name, "/", object.generation)),
             R"(,"selfLink":)", JsonString(self_link), R"(,"mediaLink":)",
             JsonString(StrCat(base_url, "/download/storage/v1/b/", PercentEncode(object.bucket),
                               "/o/", PercentEncode(object.name), "?generation=", object.generation,
                               "&alt=media")),
             R"(,"name":)", JsonString(object.name), R"(,"bucket":)", JsonString(object.bucket),
             R"(,"generation":")", object.generation, R"(","metageneration":")",
             object.metageneration, R"(","contentType":)", JsonString(object.content_type),
             R"(,"storageClass":"STANDARD","size":")", object.content->size, "\"");
  if (!object.md5_hash.empty()) StrAppend(&json, R"(,"md5Hash":)", JsonString(object.md5_hash));
  StrAppend(
      &json, R"(,"crc32c":)", JsonString(object.crc32c), R"(,"etag":)",
      JsonString(
          absl::Base64Escape(AbslView(StrCat(object.generation, "/", object.metageneration)))),
      R"(,"timeCreated":)", time, R"(,"updated":)", time, R"(,"timeStorageClassUpdated":)", time);
  if (!object.metadata.empty()) {
    json.append(R"(,"metadata":{)");
    bool first = true;
    for (const auto& [key, value] : object.metadata) {
      StrAppend(&json, first ? "" : ",", JsonString(key), ":", JsonString(value));
      first = false;
    }
    json.push_back('}');
  }
  json.push_back('}');
  return json;
}

// 0 when the preconditions hold for `live` (nullptr: no live object), else the status to answer.
static int CheckPreconditions(const Preconditions& preconditions, const StoredObject* live,
                              bool is_read) {
  const int64_t generation = live != nullptr ? live->generation : 0;
  if (preconditions.if_generation_match.has_value() &&
      *preconditions.if_generation_match != generation) {
    return 412;
  }
  if (preconditions.if_metageneration_match.has_value() &&
      (live == nullptr || *preconditions.if_metageneration_match != live->metageneration)) {
    return 412;
  }
  // The negative forms behave like If-None-Match: a read that fails them is "not modified".
  const int not_match_code = is_read ? 304 : 412;
  if (preconditions.if_generation_not_match.has_value() &&
      *preconditions.if_generation_not_match == generation) {
    return not_match_code;
  }
  if (preconditions.if_metageneration_not_match.has_value() && live != nullptr &&
      *preconditions.if_metageneration_not_match == live->metageneration) {
    return not_match_code;
  }
  return 0;
}

Reply GcsTestServer::BucketGet(Request& request, std::string_view bucket) {
  int64_t now_ns;
  {
    MutexLock lock(&mu_);
    if (buckets_.find(bucket) == buckets_.end()) return MissingBucket();
    now_ns = clock_->WallNs();
  }
  Reply reply;
  const std::string time = JsonString(Rfc3339(now_ns));
  reply.body = StrCat(R"({"kind":"storage#bucket","id":)", JsonString(bucket), R"(,"selfLink":)",
                      JsonString(StrCat(request.base_url, "/storage/v1/b/", PercentEncode(bucket))),
                      R"(,"projectNumber":"0","name":)", JsonString(bucket), R"(,"timeCreated":)",
                      time, R"(,"updated":)", time,
                      R"(,"metageneration":"1","location":"US","locationType":"multi-region",)",
                      R"("storageClass":"STANDARD","etag":"CAE="})");
  return reply;
}

Reply GcsTestServer::ObjectList(Request& request, std::string_view bucket) {
  auto param = [&](std::string_view name) {
    const std::string* value = request.Query(name);
    return value != nullptr ? *value : std::string();
  };
  const std::string prefix = param("prefix");
  const std::string delimiter = param("delimiter");
  const std::string start_offset = param("startOffset");
  const std::string end_offset = param("endOffset");
  uint64_t max_results = 1000;
  if (const std::string* text = request.Query("maxResults")) {
    const std::optional<uint64_t> parsed = ParseUint(*text);
    if (!parsed.has_value()) {
      return ErrorReply(400, StrCat("Invalid value for parameter 'maxResults': ", *text),
                        "invalidParameter", "parameter", "maxResults");
    }
    if (*parsed > 0) max_results = std::min<uint64_t>(*parsed, 1000);
  }
  // The page token is the last name or prefix the previous page held (base64): this page holds
  // only entries after it.
  std::optional<std::string> after;
  if (const std::string* token = request.Query("pageToken"); token != nullptr && !token->empty()) {
    std::string decoded;
    if (!absl::Base64Unescape(AbslView(*token), &decoded)) {
      return ErrorReply(400, "Invalid page token.", "invalid", "parameter", "pageToken");
    }
    after = std::move(decoded);
  }

  std::vector<std::shared_ptr<const StoredObject>> items;
  std::vector<std::string> prefixes;
  std::optional<std::string> next_token;
  {
    MutexLock lock(&mu_);
    const auto b = buckets_.find(bucket);
    if (b == buckets_.end()) return MissingBucket();
    const ObjectMap& objects = b->second;
    std::string start = std::max(prefix, start_offset);
    if (after.has_value()) start = std::max(start, *after);
    std::string last_key;
    for (auto it = objects.lower_bound(start); it != objects.end(); ++it) {
      const std::string& name = it->first;
      if (!StartsWith(name, prefix)) break;
      if (!end_offset.empty() && name >= end_offset) break;
      if (name < start_offset) continue;
      // The entry this name shows up as: itself, or its prefix up to the first delimiter.
      std::string key = name;
      bool is_prefix = false;
      if (!delimiter.empty()) {
        const size_t at = name.find(delimiter, prefix.size());
        if (at != std::string::npos) {
          key = name.substr(0, at + delimiter.size());
          is_prefix = true;
        }
      }
      if (after.has_value() && key <= *after) continue;
      if (key == last_key) continue;
      if (items.size() + prefixes.size() == max_results) {
        next_token = absl::Base64Escape(AbslView(last_key));
        break;
      }
      last_key = key;
      if (is_prefix) {
        prefixes.push_back(std::move(key));
      } else {
        items.push_back(it->second);
      }
    }
  }
  Reply reply;
  reply.body = R"({"kind":"storage#objects")";
  if (next_token.has_value())
    StrAppend(&reply.body, R"(,"nextPageToken":)", JsonString(*next_token));
  if (!prefixes.empty()) {
    reply.body.append(R"(,"prefixes":[)");
    for (size_t i = 0; i < prefixes.size(); ++i) {
      StrAppend(&reply.body, i == 0 ? "" : ",", JsonString(prefixes[i]));
    }
    reply.body.push_back(']');
  }
  if (!items.empty()) {
    reply.body.append(R"(,"items":[)");
    for (size_t i = 0; i < items.size(); ++i) {
      StrAppend(&reply.body, i == 0 ? "" : ",", ObjectJson(*items[i], request.base_url));
    }
    reply.body.push_back(']');
  }
  reply.body.push_back('}');
  return reply;
}

Reply GcsTestServer::ObjectGet(Request& request, std::string_view bucket, const std::string& name,
                               bool media) {
  absl::StatusOr<Preconditions> preconditions = ParsePreconditions(request);
  if (!preconditions.ok()) {
    return ErrorReply(400, StdView(preconditions.status().message()), "invalidParameter");
  }
  std::shared_ptr<const StoredObject> object;
  {
    MutexLock lock(&mu_);
    const auto b = buckets_.find(bucket);
    if (b == buckets_.end()) return MissingBucket();
    const auto o = b->second.find(name);
    if (o == b->second.end()) return MissingObject(bucket, name);
    object = o->second;
  }
  if (const std::string* generation = request.Query("generation")) {
    const std::optional<int64_t> wanted = ParseInt(*generation);
    if (!wanted.has_value()) {
      return ErrorReply(400, StrCat("Invalid value for parameter 'generation': ", *generation),
                        "invalidParameter", "parameter", "generation");
    }
    if (*wanted != object->generation) return MissingObject(bucket, name);
  }
  if (const int code = CheckPreconditions(*preconditions, object.get(), true); code != 0) {
    if (code == 304) {
      Reply reply;
      reply.code = 304;
      return reply;
    }
    return PreconditionFailed();
  }
  Reply reply;
  const std::string etag =
      absl::Base64Escape(AbslView(StrCat(object->generation, "/", object->metageneration)));
  if (!media) {
    reply.body = ObjectJson(*object, request.base_url);
    reply.headers.emplace_back("ETag", etag);
    return reply;
  }
  const uint64_t size = object->content->size;
  uint64_t first = 0;
  uint64_t last = size == 0 ? 0 : size - 1;
  bool partial = false;
  // One "bytes=" range; anything else (several ranges, bad syntax) is ignored, as HTTP allows.
  if (const std::string* range = request.Header("Range")) {
    std::string_view spec = StripAsciiWhitespace(*range);
    if (ConsumePrefix(&spec, "bytes=") && spec.find(',') == std::string_view::npos) {
      const size_t dash = spec.find('-');
      const std::string_view left =
          dash == std::string_view::npos ? spec : StripAsciiWhitespace(spec.substr(0, dash));
      const std::string_view right =
          dash == std::string_view::npos ? "" : StripAsciiWhitespace(spec.substr(dash + 1));
      const bool has_a = !left.empty();
      const bool has_b = !right.empty();
      const uint64_t a = has_a ? ParseUint(left).value_or(UINT64_MAX) : 0;
      const uint64_t b = has_b ? ParseUint(right).value_or(UINT64_MAX) : 0;
      const bool valid = dash != std::string_view::npos && (has_a || has_b) && a != UINT64_MAX &&
                         b != UINT64_MAX && (!has_a || !has_b || a <= b);
      if (valid) {
        bool satisfiable;
        if (has_a) {
          satisfiable = a < size;
          first = a;
          last = has_b ? std::min(b, size == 0 ? 0 : size - 1) : size - 1;
        } else {
          satisfiable = b > 0 && size > 0;
          first = size - std::min(b, size);
          last = size - 1;
        }
        if (!satisfiable) {
          Reply error = ErrorReply(416, "The requested range cannot be satisfied.",
                                   "requestedRangeNotSatisfiable");
          error.headers.emplace_back("Content-Range", StrCat("bytes */", size));
          return error;
        }
        partial = true;
      }
    }
  }
  reply.code = partial ? 206 : 200;
  reply.content_type = object->content_type;
  reply.media = object->content;
  reply.media_offset = first;
  reply.media_length = size == 0 ? 0 : last - first + 1;
  std::string hash = StrCat("crc32c=", object->crc32c);
  if (!object->md5_hash.empty()) StrAppend(&hash, ",md5=", object->md5_hash);
  reply.headers.emplace_back("x-goog-hash", hash);
  reply.headers.emplace_back("x-goog-generation", StrCat(object->generation));
  reply.headers.emplace_back("x-goog-metageneration", StrCat(object->metageneration));
  reply.headers.emplace_back("x-goog-stored-content-length", StrCat(size));
  reply.headers.emplace_back("x-goog-stored-content-encoding", "identity");
  reply.headers.emplace_back("x-goog-storage-class", "STANDARD");
  reply.headers.emplace_back("Accept-Ranges", "bytes");
  reply.headers.emplace_back("ETag", etag);
  if (partial) {
    reply.headers.emplace_back("Content-Range", StrCat("bytes ", first, "-", last, "/", size));
  }
  return reply;
}

Reply GcsTestServer::ObjectDelete(Request& request, std::string_view bucket,
                                  const std::string& name) {
  absl::StatusOr<Preconditions> preconditions = ParsePreconditions(request);
  if (!preconditions.ok()) {
    return ErrorReply(400, StdView(preconditions.status().message()), "invalidParameter");
  }
  std::shared_ptr<const StoredObject> removed;
  {
    MutexLock lock(&mu_);
    const auto b = buckets_.find(bucket);
    if (b == buckets_.end()) return MissingBucket();
    const auto o = b->second.find(name);
    if (o == b->second.end()) return MissingObject(bucket, name);
    if (const std::string* generation = request.Query("generation")) {
      const std::optional<int64_t> wanted = ParseInt(*generation);
      if (!wanted.has_value() || *wanted != o->second->generation) {
        return MissingObject(bucket, name);
      }
    }
    if (CheckPreconditions(*preconditions, o->second.get(), false) != 0) {
      return PreconditionFailed();
    }
    // Released (its scratch file removed) outside the lock.
    removed = std::move(o->second);
    b->second.erase(o);
  }
  Reply reply;
  reply.code = 204;
  return reply;
}

namespace {

// Checks computed hashes against those a client declared; nullopt when they agree.
std::optional<Reply> CheckHashes(const Hashes& hashes, const std::optional<std::string>& crc32c,
                                 const std::optional<std::string>& md5) {
  if (crc32c.has_value()) {
    const std::string computed = hashes.Crc32cBase64();
    const std::optional<uint32_t> declared = Crc32cFromBase64(*crc32c);
    if (!declared.has_value() || Crc32cToBase64(*declared) != computed) {
      return ErrorReply(400, StrCat("Provided CRC32C \"", *crc32c,
                                    "\" doesn't match calculated CRC32C \"", computed, "\"."));
    }
  }
  if (md5.has_value() && hashes.has_md5()) {
    const std::string computed = hashes.Md5Base64();
    if (*md5 != computed) {
      return ErrorReply(400, StrCat("Provided MD5 hash \"", *md5,
                                    "\" doesn't match calculated MD5 hash \"", computed, "\"."));
    }
  }
  return std::nullopt;
}

// The reply for a body that ended badly: a reset (as injected), or a closed connection.
Reply BrokenBody(ssize_t result) {
  Reply reply = ErrorReply(400, "The request body is malformed or incomplete.", "badRequest");
  reply.reset = result == BodyReader::kReset;
  reply.close = true;
  return reply;
}

}  // namespace

Reply GcsTestServer::InsertSimple(Request& request, std::string_view bucket, bool multipart) {
  absl::StatusOr<Preconditions> preconditions = ParsePreconditions(request);
  if (!preconditions.ok()) {
    return ErrorReply(400, StdView(preconditions.status().message()), "invalidParameter");
  }
  std::string boundary;
  if (multipart) {
    const std::string* content_type = request.Header("Content-Type");
    std::string_view type = content_type != nullptr ? std::string_view(*content_type) : "";
    const size_t at = type.find("boundary=");
    if (!ContainsIgnoreCase(type, "multipart/related") || at == std::string_view::npos) {
      return ErrorReply(400,
                        "Multipart uploads need a Content-Type of multipart/related with a "
                        "boundary.",
                        "badContent");
    }
    std::string_view value = type.substr(at + 9);
    value = value.substr(0, value.find(';'));
    value = StripAsciiWhitespace(value);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    if (value.empty()) return ErrorReply(400, "Empty multipart boundary.", "badContent");
    boundary = std::string(value);
  }
  {
    MutexLock lock(&mu_);
    if (buckets_.find(bucket) == buckets_.end()) return MissingBucket();
  }

  absl::StatusOr<std::unique_ptr<Content>> content = NewContent();
  if (!content.ok()) return ErrorReply(500, StdView(content.status().message()));
  if (request.has_body) {
    if (const std::optional<uint64_t> reset_after = TakeReset(); reset_after.has_value()) {
      request.body->set_reset_after(*reset_after);
    }
  }
  const std::string* content_length = request.Header("Content-Length");
  const bool large =
      request.body->chunked() ||
      (content_length != nullptr && ParseUint(*content_length).value_or(0) >= kPipelineBytes);
  Hashes hashes(options_.compute_md5);
  UploadMetadata metadata;
  std::string media_content_type;
  if (!multipart) {
    if (const std::string* name = request.Query("name")) metadata.name = *name;
    if (!metadata.name.has_value() || metadata.name->empty()) {
      return ErrorReply(400, "Required", "required", "parameter", "name");
    }
    if (const std::string* type = request.Header("Content-Type")) media_content_type = *type;
    UploadWriter writer(content->get(), &hashes, large);
    std::unique_ptr<char[]> buffer(new char[kIoBytes]);
    while (true) {
      const ssize_t n = request.body->Read(buffer.get(), kIoBytes);
      if (n == BodyReader::kEnd) break;
      if (n < 0) return BrokenBody(n);
      if (absl::Status status = writer.Write(buffer.get(), static_cast<size_t>(n)); !status.ok()) {
        Reply reply = ErrorReply(500, StdView(status.message()));
        reply.close = true;
        return reply;
      }
    }
  } else {
    MultipartReader reader(request.body.get(), boundary);
    using Result = MultipartReader::Result;
    auto fail = [&](Result result) {
      if (result == Result::kMalformed) {
        Reply reply = ErrorReply(400, "Malformed multipart body.", "badContent");
        reply.close = !request.body->finished();
        return reply;
      }
      return BrokenBody(result == Result::kReset ? BodyReader::kReset : BodyReader::kBroken);
    };
    bool last = false;
    if (Result result = reader.Begin(); result != Result::kOk) return fail(result);
    Headers part_headers;
    if (Result result = reader.ReadHeaders(&part_headers); result != Result::kOk) {
      return fail(result);
    }
    std::string json;
    absl::Status sink_status;
    Result result = reader.ReadData(
        [&](const char* data, size_t size) {
          if (json.size() + size > kMaxMetadataBytes) {
            return absl::InvalidArgumentError("The metadata part is too large.");
          }
          json.append(data, size);
          return absl::OkStatus();
        },
        &last, &sink_status);
    if (result != Result::kOk) return fail(result);
    if (!sink_status.ok() || last) {
      Reply reply =
          ErrorReply(400,
                     sink_status.ok() ? "A multipart upload needs a metadata part and a media part."
                                      : StdView(sink_status.message()),
                     "badContent");
      reply.close = true;
      return reply;
    }
    absl::StatusOr<UploadMetadata> parsed = ParseUploadMetadata(json);
    if (!parsed.ok()) {
      Reply reply = ErrorReply(400, StdView(parsed.status().message()), "parseError");
      reply.close = true;
      return reply;
    }
    metadata = *std::move(parsed);
    part_headers.clear();
    if (result = reader.ReadHeaders(&part_headers); result != Result::kOk) return fail(result);
    if (const std::string* type = FindHeader(part_headers, "Content-Type")) {
      media_content_type = *type;
    }
    {
      UploadWriter writer(content->get(), &hashes, large);
      result =
          reader.ReadData([&](const char* data, size_t size) { return writer.Write(data, size); },
                          &last, &sink_status);
    }
    if (result != Result::kOk) return fail(result);
    if (!sink_status.ok()) {
      Reply reply = ErrorReply(500, StdView(sink_status.message()));
      reply.close = true;
      return reply;
    }
    if (!last) {
      Reply reply = ErrorReply(400, "A multipart upload has exactly two parts.", "badContent");
      reply.close = true;
      return reply;
    }
    if (const std::string* name = request.Query("name")) {
      if (metadata.name.has_value() && *metadata.name != *name) {
        return ErrorReply(400, StrCat("Value '", *metadata.name,
                                      "' in content does not agree with value '", *name, "'."));
      }
      metadata.name = *name;
    }
    if (!metadata.name.has_value() || metadata.name->empty()) {
      return ErrorReply(400, "Required", "required", "parameter", "name");
    }
  }
  // What follows the closing delimiter, and a reset due after the whole body.
  if (const ssize_t end = request.body->Skip(); end != BodyReader::kEnd) return BrokenBody(end);

  std::optional<std::string> header_crc32c;
  std::optional<std::string> header_md5;
  if (const std::string* goog_hash = request.Header("X-Goog-Hash")) {
    ParseGoogHash(*goog_hash, &header_crc32c, &header_md5);
  }
  if (std::optional<Reply> mismatch = CheckHashes(hashes, metadata.crc32c, metadata.md5_hash)) {
    return *std::move(mismatch);
  }
  if (std::optional<Reply> mismatch = CheckHashes(hashes, header_crc32c, header_md5)) {
    return *std::move(mismatch);
  }

  auto object = std::make_shared<StoredObject>();
  object->bucket = std::string(bucket);
  object->name = *metadata.name;
  object->content_type = metadata.content_type.value_or(
      media_content_type.empty() ? "application/octet-stream" : media_content_type);
  object->metadata = std::move(metadata.metadata);
  object->crc32c = hashes.Crc32cBase64();
  object->md5_hash = hashes.Md5Base64();
  object->content = std::shared_ptr<const Content>(*std::move(content));
  std::shared_ptr<const StoredObject> replaced;
  {
    MutexLock lock(&mu_);
    const auto b = buckets_.find(bucket);
    if (b == buckets_.end()) return MissingBucket();
    auto o = b->second.find(object->name);
    if (CheckPreconditions(*preconditions, o == b->second.end() ? nullptr : o->second.get(),
                           false) != 0) {
      return PreconditionFailed();
    }
    object->generation = NextGeneration();
    object->created_ns = clock_->WallNs();
    ++writes_[StrCat(bucket, "/", object->name)];
    contents_[StrCat(bucket, "/", object->name)].insert(object->crc32c);
    std::shared_ptr<const StoredObject>& slot = b->second[object->name];
    replaced = std::move(slot);
    slot = object;
  }
  Reply reply;
  reply.body = ObjectJson(*object, request.base_url);
  return reply;
}

Reply GcsTestServer::StartResumable(Request& request, std::string_view bucket) {
  absl::StatusOr<Preconditions> preconditions = ParsePreconditions(request);
  if (!preconditions.ok()) {
    return ErrorReply(400, StdView(preconditions.status().message()), "invalidParameter");
  }
  std::string json;
  std::unique_ptr<char[]> buffer(new char[kIoBytes]);
  while (true) {
    const ssize_t n = request.body->Read(buffer.get(), kIoBytes);
    if (n == BodyReader::kEnd) break;
    if (n < 0) return BrokenBody(n);
    json.append(buffer.get(), static_cast<size_t>(n));
    if (json.size() > kMaxMetadataBytes) {
      Reply reply = ErrorReply(400, "The object metadata is too large.", "invalid");
      reply.close = true;
      return reply;
    }
  }
  absl::StatusOr<UploadMetadata> metadata = ParseUploadMetadata(json);
  if (!metadata.ok()) return ErrorReply(400, StdView(metadata.status().message()), "parseError");
  if (const std::string* name = request.Query("name")) {
    if (metadata->name.has_value() && *metadata->name != *name) {
      return ErrorReply(400, StrCat("Value '", *metadata->name,
                                    "' in content does not agree with value '", *name, "'."));
    }
    metadata->name = *name;
  }
  if (!metadata->name.has_value() || metadata->name->empty()) {
    return ErrorReply(400, "Required", "required", "parameter", "name");
  }
  std::optional<uint64_t> total;
  if (const std::string* length = request.Header("X-Upload-Content-Length")) {
    total = ParseUint(*length);
    if (!total.has_value()) {
      return ErrorReply(400, StrCat("Invalid X-Upload-Content-Length: ", *length), "invalid",
                        "header", "X-Upload-Content-Length");
    }
  }
  absl::StatusOr<std::unique_ptr<Content>> content = NewContent();
  if (!content.ok()) return ErrorReply(500, StdView(content.status().message()));
  if (total.has_value() && (*content)->fd < 0) {
    (*content)->memory.reserve(std::min<uint64_t>(*total, uint64_t{4} << 30));
  }

  auto session = std::make_shared<Session>();
  session->bucket = std::string(bucket);
  session->name = *metadata->name;
  const std::string* upload_type = request.Header("X-Upload-Content-Type");
  session->content_type = metadata->content_type.value_or(
      upload_type != nullptr && !upload_type->empty() ? *upload_type : "application/octet-stream");
  session->metadata = std::move(metadata->metadata);
  session->expected_crc32c = metadata->crc32c;
  session->expected_md5 = metadata->md5_hash;
  session->preconditions = *preconditions;
  session->total = total;
  session->content = *std::move(content);
  session->hashes = std::make_unique<Hashes>(options_.compute_md5);
  {
    MutexLock lock(&mu_);
    if (buckets_.find(bucket) == buckets_.end()) return MissingBucket();
    const uint64_t counter = ++next_id_;
    uint64_t mix = session_salt_ ^ (counter * 0x9E3779B97F4A7C15ULL);
    mix ^= mix >> 31;
    char id[40];
    std::snprintf(id, sizeof(id), "ADPyc%016llx%06llx", static_cast<unsigned long long>(mix),
                  static_cast<unsigned long long>(counter));
    session->id = id;
    sessions_[session->id] = session;
  }
  Reply reply;
  reply.headers.emplace_back(
      "Location", StrCat(request.base_url, "/upload/storage/v1/b/", PercentEncode(bucket),
                         "/o?uploadType=resumable&name=", PercentEncode(session->name),
                         "&upload_id=", session->id));
  reply.headers.emplace_back("X-GUploader-UploadID", session->id);
  return reply;
}

Reply GcsTestServer::CancelResumable(Request& request, const std::string& upload_id) {
  std::shared_ptr<Session> session;
  {
    MutexLock lock(&mu_);
    const auto it = sessions_.find(upload_id);
    if (it == sessions_.end()) {
      return ErrorReply(404, StrCat("No such upload: ", upload_id), "notFound");
    }
    session = it->second;
    mu_.AwaitWithDeadline(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !session->busy || stopping_; },
        std::chrono::steady_clock::now() + kSessionBusyWait);
    if (session->busy) {
      return ErrorReply(503, "The upload session is busy with another request. Please retry.");
    }
    if (session->state == Session::State::kFinalized) {
      Reply reply;
      reply.body = ObjectJson(*session->finalized, request.base_url);
      return reply;
    }
    if (session->state == Session::State::kGone) {
      return ErrorReply(410, "The upload session was cancelled or has failed.", "gone");
    }
    session->state = Session::State::kGone;
  }
  // The session's bytes go now; the cancelled id is remembered (410 from now on).
  session->content.reset();
  Reply reply;
  reply.code = 499;
  return reply;
}

Reply GcsTestServer::ResumableChunk(Request& request, std::string_view bucket,
                                    const std::string& upload_id) {
  // Content-Range: "bytes FIRST-LAST/TOTAL", "bytes FIRST-LAST/*", "bytes */TOTAL" or
  // "bytes */*". Without one, the body is the whole object.
  bool query = false;
  uint64_t first = 0;
  uint64_t last = 0;
  std::optional<uint64_t> total;
  // No Content-Range and a chunked body: the object is the body, whatever its length.
  bool open_ended = false;
  const std::string* content_range = request.Header("Content-Range");
  const std::string* content_length = request.Header("Content-Length");
  if (content_range != nullptr) {
    std::string_view spec = StripAsciiWhitespace(*content_range);
    bool ok = ConsumePrefix(&spec, "bytes ") || ConsumePrefix(&spec, "bytes=");
    const size_t slash = spec.find('/');
    ok = ok && slash != std::string_view::npos;
    if (ok) {
      const std::string_view range = StripAsciiWhitespace(spec.substr(0, slash));
      const std::string_view size = StripAsciiWhitespace(spec.substr(slash + 1));
      if (size != "*") {
        total = ParseUint(size);
        ok = total.has_value();
      }
      if (range == "*") {
        query = true;
      } else {
        const size_t dash = range.find('-');
        const std::optional<uint64_t> a =
            dash == std::string_view::npos ? std::nullopt : ParseUint(range.substr(0, dash));
        const std::optional<uint64_t> b =
            dash == std::string_view::npos ? std::nullopt : ParseUint(range.substr(dash + 1));
        ok = ok && a.has_value() && b.has_value() && *a <= *b;
        if (ok) {
          first = *a;
          last = *b;
        }
      }
    }
    if (!ok) {
      return ErrorReply(400, StrCat("Failed to parse Content-Range header: ", *content_range),
                        "invalid", "header", "Content-Range");
    }
  } else if (request.body->chunked()) {
    open_ended = true;
  } else {
    const uint64_t length = content_length != nullptr ? ParseUint(*content_length).value_or(0) : 0;
    total = length;
    if (length == 0) {
      query = true;
    } else {
      last = length - 1;
    }
  }

  std::shared_ptr<Session> session;
  {
    MutexLock lock(&mu_);
    const auto it = sessions_.find(upload_id);
    if (it == sessions_.end()) {
      return ErrorReply(404, StrCat("No such upload: ", upload_id), "notFound");
    }
    session = it->second;
    if (session->bucket != bucket) {
      return ErrorReply(404, StrCat("No such upload: ", upload_id), "notFound");
    }
    mu_.AwaitWithDeadline(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !session->busy || stopping_; },
        std::chrono::steady_clock::now() + kSessionBusyWait);
    if (stopping_) return ErrorReply(503, "The server is shutting down.");
    if (session->busy) {
      return ErrorReply(503, "The upload session is busy with another request. Please retry.");
    }
    if (session->state == Session::State::kFinalized) {
      Reply reply;
      reply.body = ObjectJson(*session->finalized, request.base_url);
      return reply;
    }
    if (session->state == Session::State::kGone) {
      return ErrorReply(410, "The upload session was cancelled or has failed.", "gone");
    }
    session->busy = true;
  }
  struct Release {
    GcsTestServer* server;
    Session* session;
    ~Release() {
      MutexLock lock(&server->mu_);
      session->busy = false;
    }
  } release{this, session.get()};

  Content& content = *session->content;
  Hashes& hashes = *session->hashes;
  const uint64_t persisted = content.size;
  auto incomplete = [&] {
    Reply reply;
    reply.code = 308;
    if (content.size > 0) reply.headers.emplace_back("Range", StrCat("bytes=0-", content.size - 1));
    return reply;
  };
  auto total_mismatch = [&](uint64_t declared) {
    return ErrorReply(400,
                      StrCat("The object size ", declared, " does not match the size ",
                             *session->total, " declared before."),
                      "invalid", "header", "Content-Range");
  };

  // Finalizes with the bytes persisted: checks the hashes, then the preconditions, then stores.
  auto finalize = [&](bool check_hashes = true) -> Reply {
    std::optional<std::string> header_crc32c;
    std::optional<std::string> header_md5;
    if (const std::string* goog_hash = request.Header("X-Goog-Hash")) {
      ParseGoogHash(*goog_hash, &header_crc32c, &header_md5);
    }
    std::optional<Reply> mismatch;
    if (check_hashes) {
      mismatch = CheckHashes(hashes, session->expected_crc32c, session->expected_md5);
      if (!mismatch.has_value()) mismatch = CheckHashes(hashes, header_crc32c, header_md5);
    }
    auto object = std::make_shared<StoredObject>();
    object->bucket = session->bucket;
    object->name = session->name;
    object->content_type = session->content_type;
    object->metadata = session->metadata;
    object->crc32c = hashes.Crc32cBase64();
    object->md5_hash = hashes.Md5Base64();
    std::shared_ptr<const StoredObject> replaced;
    std::unique_ptr<Content> dropped;
    MutexLock lock(&mu_);
    if (mismatch.has_value()) {
      session->state = Session::State::kGone;
      dropped = std::move(session->content);
      return *std::move(mismatch);
    }
    const auto b = buckets_.find(session->bucket);
    if (b == buckets_.end()) {
      session->state = Session::State::kGone;
      dropped = std::move(session->content);
      return MissingBucket();
    }
    auto o = b->second.find(object->name);
    if (CheckPreconditions(session->preconditions, o == b->second.end() ? nullptr : o->second.get(),
                           false) != 0) {
      session->state = Session::State::kGone;
      dropped = std::move(session->content);
      return PreconditionFailed();
    }
    object->content = std::shared_ptr<const Content>(std::move(session->content));
    object->generation = NextGeneration();
    object->created_ns = clock_->WallNs();
    ++writes_[StrCat(bucket, "/", object->name)];
    contents_[StrCat(bucket, "/", object->name)].insert(object->crc32c);
    std::shared_ptr<const StoredObject>& slot = b->second[object->name];
    replaced = std::move(slot);
    slot = object;
    session->state = Session::State::kFinalized;
    session->finalized = object;
    Reply reply;
    reply.body = ObjectJson(*object, request.base_url);
    return reply;
  };

  if (query) {
    bool finalize_short = false;
    {
      MutexLock lock(&mu_);
      if (finalize_short_left_ > 0) {
        --finalize_short_left_;
        finalize_short = true;
      }
    }
    if (finalize_short) return finalize(/*check_hashes=*/false);
    if (total.has_value()) {
      if (session->total.has_value() && *session->total != *total) return total_mismatch(*total);
      if (*total < persisted) {
        return ErrorReply(400,
                          StrCat("The object size ", *total, " is smaller than the ", persisted,
                                 " bytes already uploaded."),
                          "invalid", "header", "Content-Range");
      }
      if (*total == persisted) return finalize();
    }
    return incomplete();
  }

  const uint64_t chunk_size = open_ended ? 0 : last - first + 1;
  if (!open_ended) {
    if (content_length != nullptr && ParseUint(*content_length) != chunk_size) {
      return ErrorReply(400,
                        StrCat("Content-Range ", *content_range, " covers ", chunk_size,
                               " bytes but the body has ", *content_length, "."),
                        "invalid", "header", "Content-Range");
    }
    if (total.has_value()) {
      if (last >= *total) {
        return ErrorReply(400, StrCat("Content-Range ", *content_range, " ends beyond the object."),
                          "invalid", "header", "Content-Range");
      }
      if (session->total.has_value() && *session->total != *total) return total_mismatch(*total);
    }
    const bool final_chunk = total.has_value() && last + 1 == *total;
    if (!final_chunk && chunk_size % kUploadQuantum != 0) {
      return ErrorReply(400,
                        StrCat("Invalid request. The number of bytes uploaded is required to be "
                               "equal or greater than ",
                               kUploadQuantum,
                               ", except for the final request (it's recommended to be the "
                               "exact multiple of ",
                               kUploadQuantum, " bytes). The received request contained ",
                               chunk_size, " bytes, which does not meet this requirement."),
                        "invalid");
    }
    if (first > persisted) {
      return ErrorReply(400,
                        StrCat("Content-Range starts at byte ", first, " but only ", persisted,
                               " bytes were persisted; resume from byte ", persisted, "."),
                        "invalid", "header", "Content-Range");
    }
    if (total.has_value()) session->total = total;
  }

  if (const std::optional<uint64_t> reset_after = TakeReset(); reset_after.has_value()) {
    request.body->set_reset_after(*reset_after);
  }
  const Hashes hashes_before = hashes;
  // Bytes of this request already persisted (sent again after a lost answer): dropped.
  uint64_t skip = open_ended ? persisted : persisted - first;
  uint64_t received = 0;
  ssize_t end_result = BodyReader::kEnd;
  absl::Status write_status;
  {
    const bool large = open_ended || chunk_size >= kPipelineBytes;
    UploadWriter writer(&content, &hashes, large);
    std::unique_ptr<char[]> buffer(new char[kIoBytes]);
    while (true) {
      const ssize_t n = request.body->Read(buffer.get(), kIoBytes);
      if (n <= 0) {
        end_result = n;
        break;
      }
      received += static_cast<uint64_t>(n);
      if (!open_ended && received > chunk_size) {
        end_result = BodyReader::kBroken;
        break;
      }
      const size_t dropped =
          static_cast<size_t>(std::min<uint64_t>(skip, static_cast<uint64_t>(n)));
      skip -= dropped;
      if (static_cast<size_t>(n) > dropped) {
        write_status = writer.Write(buffer.get() + dropped, static_cast<size_t>(n) - dropped);
        if (!write_status.ok()) break;
      }
    }
  }
  const bool complete =
      write_status.ok() && end_result == BodyReader::kEnd && (open_ended || received == chunk_size);
  if (!complete) {
    // Keep what arrived, rounded down to the upload quantum; rebuild the hashes for it.
    uint64_t keep = write_status.ok() ? content.size / kUploadQuantum * kUploadQuantum : persisted;
    keep = std::max(keep, persisted);
    if (!content.Truncate(keep).ok()) {
      keep = persisted;
      content.Truncate(persisted).IgnoreError();
    }
    hashes = hashes_before;
    std::unique_ptr<char[]> buffer(new char[kIoBytes]);
    for (uint64_t offset = persisted; offset < keep;) {
      const size_t n = std::min<uint64_t>(keep - offset, kIoBytes);
      if (!content.ReadAt(offset, n, buffer.get()).ok()) std::abort();
      hashes.UpdateCrc(buffer.get(), n);
      hashes.UpdateMd5(buffer.get(), n);
      offset += n;
    }
    if (!write_status.ok()) {
      Reply reply = ErrorReply(500, StdView(write_status.message()));
      reply.close = !request.body->finished();
      return reply;
    }
    if (end_result == BodyReader::kEnd) {
      return ErrorReply(400,
                        StrCat("The body has ", received, " bytes but Content-Range ",
                               *content_range, " covers ", chunk_size, "."),
                        "invalid", "header", "Content-Range");
    }
    return BrokenBody(end_result);
  }
  if (open_ended) {
    total = received;
    session->total = received;
  }
  if (total.has_value() && content.size == *total) return finalize();
  return incomplete();
}

}  // namespace clusterprof::testing
