// gs:// logdirs: the Storage interface over the GCS JSON API (gcs_client.h), with every write
// going through the durable spool (spool.h) first.
//
// A writer streams into a spool file and computes its CRC32C. Commit() fsyncs it, records it
// in the spool, and hands it to the uploader threads: files up to one chunk go in a single
// request, larger ones as a resumable upload in chunks, the session URI recorded (durably) as
// soon as it exists: a resumed upload asks GCS where the session stands. GCS checks the CRC32C sent
// with the metadata, and the uploader checks the finished object's before it deletes the spool
// entry. Commit() waits for the upload up to commit_wait_ns; what has not finished by then goes on
// in the background (ObjectInfo.state says where it stands, UploadStatus() follows it).
//
// Failures: transient errors (408, 429, 5xx, dropped connections) are retried with backoff
// until the client's deadline passes without progress; the entry then waits requeue_delay_ns
// and is tried again, for as long as the process runs. Permanent errors (no such bucket,
// permission denied, bad credentials) mark the entry failed at once; it stays in the spool
// and is retried when a process next opens the spool (a restarted sidecar). Nothing is ever
// deleted from the spool before its object is verified.
//
// Thread-safe.
#ifndef CLUSTERPROF_COMMON_STORAGE_GCS_STORAGE_H_
#define CLUSTERPROF_COMMON_STORAGE_GCS_STORAGE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/storage/gcs_client.h"
#include "common/storage/storage.h"

namespace clusterprof::storage {

namespace internal {
struct GcsStorageImpl;
}  // namespace internal

// Files in the spool by state, and its size.
struct SpoolStats {
  int spooled = 0;
  int uploading = 0;
  int failed = 0;
  uint64_t used_bytes = 0;
  uint64_t max_bytes = 0;
};

// What the uploader did, for metrics and logs.
struct UploadEvent {
  enum class Kind {
    kUploaded,   // verified in the bucket; `bytes`, `seconds`
    kRetry,      // a request failed and will be retried; `error`
    kDeferred,   // gave up for now; the entry waits and is tried again later; `error`
    kFailed,     // permanent error; the entry stays in the spool; `error`
    kSpoolFull,  // a write was refused because the spool is at its cap
  };
  Kind kind = Kind::kUploaded;
  std::string uri;
  uint64_t bytes = 0;
  double seconds = 0;
  std::string error;
  // The spool right after the event.
  SpoolStats spool;
};

struct GcsStorageOptions {
  // Where files wait for upload (created if needed). Use a volume that survives the process.
  std::string spool_dir;
  uint64_t spool_max_bytes = uint64_t{8} << 30;
  // Resumable upload chunk size: a multiple of 256 KiB. Files up to this size go in one
  // request. Memory per upload in flight is about one chunk.
  size_t chunk_bytes = 8 << 20;
  int upload_threads = 2;
  // How long Commit() waits for the upload before returning with the file still spooled.
  int64_t commit_wait_ns = 120 * kNanosPerSecond;
  // After an upload gave up on transient errors: the first pause before it is tried again
  // (doubling, up to 10 minutes).
  int64_t requeue_delay_ns = 30 * kNanosPerSecond;
  // Resume the uploads an earlier process left in the spool, from the start.
  bool resume_spooled = true;
  // Called from uploader threads; must be thread-safe and quick.
  std::function<void(const UploadEvent&)> observer;
};

class GcsStorage final : public Storage {
 public:
  // Opens the spool (InvalidArgument/PermissionDenied naming the directory when it cannot be
  // used) and starts the uploader threads.
  static absl::StatusOr<std::unique_ptr<GcsStorage>> Create(gcs::ClientOptions client_options,
                                                            GcsStorageOptions options);
  // Stops the uploaders between chunks; unfinished uploads stay in the spool for the next
  // process.
  ~GcsStorage() override;

  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string_view uri) override;
  absl::StatusOr<std::unique_ptr<ObjectReader>> NewReader(std::string_view uri) override;
  absl::StatusOr<std::vector<Entry>> List(std::string_view uri) override;
  absl::StatusOr<Entry> Stat(std::string_view uri) override;
  // Waits until every upload that was in the spool when this storage opened has finished or
  // failed for good, and returns their states.
  absl::StatusOr<std::vector<ObjectInfo>> ResumePendingCommits() override;
  std::optional<ObjectInfo> UploadStatus(std::string_view uri) override;

  // For a process that is shutting down: Commit() stops waiting for uploads, at once and from
  // then on (its files are safe in the spool).
  void StopWaiting();
  // StopWaiting, then uploads already queued get up to `drain_ns` to finish, then the uploaders
  // stop between chunks and pauses between retries end. What is left stays in the spool for the
  // next process. Idempotent; the destructor does it with no drain.
  void Shutdown(int64_t drain_ns);

  SpoolStats stats() const;
  gcs::Client& client();

 private:
  explicit GcsStorage(std::unique_ptr<internal::GcsStorageImpl> impl);
  std::unique_ptr<internal::GcsStorageImpl> impl_;
};

// "gs://bucket/a/b" -> {"bucket", "a/b"}; InvalidArgument for anything else. `name` may be
// empty (the bucket itself) only when allow_bucket is set.
absl::StatusOr<std::pair<std::string, std::string>> SplitGsUri(std::string_view uri,
                                                               bool allow_bucket = false);

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_GCS_STORAGE_H_
