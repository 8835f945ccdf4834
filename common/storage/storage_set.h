// The storage backends of one process, one per logdir kind, built once and shared by every
// capture: local paths, and gs:// (with its credentials, token cache, spool and uploaders).
#ifndef CLUSTERPROF_COMMON_STORAGE_STORAGE_SET_H_
#define CLUSTERPROF_COMMON_STORAGE_STORAGE_SET_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/env.h"
#include "common/base/mutex.h"
#include "common/storage/gcs_storage.h"
#include "common/storage/local_storage.h"
#include "common/storage/logdir.h"
#include "common/storage/storage.h"

namespace clusterprof::storage {

struct StorageSetOptions {
  Clock* clock = nullptr;  // required
  // Environment lookup (STORAGE_EMULATOR_HOST, GOOGLE_APPLICATION_CREDENTIALS, CLOUDSDK_CONFIG
  // and HOME for gcloud's credentials, GCE_METADATA_HOST, CLUSTERPROF_SPOOL_DIR); default: the
  // process environment.
  GetEnvFn getenv;
  LocalStorageOptions local;
  // spool_dir empty: DefaultSpoolDir().
  GcsStorageOptions gcs;
  RetryPolicy retry{.deadline_ns = 5 * 60 * kNanosPerSecond};
  // Overrides the endpoint STORAGE_EMULATOR_HOST or the default would give.
  std::string gcs_endpoint;
};

// Thread-safe.
class StorageSet {
 public:
  explicit StorageSet(StorageSetOptions options);
  ~StorageSet();
  StorageSet(const StorageSet&) = delete;
  StorageSet& operator=(const StorageSet&) = delete;

  // The storage for `logdir`'s kind. The gs:// one is built on first use (credentials, spool,
  // uploader threads); when that fails the error comes back here, and the next call tries
  // again (credentials may have been fixed meanwhile).
  absl::StatusOr<Storage*> For(const Logdir& logdir);
  // For a URI or path: gs://... or a local one.
  absl::StatusOr<Storage*> ForUri(std::string_view uri);

  // Builds the gs:// storage now if the spool holds uploads an earlier process left, so they
  // resume at once rather than at the next gs:// capture. OK when there is nothing to resume.
  absl::Status ResumeSpool();

  // For a process that is shutting down (GcsStorage::StopWaiting and Shutdown, when gs:// is in
  // use): commits stop waiting for uploads; then uploads in flight get `drain_ns` to finish.
  void StopWaiting();
  void Shutdown(int64_t drain_ns);

  // The gs:// storage once built; nullptr before.
  GcsStorage* gcs();
  const std::string& spool_dir() const { return spool_dir_; }

 private:
  absl::StatusOr<GcsStorage*> Gcs(std::string_view context);

  StorageSetOptions options_;
  std::string spool_dir_;
  std::unique_ptr<Storage> local_;
  Mutex mu_;
  std::unique_ptr<GcsStorage> gcs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// The sidecar's spool: a volume of its pod (the webhook mounts an emptyDir there).
inline constexpr std::string_view kSidecarSpoolDir = "/var/lib/clusterprof/spool";

// Where files bound for gs:// wait when no spool directory is configured:
// $CLUSTERPROF_SPOOL_DIR, else `fallback` (the sidecar passes kSidecarSpoolDir), else
// $TMPDIR (or /tmp)/clusterprof-spool-<uid> (the CLI and the operator).
std::string DefaultSpoolDir(const GetEnvFn& getenv = GetEnv, std::string_view fallback = "");

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_STORAGE_SET_H_
