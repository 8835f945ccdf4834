// The storage interface every writer of run files goes through.
//
// A write is a stream followed by a commit: bytes are appended to an ObjectWriter (never held
// whole in memory), and Commit() makes the object durable and visible under its final name in
// one step, or fails leaving the final name untouched. Readers never see half an object.
//
// Local paths: the writer streams into a temporary file beside the destination, and Commit()
// fsyncs it, renames it over the destination and fsyncs the directory.
// gs:// (GCS storage, built on this interface): the writer streams into a local spool file
// (fsynced), and Commit() uploads it with a resumable upload, verifies its CRC32C and only then
// deletes the spool entry; a restarted process resumes pending uploads through
// ResumePendingCommits(). Callers are the same in both cases.
#ifndef CLUSTERPROF_COMMON_STORAGE_STORAGE_H_
#define CLUSTERPROF_COMMON_STORAGE_STORAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/byte_sink.h"
#include "common/storage/logdir.h"

namespace clusterprof::storage {

// Where a committed object's bytes are. Local commits are done at once; gs:// commits are
// durable in the spool first and reach the bucket when their upload finishes.
enum class UploadState {
  kSpooled,    // durable in the local spool, waiting for an upload (or its retry)
  kUploading,  // being uploaded
  kCommitted,  // at the destination and verified (renamed, or CRC32C matched)
  kFailed,     // the upload failed for good (kept in the spool; retried when the process restarts)
};
std::string_view UploadStateName(UploadState state);

// What a committed object looks like.
struct ObjectInfo {
  std::string uri;
  uint64_t bytes = 0;
  UploadState state = UploadState::kCommitted;
  // Bytes the destination holds (== bytes once committed).
  uint64_t bytes_committed = 0;
  // CRC32C of the content, base64 as GCS reports it; empty when not computed (local files).
  std::string crc32c;
  // Why the upload has not finished: its last error. Empty otherwise.
  std::string error;
  // Where the bytes wait while they are not committed.
  std::string spool_path;
};

// A directory entry from List().
struct Entry {
  std::string name;  // the last path component
  bool is_directory = false;
  uint64_t bytes = 0;
};

// Streams one object. Not thread-safe. Destroying a writer that was not committed aborts it.
class ObjectWriter : public io::ByteSink {
 public:
  // Makes the object durable and visible at its URI. After Commit (successful or not) the writer
  // accepts nothing more.
  virtual absl::StatusOr<ObjectInfo> Commit() = 0;
  // Discards what was written; the destination is untouched. Idempotent.
  virtual void Abort() = 0;
  virtual const std::string& uri() const = 0;
};

// Reads one object sequentially.
class ObjectReader {
 public:
  virtual ~ObjectReader() = default;
  // Reads up to `size` bytes; returns 0 at the end.
  virtual absl::StatusOr<size_t> Read(char* buffer, size_t size) = 0;
  virtual const std::string& uri() const = 0;
};

// A storage backend for one kind of logdir. Implementations are thread-safe: several writers
// and readers may be open at once.
class Storage {
 public:
  virtual ~Storage() = default;

  // Starts writing the object at `uri`, creating parent directories as needed. Fails at once
  // when the destination cannot be written (permissions, read-only file system).
  virtual absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string_view uri) = 0;
  virtual absl::StatusOr<std::unique_ptr<ObjectReader>> NewReader(std::string_view uri) = 0;
  // Direct children of the directory (or prefix) `uri`, sorted by name.
  virtual absl::StatusOr<std::vector<Entry>> List(std::string_view uri) = 0;
  // NotFound when nothing is there.
  virtual absl::StatusOr<Entry> Stat(std::string_view uri) = 0;
  // Completes commits that a previous process left unfinished (spooled uploads), waiting for
  // them. Returns what became of each. Local storage has none: its commit is a single rename.
  virtual absl::StatusOr<std::vector<ObjectInfo>> ResumePendingCommits() {
    return std::vector<ObjectInfo>();
  }
  // The current state of an object committed through this storage, for uploads that go on
  // after Commit returned; nullopt when this storage does not know it (nothing pending).
  virtual std::optional<ObjectInfo> UploadStatus(std::string_view uri) { return std::nullopt; }
};

// Writes `data` to `uri` and commits it.
absl::StatusOr<ObjectInfo> WriteObject(Storage& storage, std::string_view uri,
                                       std::string_view data);
// Reads the whole object; for small files (manifests, tests).
absl::StatusOr<std::string> ReadObject(Storage& storage, std::string_view uri);

// A local file holding an object's bytes, for readers that need a file (mmap). For a local URI
// it is the file itself; for gs:// a downloaded copy in $TMPDIR, removed with this object.
class LocalCopy {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCopy>> Fetch(Storage& storage, std::string_view uri);
  ~LocalCopy();
  LocalCopy(const LocalCopy&) = delete;
  LocalCopy& operator=(const LocalCopy&) = delete;
  const std::string& path() const { return path_; }

 private:
  LocalCopy(std::string path, bool temporary) : path_(std::move(path)), temporary_(temporary) {}
  std::string path_;
  bool temporary_;
};

// Fails unless the object is at its destination: a commit that left the file in the spool
// (upload still running, or failed) is an error that says where it waits and why.
absl::Status CheckCommitted(const ObjectInfo& info);

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_STORAGE_H_
