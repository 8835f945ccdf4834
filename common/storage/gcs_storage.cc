#include "common/storage/gcs_storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/io/crc32c.h"
#include "common/storage/spool.h"
#include "spdlog/spdlog.h"

namespace clusterprof::storage {
namespace {

constexpr size_t kWriteBufferBytes = 1 << 20;
constexpr size_t kReadBytes = 8 << 20;
constexpr int64_t kMaxRequeueDelayNs = 10 * 60 * kNanosPerSecond;
// Finished uploads remembered for UploadStatus().
constexpr size_t kRememberedUploads = 4096;

std::string ContentTypeFor(std::string_view name) {
  if (EndsWith(name, ".json")) return "application/json";
  if (EndsWith(name, ".gz")) return "application/gzip";
  return "application/octet-stream";
}

absl::Status PreadAll(int fd, uint64_t offset, char* buffer, size_t size, std::string_view path) {
  while (size > 0) {
    const ssize_t n = pread(fd, buffer, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "cannot read spool file", path);
    if (n == 0) {
      return absl::DataLossError(StrCat("spool file ", path, " ended early at byte ", offset));
    }
    buffer += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string FormatBytes(uint64_t bytes) {
  char text[32];
  if (bytes < 1024) {
    std::snprintf(text, sizeof(text), "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < (1 << 20)) {
    std::snprintf(text, sizeof(text), "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  return text;
}

std::string_view StripTrailingPeriod(std::string_view text) {
  while (EndsWith(text, ".")) text.remove_suffix(1);
  return text;
}

// Chunks of a spool file, mapped one at a time: the upload sends straight from the page cache
// (no copy into a buffer of ours), and only one chunk is mapped (and resident) at once.
class MappedChunks {
 public:
  MappedChunks(int fd, std::string_view path) : fd_(fd), path_(path) {}
  ~MappedChunks() { Unmap(); }

  absl::StatusOr<std::string_view> Map(uint64_t offset, size_t size) {
    Unmap();
    static const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t start = offset / kPage * kPage;
    length_ = static_cast<size_t>(offset - start) + size;
    void* mapped = mmap(nullptr, length_, PROT_READ, MAP_SHARED | MAP_POPULATE, fd_,
                        static_cast<off_t>(start));
    if (mapped == MAP_FAILED) {
      length_ = 0;
      return ErrnoToStatus(errno, "cannot map spool file", path_);
    }
    mapped_ = static_cast<char*>(mapped);
    return std::string_view(mapped_ + (offset - start), size);
  }

 private:
  void Unmap() {
    if (mapped_ != nullptr) munmap(mapped_, length_);
    mapped_ = nullptr;
  }

  const int fd_;
  const std::string_view path_;
  char* mapped_ = nullptr;
  size_t length_ = 0;
};

// One file in the spool and its upload.
struct Upload {
  SpoolRecord record;
  UploadState state = UploadState::kSpooled;
  // An attempt has run to its end (committed, failed, or deferred).
  bool attempted = false;
  int deferrals = 0;
  int64_t not_before_ns = 0;  // monotonic; for deferred uploads
  // Spooled by an earlier process, which may have finished the upload just before it died.
  bool from_earlier_process = false;
  // Set with the state reaching kCommitted or kFailed; Commit() sleeps on it.
  std::atomic<bool> finished{false};
};

}  // namespace

absl::StatusOr<std::pair<std::string, std::string>> SplitGsUri(std::string_view uri,
                                                               bool allow_bucket) {
  std::string_view rest = uri;
  if (!ConsumePrefix(&rest, "gs://")) {
    return absl::InvalidArgumentError(StrCat("'", uri, "' is not a gs:// URI"));
  }
  const size_t slash = rest.find('/');
  std::string bucket(rest.substr(0, slash));
  std::string name(slash == std::string_view::npos ? "" : rest.substr(slash + 1));
  if (bucket.empty()) return absl::InvalidArgumentError(StrCat("'", uri, "' names no bucket"));
  if (name.empty() && !allow_bucket) {
    return absl::InvalidArgumentError(StrCat("'", uri, "' names a bucket, not an object"));
  }
  return std::make_pair(std::move(bucket), std::move(name));
}

namespace internal {

struct GcsStorageImpl {
  GcsStorageImpl(std::unique_ptr<gcs::Client> client_in, GcsStorageOptions options_in,
                 std::unique_ptr<Spool> spool_in, std::shared_ptr<std::atomic<bool>> stop_in)
      : client(std::move(client_in)),
        options(std::move(options_in)),
        clock(*client->options().clock),
        spool(std::move(spool_in)),
        stop(std::move(stop_in)) {}

  ~GcsStorageImpl() { Shutdown(0); }

  void StopWaiting() {
    closing.store(true, std::memory_order_release);
    clock.Wake();  // Commit() waiters
  }

  void Shutdown(int64_t drain_ns) {
    if (shut_down.exchange(true)) return;
    StopWaiting();
    const int64_t deadline = clock.MonotonicNs() + drain_ns;
    while (clock.MonotonicNs() < deadline) {
      {
        MutexLock lock(&mu);
        bool busy = !queue.empty();
        for (const auto& [id, upload] : pending) busy |= upload->state == UploadState::kUploading;
        if (!busy) break;
      }
      clock.SleepUntilMonotonicNs(std::min(deadline, clock.MonotonicNs() + 20 * kNanosPerMilli));
    }
    {
      MutexLock lock(&mu);
      stop->store(true, std::memory_order_release);
    }
    clock.Wake();  // pauses between retries
    for (std::thread& worker : workers) {
      if (worker.joinable()) worker.join();
    }
    const SpoolStats left = Stats();
    if (left.spooled + left.uploading + left.failed > 0) {
      spdlog::info("spool {}: {} file(s), {}, left for the next start", spool->dir(),
                   left.spooled + left.uploading + left.failed, FormatBytes(left.used_bytes));
    }
  }

  const std::unique_ptr<gcs::Client> client;
  const GcsStorageOptions options;
  Clock& clock;
  const std::unique_ptr<Spool> spool;
  // Set by Shutdown: uploads stop between chunks, pauses between retries end.
  const std::shared_ptr<std::atomic<bool>> stop;
  // Set by Shutdown: Commit() no longer waits for uploads.
  std::atomic<bool> closing{false};
  std::atomic<bool> shut_down{false};
  std::vector<std::thread> workers;

  mutable Mutex mu;
  std::deque<std::shared_ptr<Upload>> queue ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<Upload>> deferred ABSL_GUARDED_BY(mu);
  // Uploads not yet committed, by spool id.
  std::map<std::string, std::shared_ptr<Upload>> pending ABSL_GUARDED_BY(mu);
  // The latest upload of each URI, committed ones included (bounded).
  std::map<std::string, std::shared_ptr<Upload>> by_uri ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<Upload>> recovered ABSL_GUARDED_BY(mu);

  void Notify(UploadEvent::Kind kind, const std::string& uri, uint64_t bytes = 0,
              double seconds = 0, std::string error = "") {
    if (options.observer) {
      options.observer(UploadEvent{kind, uri, bytes, seconds, std::move(error), Stats()});
    }
  }

  SpoolStats Stats() ABSL_LOCKS_EXCLUDED(mu) {
    SpoolStats stats;
    {
      MutexLock lock(&mu);
      for (const auto& [id, upload] : pending) {
        switch (upload->state) {
          case UploadState::kSpooled:
            ++stats.spooled;
            break;
          case UploadState::kUploading:
            ++stats.uploading;
            break;
          case UploadState::kFailed:
            ++stats.failed;
            break;
          case UploadState::kCommitted:
            break;
        }
      }
    }
    stats.used_bytes = spool->used_bytes();
    stats.max_bytes = spool->max_bytes();
    return stats;
  }

  void Enqueue(std::shared_ptr<Upload> upload) ABSL_LOCKS_EXCLUDED(mu) {
    MutexLock lock(&mu);
    pending[upload->record.id] = upload;
    by_uri[upload->record.uri] = upload;
    if (by_uri.size() > kRememberedUploads) {
      for (auto it = by_uri.begin(); it != by_uri.end() && by_uri.size() > kRememberedUploads;) {
        it = it->second->state == UploadState::kCommitted ? by_uri.erase(it) : std::next(it);
      }
    }
    queue.push_back(std::move(upload));
  }

  static ObjectInfo Snapshot(const Upload& upload) {
    ObjectInfo info;
    info.uri = upload.record.uri;
    info.bytes = upload.record.bytes;
    info.state = upload.state;
    info.bytes_committed =
        upload.state == UploadState::kCommitted ? upload.record.bytes : upload.record.committed;
    info.crc32c = Crc32cToBase64(upload.record.crc32c);
    info.error = upload.record.error;
    return info;
  }

  void WorkerLoop() {
    while (true) {
      std::shared_ptr<Upload> next;
      {
        MutexLock lock(&mu);
        while (true) {
          if (stop->load(std::memory_order_acquire)) return;
          const int64_t now = clock.MonotonicNs();
          int64_t wait_ns = kNanosPerSecond;
          for (auto it = deferred.begin(); it != deferred.end();) {
            if ((*it)->not_before_ns <= now) {
              queue.push_back(std::move(*it));
              it = deferred.erase(it);
            } else {
              wait_ns = std::min(wait_ns, (*it)->not_before_ns - now);
              ++it;
            }
          }
          if (!queue.empty()) {
            next = std::move(queue.front());
            queue.pop_front();
            next->state = UploadState::kUploading;
            break;
          }
          // Until something is queued, or the first deferred upload is due (on the injected
          // clock, so look again at least once a second).
          mu.AwaitWithTimeout(
              [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
                return stop->load(std::memory_order_acquire) || !queue.empty();
              },
              std::chrono::nanoseconds(std::max<int64_t>(wait_ns, kNanosPerMilli)));
        }
      }
      Run(next);
    }
  }

  // One attempt at an upload, to its end or until it gives up.
  void Run(const std::shared_ptr<Upload>& upload) {
    SpoolRecord record;
    {
      MutexLock lock(&mu);
      record = upload->record;
    }
    const int64_t start_ns = clock.MonotonicNs();
    const absl::StatusOr<gcs::ObjectMetadata> result = Transfer(upload, record);
    const double seconds = static_cast<double>(clock.MonotonicNs() - start_ns) / 1e9;
    if (result.ok()) {
      if (absl::Status removed = spool->Remove(record.id); !removed.ok()) {
        spdlog::warn("uploaded {} but could not remove its spool entry: {}", record.uri,
                     std::string(removed.message()));
      }
      spool->Release(record.bytes);
      {
        MutexLock lock(&mu);
        upload->state = UploadState::kCommitted;
        upload->record.committed = record.bytes;
        upload->record.error.clear();
        pending.erase(record.id);
      }
      spdlog::info("uploaded {} ({} in {:.1f} s, crc32c {} verified)", record.uri,
                   FormatBytes(record.bytes), seconds, Crc32cToBase64(record.crc32c));
      Notify(UploadEvent::Kind::kUploaded, record.uri, record.bytes, seconds);
      Finished(*upload);
      return;
    }
    const absl::Status& status = result.status();
    if (absl::IsCancelled(status) && stop->load(std::memory_order_acquire)) {
      MutexLock lock(&mu);
      upload->state = UploadState::kSpooled;
      return;
    }
    const std::string error(status.message());
    if (gcs::IsTransient(status)) {
      int64_t delay;
      {
        MutexLock lock(&mu);
        upload->state = UploadState::kSpooled;
        upload->record.error = error;
        delay = options.requeue_delay_ns << std::min(upload->deferrals, 10);
        delay = std::min(delay, kMaxRequeueDelayNs);
        ++upload->deferrals;
        upload->not_before_ns = clock.MonotonicNs() + delay;
        record = upload->record;
        deferred.push_back(upload);
      }
      (void)spool->WriteRecord(record);
      spdlog::warn("upload of {} deferred; trying again in {:.1f} s (it stays in the spool {}): {}",
                   record.uri, static_cast<double>(delay) / kNanosPerSecond, spool->dir(), error);
      Notify(UploadEvent::Kind::kDeferred, record.uri, record.bytes, seconds, error);
      {
        MutexLock lock(&mu);
        upload->attempted = true;
      }
      clock.Wake();  // Commit() waiters look at `attempted`
      return;
    }
    {
      MutexLock lock(&mu);
      upload->state = UploadState::kFailed;
      upload->record.failed = true;
      upload->record.error = error;
      record = upload->record;
    }
    (void)spool->WriteRecord(record);
    spdlog::error(
        "upload of {} failed: {}; the file stays in the spool ({}) and is tried again when the "
        "spool is next opened (the sidecar restarts)",
        record.uri, StripTrailingPeriod(error), spool->DataPath(record.id));
    Notify(UploadEvent::Kind::kFailed, record.uri, record.bytes, seconds, error);
    Finished(*upload);
  }

  // Lets Commit() and ResumePendingCommits() waiters go, after the observer saw the outcome.
  void Finished(Upload& upload) {
    {
      MutexLock lock(&mu);
      upload.attempted = true;
      upload.finished.store(true, std::memory_order_release);
    }
    clock.Wake();
  }

  absl::StatusOr<gcs::ObjectMetadata> Transfer(const std::shared_ptr<Upload>& upload,
                                               const SpoolRecord& record) {
    CLUSTERPROF_ASSIGN_OR_RETURN(auto location, SplitGsUri(record.uri));
    gcs::UploadRequest request;
    request.bucket = location.first;
    request.name = location.second;
    request.content_type = record.content_type;
    request.size = record.bytes;
    request.crc32c = record.crc32c;
    const std::string path = spool->DataPath(record.id);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, "cannot open spool file", path);
    absl::StatusOr<gcs::ObjectMetadata> result;
    if (upload->from_earlier_process && record.session_uri.empty()) {
      // The earlier process may have sent the whole object and died before it could note so:
      // an object that is already these bytes is not written again.
      absl::StatusOr<gcs::ObjectMetadata> there =
          client->GetObjectMetadata(request.bucket, request.name);
      if (there.ok() && there->size == record.bytes && there->crc32c == record.crc32c) {
        close(fd);
        spdlog::info("{} is already in the bucket (its CRC32C matches): not uploaded again",
                     record.uri);
        return there;
      }
    }
    if (record.bytes <= options.chunk_bytes && record.session_uri.empty()) {
      std::string content(record.bytes, '\0');
      absl::Status read = PreadAll(fd, 0, content.data(), content.size(), path);
      result = read.ok() ? client->InsertObject(request, content)
                         : absl::StatusOr<gcs::ObjectMetadata>(read);
    } else {
      MappedChunks chunks(fd, path);
      uint64_t next_report = record.committed + record.bytes / 10;
      const int64_t start_ns = clock.MonotonicNs();
      result = client->UploadResumable(
          request, [&](uint64_t offset, size_t size) { return chunks.Map(offset, size); },
          gcs::ResumableState{record.session_uri, record.committed}, options.chunk_bytes,
          [&](const gcs::UploadProgress& progress) {
            SpoolRecord copy;
            bool new_session;
            {
              MutexLock lock(&mu);
              new_session = upload->record.session_uri != progress.state.session_uri;
              upload->record.session_uri = progress.state.session_uri;
              upload->record.committed = progress.committed;
              copy = upload->record;
            }
            // A new session URI must survive a crash: the next process resumes that session.
            // The offset need not (a resumed upload asks GCS where it stands first), which
            // saves two fsyncs per chunk.
            if (new_session) {
              if (absl::Status written = spool->WriteRecord(copy); !written.ok()) {
                spdlog::warn("cannot record the upload session of {}: {}", copy.uri,
                             std::string(written.message()));
              }
            }
            if (progress.committed >= next_report && progress.committed < progress.total) {
              next_report = progress.committed + progress.total / 10;
              const double seconds = static_cast<double>(clock.MonotonicNs() - start_ns) / 1e9;
              spdlog::info("uploading {}: {} of {} ({:.0f}%, {:.1f} s)", copy.uri,
                           FormatBytes(progress.committed), FormatBytes(progress.total),
                           100.0 * static_cast<double>(progress.committed) /
                               static_cast<double>(progress.total),
                           seconds);
            }
          },
          stop.get());
    }
    close(fd);
    return result;
  }
};

}  // namespace internal

namespace {

using internal::GcsStorageImpl;

class GcsObjectWriter final : public ObjectWriter {
 public:
  GcsObjectWriter(GcsStorageImpl* impl, std::string uri, std::string id, int fd)
      : impl_(impl), uri_(std::move(uri)), id_(std::move(id)), fd_(fd) {
    buffer_.reserve(kWriteBufferBytes);
  }
  ~GcsObjectWriter() override { Abort(); }

  absl::Status Append(std::string_view data) override {
    if (!status_.ok()) return status_;
    if (fd_ < 0) return absl::FailedPreconditionError(StrCat("write to closed object ", uri_));
    crc_ = Crc32cExtend(crc_, data.data(), data.size());
    bytes_ += data.size();
    if (buffer_.size() + data.size() <= kWriteBufferBytes) {
      buffer_.append(data);
      return absl::OkStatus();
    }
    status_ = Flush();
    if (status_.ok() && data.size() >= kWriteBufferBytes) {
      status_ = Write(data);
    } else if (status_.ok()) {
      buffer_.append(data);
    }
    return status_;
  }

  absl::StatusOr<ObjectInfo> Commit() override {
    if (fd_ < 0) return absl::FailedPreconditionError(StrCat("commit of closed object ", uri_));
    if (status_.ok()) status_ = Flush();
    const std::string path = impl_->spool->DataPath(id_);
    if (status_.ok() && fsync(fd_) != 0) status_ = ErrnoToStatus(errno, "cannot fsync", path);
    if (!status_.ok()) {
      Abort();
      return status_;
    }
    close(fd_);
    fd_ = -1;
    auto upload = std::make_shared<Upload>();
    upload->record.id = id_;
    upload->record.uri = uri_;
    upload->record.content_type = ContentTypeFor(uri_);
    upload->record.bytes = bytes_;
    upload->record.crc32c = crc_;
    upload->record.created_wall_ns = impl_->clock.WallNs();
    if (absl::Status written = impl_->spool->WriteRecord(upload->record); !written.ok()) {
      impl_->spool->RemoveDataFile(id_);
      impl_->spool->Release(reserved_);
      reserved_ = 0;
      return Annotate(written, StrCat("spooling ", uri_));
    }
    reserved_ = 0;  // the entry owns the space now
    committed_ = true;
    impl_->Enqueue(upload);
    // Wait for the upload: done, failed for good, or tried and deferred.
    const int64_t deadline = impl_->clock.MonotonicNs() + impl_->options.commit_wait_ns;
    while (!upload->finished.load(std::memory_order_acquire) &&
           !impl_->closing.load(std::memory_order_acquire)) {
      {
        MutexLock lock(&impl_->mu);
        if (upload->attempted) break;
      }
      if (impl_->clock.MonotonicNs() >= deadline) break;
      impl_->clock.SleepUntilMonotonicNsUnless(
          std::min(deadline, impl_->clock.MonotonicNs() + 100 * kNanosPerMilli), upload->finished);
    }
    MutexLock lock(&impl_->mu);
    ObjectInfo info = GcsStorageImpl::Snapshot(*upload);
    if (info.state != UploadState::kCommitted) info.spool_path = impl_->spool->DataPath(id_);
    return info;
  }

  void Abort() override {
    if (committed_ || fd_ < 0) return;
    close(fd_);
    fd_ = -1;
    impl_->spool->RemoveDataFile(id_);
    impl_->spool->Release(reserved_);
    reserved_ = 0;
  }

  const std::string& uri() const override { return uri_; }

 private:
  absl::Status Flush() {
    absl::Status status = Write(buffer_);
    buffer_.clear();
    return status;
  }

  absl::Status Write(std::string_view data) {
    if (data.empty()) return absl::OkStatus();
    if (absl::Status reserved = impl_->spool->Reserve(data.size(), uri_); !reserved.ok()) {
      impl_->Notify(UploadEvent::Kind::kSpoolFull, uri_, bytes_, 0,
                    std::string(reserved.message()));
      return reserved;
    }
    reserved_ += data.size();
    while (!data.empty()) {
      const ssize_t n = write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, "cannot write spool file", impl_->spool->DataPath(id_));
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  GcsStorageImpl* const impl_;
  const std::string uri_;
  const std::string id_;
  int fd_;
  std::string buffer_;
  absl::Status status_;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
  uint64_t reserved_ = 0;
  bool committed_ = false;
};

class GcsObjectReader final : public ObjectReader {
 public:
  GcsObjectReader(gcs::Client* client, std::string uri, gcs::ObjectMetadata object)
      : client_(client), uri_(std::move(uri)), object_(std::move(object)) {}

  absl::StatusOr<size_t> Read(char* buffer, size_t size) override {
    if (position_ == chunk_.size()) {
      if (offset_ >= object_.size) return 0;
      CLUSTERPROF_ASSIGN_OR_RETURN(
          chunk_, client_->ReadRange(object_.bucket, object_.name, offset_,
                                     std::min<uint64_t>(kReadBytes, object_.size - offset_),
                                     object_.generation));
      position_ = 0;
      if (chunk_.empty()) {
        return absl::DataLossError(StrCat(uri_, " ended at byte ", offset_, " of ", object_.size));
      }
      offset_ += chunk_.size();
    }
    const size_t n = std::min(size, chunk_.size() - position_);
    std::copy_n(chunk_.data() + position_, n, buffer);
    position_ += n;
    return n;
  }
  const std::string& uri() const override { return uri_; }

 private:
  gcs::Client* const client_;
  const std::string uri_;
  const gcs::ObjectMetadata object_;
  std::string chunk_;
  size_t position_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace

GcsStorage::GcsStorage(std::unique_ptr<GcsStorageImpl> impl) : impl_(std::move(impl)) {}
GcsStorage::~GcsStorage() = default;

absl::StatusOr<std::unique_ptr<GcsStorage>> GcsStorage::Create(gcs::ClientOptions client_options,
                                                               GcsStorageOptions options) {
  if (options.chunk_bytes == 0 || options.chunk_bytes % gcs::kChunkQuantum != 0) {
    return absl::InvalidArgumentError(StrCat("upload chunk size ", options.chunk_bytes,
                                             " is not a positive multiple of 256 KiB"));
  }
  if (options.upload_threads < 1) {
    return absl::InvalidArgumentError("at least one upload thread is needed");
  }
  if (options.spool_dir.empty()) {
    return absl::InvalidArgumentError("gs:// logdirs need a spool directory (--spool-dir)");
  }
  std::function<void(const UploadEvent&)> observer = options.observer;
  auto user_retry = client_options.on_retry;
  client_options.on_retry = [observer, user_retry](std::string_view what, const absl::Status& why) {
    if (user_retry) user_retry(what, why);
    if (observer) {
      observer(UploadEvent{UploadEvent::Kind::kRetry, std::string(what), 0, 0,
                           std::string(why.message()), SpoolStats()});
    }
  };
  auto stop = std::make_shared<std::atomic<bool>>(false);
  client_options.stop = stop;
  CLUSTERPROF_ASSIGN_OR_RETURN(std::unique_ptr<gcs::Client> client,
                               gcs::Client::Create(std::move(client_options)));
  CLUSTERPROF_ASSIGN_OR_RETURN(std::unique_ptr<Spool> spool,
                               Spool::Open(options.spool_dir, options.spool_max_bytes));
  auto impl = std::make_unique<GcsStorageImpl>(std::move(client), std::move(options),
                                               std::move(spool), std::move(stop));
  std::vector<SpoolRecord> recovered = impl->spool->TakeRecovered();
  if (!recovered.empty()) {
    uint64_t bytes = 0;
    for (const SpoolRecord& record : recovered) bytes += record.bytes;
    spdlog::info("spool {}: {} file(s), {}, left by an earlier process{}", impl->spool->dir(),
                 recovered.size(), FormatBytes(bytes),
                 impl->options.resume_spooled ? "; resuming their uploads" : "");
  }
  for (SpoolRecord& record : recovered) {
    auto upload = std::make_shared<Upload>();
    upload->from_earlier_process = true;
    record.failed = false;  // a new process tries failed uploads once more
    upload->record = std::move(record);
    {
      MutexLock lock(&impl->mu);
      impl->recovered.push_back(upload);
    }
    if (impl->options.resume_spooled) impl->Enqueue(std::move(upload));
  }
  for (int i = 0; i < impl->options.upload_threads; ++i) {
    impl->workers.emplace_back([raw = impl.get()] { raw->WorkerLoop(); });
  }
  return std::unique_ptr<GcsStorage>(new GcsStorage(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> GcsStorage::NewWriter(std::string_view uri) {
  CLUSTERPROF_RETURN_IF_ERROR(SplitGsUri(uri).status());
  CLUSTERPROF_ASSIGN_OR_RETURN(auto file, impl_->spool->CreateDataFile());
  return std::make_unique<GcsObjectWriter>(impl_.get(), std::string(uri), std::move(file.first),
                                           file.second);
}

absl::StatusOr<std::unique_ptr<ObjectReader>> GcsStorage::NewReader(std::string_view uri) {
  CLUSTERPROF_ASSIGN_OR_RETURN(auto location, SplitGsUri(uri));
  CLUSTERPROF_ASSIGN_OR_RETURN(gcs::ObjectMetadata object,
                               impl_->client->GetObjectMetadata(location.first, location.second));
  return std::make_unique<GcsObjectReader>(impl_->client.get(), std::string(uri),
                                           std::move(object));
}

absl::StatusOr<std::vector<Entry>> GcsStorage::List(std::string_view uri) {
  CLUSTERPROF_ASSIGN_OR_RETURN(auto location, SplitGsUri(uri, /*allow_bucket=*/true));
  std::string prefix = location.second;
  if (!prefix.empty() && !EndsWith(prefix, "/")) prefix.push_back('/');
  CLUSTERPROF_ASSIGN_OR_RETURN(gcs::ListResult listing,
                               impl_->client->ListObjects(location.first, prefix, "/"));
  std::vector<Entry> entries;
  for (const std::string& directory : listing.prefixes) {
    std::string name = directory.substr(prefix.size());
    if (EndsWith(name, "/")) name.pop_back();
    if (!name.empty()) entries.push_back(Entry{std::move(name), true, 0});
  }
  for (const gcs::ObjectMetadata& object : listing.objects) {
    std::string name = object.name.substr(prefix.size());
    // "dir/" placeholder objects some tools create are not entries.
    if (!name.empty()) entries.push_back(Entry{std::move(name), false, object.size});
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });
  return entries;
}

absl::StatusOr<Entry> GcsStorage::Stat(std::string_view uri) {
  CLUSTERPROF_ASSIGN_OR_RETURN(auto location, SplitGsUri(uri, /*allow_bucket=*/true));
  std::string name = location.second;
  while (EndsWith(name, "/")) name.pop_back();
  const std::string base =
      name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
  if (!name.empty()) {
    absl::StatusOr<gcs::ObjectMetadata> object =
        impl_->client->GetObjectMetadata(location.first, name);
    if (object.ok()) return Entry{base, false, object->size};
    if (!absl::IsNotFound(object.status())) return object.status();
  }
  // A "directory": some object below the prefix.
  CLUSTERPROF_ASSIGN_OR_RETURN(
      gcs::ListResult listing,
      impl_->client->ListObjects(location.first, name.empty() ? "" : StrCat(name, "/"), "/", 1));
  if (!listing.objects.empty() || !listing.prefixes.empty()) return Entry{base, true, 0};
  return absl::NotFoundError(StrCat(uri, " does not exist"));
}

absl::StatusOr<std::vector<ObjectInfo>> GcsStorage::ResumePendingCommits() {
  std::vector<std::shared_ptr<Upload>> recovered;
  {
    MutexLock lock(&impl_->mu);
    recovered = impl_->recovered;
  }
  std::vector<ObjectInfo> infos;
  for (const std::shared_ptr<Upload>& upload : recovered) {
    while (true) {
      {
        MutexLock lock(&impl_->mu);
        if (upload->attempted || !impl_->options.resume_spooled) {
          infos.push_back(GcsStorageImpl::Snapshot(*upload));
          break;
        }
      }
      impl_->clock.SleepUntilMonotonicNsUnless(impl_->clock.MonotonicNs() + 100 * kNanosPerMilli,
                                               upload->finished);
    }
  }
  return infos;
}

std::optional<ObjectInfo> GcsStorage::UploadStatus(std::string_view uri) {
  MutexLock lock(&impl_->mu);
  auto it = impl_->by_uri.find(std::string(uri));
  if (it == impl_->by_uri.end()) return std::nullopt;
  ObjectInfo info = GcsStorageImpl::Snapshot(*it->second);
  if (info.state != UploadState::kCommitted) {
    info.spool_path = impl_->spool->DataPath(it->second->record.id);
  }
  return info;
}

SpoolStats GcsStorage::stats() const { return impl_->Stats(); }

void GcsStorage::StopWaiting() { impl_->StopWaiting(); }

void GcsStorage::Shutdown(int64_t drain_ns) { impl_->Shutdown(drain_ns); }

gcs::Client& GcsStorage::client() { return *impl_->client; }

}  // namespace clusterprof::storage
