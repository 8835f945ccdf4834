// The durable local spool in front of gs:// uploads.
//
// Every file bound for a bucket is first written here and fsynced; its upload state (the
// destination, size, CRC32C, the resumable session URI, and the outcome of a failed upload)
// sits beside it in a small JSON record, rewritten atomically (temp file, fsync, rename, fsync
// of the directory) when the upload starts a session, defers or fails. An entry is removed only
// after its object was verified in the bucket, so a process that dies at any point leaves either a
// finished object or an entry that the next process resumes.
//
//   <dir>/<id>.data   the content
//   <dir>/<id>.json   the record; its presence is what makes the entry committed
//
// A data file without a record is a write that never committed (its writer died first); it is
// removed when the spool is opened. The spool has a size cap: Reserve fails with
// ResourceExhausted, naming the cap and what fills it, instead of filling the disk.
//
// Thread-safe.
#ifndef CLUSTERPROF_COMMON_STORAGE_SPOOL_H_
#define CLUSTERPROF_COMMON_STORAGE_SPOOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/base/mutex.h"

namespace clusterprof::storage {

// One spooled file and where its upload stands.
struct SpoolRecord {
  std::string id;
  std::string uri;  // gs://bucket/object
  std::string content_type;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  int64_t created_wall_ns = 0;
  // The resumable upload session, once started, and the bytes GCS has persisted.
  std::string session_uri;
  uint64_t committed = 0;
  // The upload failed for good (a permanent error); retried when a process opens the spool.
  bool failed = false;
  std::string error;
};

class Spool {
 public:
  // Creates `dir` if needed, removes abandoned writes and temporary files, and loads the
  // records an earlier process left (TakeRecovered). Their data counts against `max_bytes`.
  static absl::StatusOr<std::unique_ptr<Spool>> Open(std::string dir, uint64_t max_bytes);

  const std::string& dir() const { return dir_; }
  std::string DataPath(std::string_view id) const;

  // A new, empty data file (O_WRONLY) and its id. The caller owns the descriptor.
  absl::StatusOr<std::pair<std::string, int>> CreateDataFile();
  // Claims `bytes` of the cap for a write to `uri`; ResourceExhausted when they do not fit.
  absl::Status Reserve(uint64_t bytes, std::string_view uri);
  void Release(uint64_t bytes);

  // Writes the record durably (replacing an earlier one of the same id).
  absl::Status WriteRecord(const SpoolRecord& record);
  // Removes the record, then the data: a crash in between leaves an abandoned write, which the
  // next Open removes. Does not release the reservation (Release does).
  absl::Status Remove(std::string_view id);
  // Removes a data file that never got a record (an aborted write).
  void RemoveDataFile(std::string_view id);

  // The records found by Open, oldest first; empty after the first call.
  std::vector<SpoolRecord> TakeRecovered();

  uint64_t used_bytes() const;
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  Spool(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}
  absl::Status Load();

  const std::string dir_;
  const uint64_t max_bytes_;
  mutable Mutex mu_;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<SpoolRecord> recovered_ ABSL_GUARDED_BY(mu_);
};

// The record as JSON, and back (InvalidArgument naming what is wrong).
std::string SpoolRecordToJson(const SpoolRecord& record);
absl::StatusOr<SpoolRecord> SpoolRecordFromJson(std::string_view json);

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_SPOOL_H_
