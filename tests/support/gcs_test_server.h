// A Google Cloud Storage JSON API server for tests and benchmarks: plain HTTP/1.1 on 127.0.0.1,
// the subset of the API that clusterprof's GCS client uses, with the wire behaviour of the real
// service (status codes, headers, JSON resources and error bodies), and faults on demand.
//
// Served:
//   GET    /storage/v1/b/BUCKET                                  buckets.get
//   GET    /storage/v1/b/BUCKET/o                                objects.list
//   GET    /storage/v1/b/BUCKET/o/OBJECT[?alt=media]             objects.get (metadata or media)
//   DELETE /storage/v1/b/BUCKET/o/OBJECT                         objects.delete
//   GET    /download/storage/v1/b/BUCKET/o/OBJECT?alt=media      objects.get (media)
//   POST   /upload/storage/v1/b/BUCKET/o?uploadType=media|multipart|resumable   objects.insert
//   PUT    /upload/storage/v1/b/BUCKET/o?upload_id=ID            resumable chunk / status query
//   DELETE /upload/storage/v1/b/BUCKET/o?upload_id=ID            cancels a resumable upload (499)
//
// Choices where the service's documentation leaves room (tests/common/storage/
// gcs_test_server_test.cc pins each of them down):
//   - A resumable session that never existed answers 404 (notFound); one that was cancelled, or
//     whose finalization failed (checksum mismatch 400, precondition 412), answers 410 (gone).
//   - A chunk that starts beyond the persisted size is rejected with 400 (invalid) and nothing of
//     it is kept; a chunk that overlaps bytes already persisted has that part ignored.
//   - A non-final chunk whose size is not a multiple of 256 KiB is rejected with 400 and nothing
//     of it is kept.
//   - When a chunk's connection breaks before the request completes (client hang-up, a broken
//     chunked body, or ResetNextUpload), the session keeps the bytes received so far rounded down
//     to a multiple of 256 KiB (never fewer than it had): what a status query then reports.
//   - A finalized session answers every later chunk, status query or cancel with 200 and the
//     object. A chunk PUT without Content-Range carries the whole object ("bytes 0-N-1/N").
//   - Finalization answers 200 (not 201), as does every successful insert.
//   - GET with ifGenerationNotMatch / ifMetagenerationNotMatch that fails answers 304 (like
//     If-None-Match); every other failed precondition answers 412 (conditionNotMet).
//   - A request to a resumable session that another request is still writing waits for it (up to
//     30 s, then 503).
//   - Uploads do not keep versions: `generation` selects only the live generation (else 404).
//   - With Options::data_dir, object and session bytes are streamed to scratch files there
//     (removed when the object is replaced or deleted, and when the server stops); metadata stays
//     in memory.
//
// Thread-safety: every method may be called from any thread while requests flow. Failure:
// Start() fails when it cannot listen or use the data directory; a request the server cannot
// serve (storage I/O error) gets a 500 JSON error. Destruction closes every connection (clients
// see them break) and joins every thread.
#ifndef CLUSTERPROF_TESTS_SUPPORT_GCS_TEST_SERVER_H_
#define CLUSTERPROF_TESTS_SUPPORT_GCS_TEST_SERVER_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace clusterprof::testing {

// Defined in gcs_test_server.cc.
namespace gcs_internal {
struct Content;
struct StoredObject;
struct Session;
struct Request;
struct Reply;
}  // namespace gcs_internal

// One object as stored, with its whole content.
struct GcsObjectSnapshot {
  std::string bucket;
  std::string name;
  std::string data;
  std::string content_type;
  // Base64 of the big-endian CRC32C, and of the MD5 digest (empty with Options::compute_md5 off).
  std::string crc32c;
  std::string md5_hash;
  int64_t generation = 0;
  int64_t metageneration = 1;
  uint64_t size = 0;
  std::map<std::string, std::string> metadata;
};

// One request as the server handled it.
struct GcsRequestRecord {
  std::string method;
  // Path and query, as sent.
  std::string target;
  // The status answered; 0 when the connection was reset or broke instead.
  int code = 0;
  // Request body bytes read.
  uint64_t body_bytes = 0;
  // The Authorization and Content-Range headers ("" when absent).
  std::string authorization;
  std::string content_range;
};

// GcsTestServer::Options.
struct GcsTestServerOptions {
  // The IPv4 address to listen on: loopback, or an address inside a network namespace a test
  // made (the node tests' pods reach it there).
  std::string address = "127.0.0.1";
  // The port; 0: a free one (read it back with port()).
  int port = 0;
  // Empty: object bytes live in memory. Else an existing directory for scratch files.
  std::string data_dir;
  // Off: uploads skip MD5 and objects have no md5Hash (as composite objects in GCS), for
  // benchmarks that must not be limited by MD5 (about 0.6 GB/s on one core).
  bool compute_md5 = true;
  // Uploads keep only their size and hashes, not their bytes (reads of them fail), so that a
  // benchmark of a client measures the client, not the server's storing.
  bool discard_data = false;
  // Wall time for timeCreated/updated and generations; nullptr: the system clock.
  Clock* clock = nullptr;
};

enum class GcsAuthDecision {
  kAllow,
  kUnauthenticated,  // 401
  kForbidden,        // 403
};

// See the file comment.
class GcsTestServer {
 public:
  // Resumable chunks other than the last are multiples of this.
  static constexpr uint64_t kUploadQuantum = uint64_t{256} * 1024;

  using Options = GcsTestServerOptions;

  static absl::StatusOr<std::unique_ptr<GcsTestServer>> Start(Options options = {});

  ~GcsTestServer();
  GcsTestServer(const GcsTestServer&) = delete;
  GcsTestServer& operator=(const GcsTestServer&) = delete;

  int port() const { return port_; }
  // "http://127.0.0.1:PORT", what STORAGE_EMULATOR_HOST takes.
  std::string endpoint() const;

  // Test setup and inspection, bypassing HTTP (and faults, and the authorizer).
  void CreateBucket(std::string_view name);
  std::optional<GcsObjectSnapshot> GetObject(std::string_view bucket, std::string_view name) const;
  // Live object names, sorted; empty for a missing bucket.
  std::vector<std::string> ListObjectNames(std::string_view bucket) const;
  // How many times an object of that name was created or replaced (0: never), and how many
  // different contents (by CRC32C) those writes had.
  int64_t Writes(std::string_view bucket, std::string_view name) const;
  int64_t DistinctContents(std::string_view bucket, std::string_view name) const;
  // Creates or replaces an object (content type application/octet-stream); creates the bucket
  // when missing.
  void PutObject(std::string_view bucket, std::string_view name, std::string_view data);

  // Called for every request with its Authorization header ("" when absent) and the bucket it
  // addresses ("" when none), before anything else is checked. Default: allow all.
  void SetAuthorizer(
      std::function<GcsAuthDecision(std::string_view authorization, std::string_view bucket)>
          authorizer);

  // Faults. Each applies to requests whose head arrives after the call.
  //
  // The next `count` requests whose "METHOD target" contains `match` get `http_code` with a JSON
  // error body (503/500/502 backendError, 429 rateLimitExceeded, 408 requestTimeout, ...) and no
  // Retry-After header. Nothing of their body is stored: it is read and discarded, or, when the
  // client waits for 100 Continue, never asked for (the connection then closes). Rules apply in
  // the order added; a request uses up at most one.
  void FailNext(int count, int http_code, std::string_view match = "");
  // Each request then fails as FailNext's do with probability `probability` (0 turns it off),
  // drawn from std::mt19937_64 seeded with `seed`: request k (0-based, counting every request
  // from this call on) fails when (rng() >> 11) * 2^-53 < probability, rng() called once per
  // request. Checked after FailNext rules (a request failed by a rule draws nothing).
  void SetFailureRate(double probability, int http_code, uint64_t seed);
  // The next `count` requests that carry object data (media and multipart inserts, resumable
  // chunks; not resumable initiations or status queries) and got past faults, authorization and
  // validation have their connection reset (RST: SO_LINGER 0, then close) once
  // `after_body_bytes` of their body were read, or after the whole body when it is shorter; they
  // are never answered, and are recorded with code 0. A resumable session then keeps what it had
  // plus the bytes received, rounded down to a multiple of kUploadQuantum; media and multipart
  // uploads keep nothing.
  void ResetNextUpload(uint64_t after_body_bytes, int count = 1);
  // The next `count` status queries of resumable sessions ("Content-Range: bytes */N") finalize
  // the object with the bytes persisted so far, however few, without checking its hashes, and
  // answer 200 with it: the short (or empty) object a faulty GCS-compatible server made.
  void FinalizeShortOnNextStatusQuery(int count = 1);
  // Sleeps `latency` before handling each request (0: none).
  void SetLatency(absl::Duration latency);
  // Reads request bodies at most this fast (0: unlimited).
  void SetBodyReadRate(uint64_t bytes_per_second);
  // Forgets every FailNext rule, the failure rate, pending resets, latency and the read rate.
  void ClearFaults();

  // Every request handled so far (faulted and reset ones included), in the order they finished.
  std::vector<GcsRequestRecord> Requests() const;
  void ClearRequests();
  // Resumable sessions started and neither finalized, failed nor cancelled.
  int active_resumable_sessions() const;

 private:
  using Content = gcs_internal::Content;
  using StoredObject = gcs_internal::StoredObject;
  using Session = gcs_internal::Session;
  using Request = gcs_internal::Request;
  using Reply = gcs_internal::Reply;
  struct Connection;
  struct FailureRule {
    int remaining;
    int code;
    std::string match;
  };
  using Authorizer = std::function<GcsAuthDecision(std::string_view, std::string_view)>;
  using ObjectMap = std::map<std::string, std::shared_ptr<const StoredObject>, std::less<>>;

  explicit GcsTestServer(Options options);

  void AcceptLoop();
  void Serve(Connection* connection);
  // Handles one parsed request and answers it; false when the connection must close (with
  // `*reset` set when it must close with a RST).
  bool HandleRequest(Connection* connection, Request& request, bool* reset);
  Reply Dispatch(Request& request);

  Reply BucketGet(Request& request, std::string_view bucket);
  Reply ObjectList(Request& request, std::string_view bucket);
  Reply ObjectGet(Request& request, std::string_view bucket, const std::string& name, bool media);
  Reply ObjectDelete(Request& request, std::string_view bucket, const std::string& name);
  Reply InsertSimple(Request& request, std::string_view bucket, bool multipart);
  Reply StartResumable(Request& request, std::string_view bucket);
  Reply ResumableChunk(Request& request, std::string_view bucket, const std::string& upload_id);
  Reply CancelResumable(Request& request, const std::string& upload_id);

  // Whether a fault rule or the failure rate fails this request, and with which code.
  std::optional<int> TakeFault(const Request& request);
  std::optional<uint64_t> TakeReset();
  absl::StatusOr<std::unique_ptr<Content>> NewContent();
  int64_t NextGeneration() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Record(const Request& request, int code);
  void ReapConnections();

  const Options options_;
  std::unique_ptr<Clock> owned_clock_;
  Clock* clock_ = nullptr;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_thread_;

  mutable Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ObjectMap, std::less<>> buckets_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Session>, std::less<>> sessions_ ABSL_GUARDED_BY(mu_);
  int64_t last_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Writes by "BUCKET/NAME", and the CRC32Cs they had.
  std::map<std::string, int64_t, std::less<>> writes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<std::string>, std::less<>> contents_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Mixed into upload ids so that ids from different runs differ.
  uint64_t session_salt_ = 0;
  Authorizer authorizer_ ABSL_GUARDED_BY(mu_);
  std::vector<FailureRule> rules_ ABSL_GUARDED_BY(mu_);
  double failure_probability_ ABSL_GUARDED_BY(mu_) = 0;
  int failure_code_ ABSL_GUARDED_BY(mu_) = 503;
  std::mt19937_64 failure_rng_ ABSL_GUARDED_BY(mu_);
  uint64_t reset_after_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int resets_left_ ABSL_GUARDED_BY(mu_) = 0;
  int finalize_short_left_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration latency_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  uint64_t body_read_rate_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<GcsRequestRecord> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_GCS_TEST_SERVER_H_
