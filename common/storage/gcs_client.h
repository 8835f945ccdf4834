// A client for the parts of the GCS JSON API that logdirs need: object metadata, listing,
// ranged downloads, simple (multipart) uploads and resumable uploads, over cpprestsdk.
//
// Every call retries what GCS documents as transient (408, 429, 5xx, a dropped or reset
// connection) with jittered exponential backoff, until the policy's deadline passes without
// progress; other errors come back at once. A 401 makes the credentials fetch a new token and
// the request is sent once more. Errors say what was asked (the gs:// URI), what the server
// answered and as whom we asked ("403 Forbidden for gs://b/x as service account sa@p.iam...").
//
// Thread-safe: any number of threads may call at once (connections are pooled per host).
#ifndef CLUSTERPROF_COMMON_STORAGE_GCS_CLIENT_H_
#define CLUSTERPROF_COMMON_STORAGE_GCS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/retry/backoff.h"

namespace clusterprof::http {
class Transport;
}  // namespace clusterprof::http

namespace clusterprof::storage::gcs {

class Credentials;

// Where requests go when no emulator is configured.
inline constexpr std::string_view kDefaultEndpoint = "https://storage.googleapis.com";
// Non-final chunks of a resumable upload must be multiples of this.
inline constexpr uint64_t kChunkQuantum = 256 * 1024;

struct ClientOptions {
  // "https://storage.googleapis.com", or an emulator's "http://127.0.0.1:9023" (a bare
  // "host:port" gets http://, as STORAGE_EMULATOR_HOST is written).
  std::string endpoint = std::string(kDefaultEndpoint);
  std::shared_ptr<Credentials> credentials;  // required
  Clock* clock = nullptr;                    // required
  // Retrying stops when deadline_ns has passed since the call began, or, for uploads, since the
  // last chunk the server accepted: a large upload that keeps moving is never cut off.
  RetryPolicy retry{.deadline_ns = 5 * 60 * kNanosPerSecond};
  // Deadline of one HTTP request (a whole chunk's upload included).
  int64_t request_timeout_ns = 120 * kNanosPerSecond;
  std::string user_agent = "clusterprof";
  // Told of every retry: the operation ("upload gs://b/o") and why. For metrics and logs.
  std::function<void(std::string_view operation, const absl::Status& why)> on_retry;
  // When set and true, pauses between retries end at once and the call fails with Cancelled
  // (a process shutting down). Setters call clock->Wake() after setting it.
  std::shared_ptr<const std::atomic<bool>> stop;
  // What the requests go over; nullptr: cpprestsdk (request_timeout_ns, 128 KiB pieces).
  // Must outlive the client.
  http::Transport* transport = nullptr;
};

// An object's metadata, as the JSON API's object resource has it.
struct ObjectMetadata {
  std::string bucket;
  std::string name;
  int64_t generation = 0;
  uint64_t size = 0;
  // Absent when the server did not report one (composite objects have only crc32c; some
  // emulators have neither).
  std::optional<uint32_t> crc32c;
  std::string md5_hash;  // base64, as reported
  std::string content_type;
  std::map<std::string, std::string> metadata;
};

struct ListResult {
  std::vector<ObjectMetadata> objects;
  // With a delimiter: the "directories" below the prefix, each ending in the delimiter.
  std::vector<std::string> prefixes;
};

// What an upload writes, and the checks that come with it.
struct UploadRequest {
  std::string bucket;
  std::string name;
  std::string content_type = "application/octet-stream";
  uint64_t size = 0;
  // The content's CRC32C: sent with the metadata, so GCS itself refuses a corrupted object,
  // and compared with what the finished object reports.
  uint32_t crc32c = 0;
  std::map<std::string, std::string> metadata;
  // When >= 0, the object is written only over this generation (0: only where none exists).
  int64_t if_generation_match = -1;
};

// Where a resumable upload stands. Persisting it lets a restarted process resume the upload.
struct ResumableState {
  std::string session_uri;
  // Bytes GCS has persisted (the next chunk starts here).
  uint64_t committed = 0;
};

// The content to upload: `size` bytes at `offset` (of a spool file, usually), valid until the
// next call.
using ChunkFn = std::function<absl::StatusOr<std::string_view>(uint64_t offset, size_t size)>;

struct UploadProgress {
  uint64_t committed = 0;
  uint64_t total = 0;
  ResumableState state;
};

class Client {
 public:
  // InvalidArgument for a bad endpoint or missing credentials or clock.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const;
  // "as <identity>", for callers' messages.
  std::string Identity() const;

  // NotFound when the object (or its bucket) is not there.
  absl::StatusOr<ObjectMetadata> GetObjectMetadata(std::string_view bucket, std::string_view name);
  // One page of objects under `prefix` (all pages when page_size is 0: it follows
  // nextPageToken).
  absl::StatusOr<ListResult> ListObjects(std::string_view bucket, std::string_view prefix,
                                         std::string_view delimiter, int page_size = 0);
  // `length` bytes from `offset` (fewer at the end of the object). With `generation` > 0, the
  // read fails with FailedPrecondition if the object was replaced since.
  absl::StatusOr<std::string> ReadRange(std::string_view bucket, std::string_view name,
                                        uint64_t offset, uint64_t length, int64_t generation = 0);
  absl::Status DeleteObject(std::string_view bucket, std::string_view name);

  // One request (uploadType=multipart) for content that fits in memory.
  absl::StatusOr<ObjectMetadata> InsertObject(const UploadRequest& request,
                                              std::string_view content);

  // A resumable upload of `request.size` bytes read through `chunk`, in chunks of
  // `chunk_bytes` (a multiple of 256 KiB). Starts a session when `state` has none, else asks
  // GCS where the session stands and goes on from there; a session GCS no longer knows is
  // started afresh. `progress` is called after every chunk GCS accepted (to persist a new
  // session URI and report progress). `cancel`, when set, stops between chunks with Cancelled.
  // The result's size and CRC32C are checked against the request's. A finished object that does
  // not match (a server that finalized early) is uploaded again, in a fresh session written over
  // that generation only (ifGenerationMatch, so that nothing newer is replaced), twice at most,
  // each reported through ClientOptions::on_retry; then DataLoss.
  absl::StatusOr<ObjectMetadata> UploadResumable(
      const UploadRequest& request, const ChunkFn& chunk, ResumableState state, size_t chunk_bytes,
      const std::function<void(const UploadProgress&)>& progress,
      const std::atomic<bool>* cancel = nullptr);

 private:
  // The payload of a DataLoss status naming the mismatched object's generation.
  static constexpr char kGenerationPayload[] = "clusterprof.gcs/generation";

  // One upload to its finished object; DataLoss (with kGenerationPayload) on a mismatch.
  absl::StatusOr<ObjectMetadata> UploadResumableOnce(
      const UploadRequest& request, const ChunkFn& chunk, ResumableState state, size_t chunk_bytes,
      const std::function<void(const UploadProgress&)>& progress, const std::atomic<bool>* cancel);

  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "gs://bucket/name".
std::string ObjectUri(std::string_view bucket, std::string_view name);

// Whether GCS documents the error as worth retrying (Unavailable, DeadlineExceeded,
// ResourceExhausted from 429, Aborted from a reset connection).
bool IsTransient(const absl::Status& status);

}  // namespace clusterprof::storage::gcs

#endif  // CLUSTERPROF_COMMON_STORAGE_GCS_CLIENT_H_
