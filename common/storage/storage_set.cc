#include "common/storage/storage_set.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/storage/gcs_credentials.h"
#include "spdlog/spdlog.h"

namespace clusterprof::storage {
namespace {

// Whether `dir` holds spool records.
bool HasSpoolRecords(const std::string& dir) {
  DIR* directory = opendir(dir.c_str());
  if (directory == nullptr) return false;
  bool found = false;
  while (dirent* entry = readdir(directory)) {
    if (EndsWith(entry->d_name, ".json")) {
      found = true;
      break;
    }
  }
  closedir(directory);
  return found;
}

}  // namespace

std::string DefaultSpoolDir(const GetEnvFn& getenv, std::string_view fallback) {
  if (std::optional<std::string> dir = getenv("CLUSTERPROF_SPOOL_DIR")) return *dir;
  if (!fallback.empty()) return std::string(fallback);
  std::string tmp = getenv("TMPDIR").value_or("/tmp");
  while (tmp.size() > 1 && tmp.back() == '/') tmp.pop_back();
  return StrCat(tmp, "/clusterprof-spool-", getuid());
}

StorageSet::StorageSet(StorageSetOptions options) : options_(std::move(options)) {
  if (!options_.getenv) options_.getenv = GetEnv;
  spool_dir_ =
      options_.gcs.spool_dir.empty() ? DefaultSpoolDir(options_.getenv) : options_.gcs.spool_dir;
  local_ = NewLocalStorage(options_.local);
}

StorageSet::~StorageSet() = default;

absl::StatusOr<Storage*> StorageSet::For(const Logdir& logdir) {
  if (logdir.kind == Logdir::Kind::kLocal) return local_.get();
  CLUSTERPROF_ASSIGN_OR_RETURN(GcsStorage * storage, Gcs(StrCat("logdir ", logdir.uri)));
  return storage;
}

absl::StatusOr<GcsStorage*> StorageSet::Gcs(std::string_view context) {
  MutexLock lock(&mu_);
  if (gcs_ != nullptr) return gcs_.get();
  gcs::CredentialsOptions credentials_options;
  credentials_options.clock = options_.clock;
  credentials_options.getenv = options_.getenv;
  absl::StatusOr<std::unique_ptr<gcs::Credentials>> credentials =
      gcs::DefaultCredentials(credentials_options);
  if (!credentials.ok()) {
    return Annotate(credentials.status(), context);
  }
  gcs::ClientOptions client_options;
  client_options.clock = options_.clock;
  client_options.credentials = std::move(*credentials);
  client_options.retry = options_.retry;
  if (!options_.gcs_endpoint.empty()) {
    client_options.endpoint = options_.gcs_endpoint;
  } else if (std::optional<std::string> emulator = options_.getenv("STORAGE_EMULATOR_HOST")) {
    client_options.endpoint = *emulator;
  }
  GcsStorageOptions gcs_options = options_.gcs;
  gcs_options.spool_dir = spool_dir_;
  const std::string identity = client_options.credentials->Identity();
  const std::string endpoint = client_options.endpoint;
  absl::StatusOr<std::unique_ptr<GcsStorage>> created =
      GcsStorage::Create(std::move(client_options), std::move(gcs_options));
  if (!created.ok()) return Annotate(created.status(), context);
  spdlog::info("gs:// storage ready: {} as {}, spool {}", endpoint, identity, spool_dir_);
  gcs_ = *std::move(created);
  if (stopping_) gcs_->StopWaiting();
  return gcs_.get();
}

absl::StatusOr<Storage*> StorageSet::ForUri(std::string_view uri) {
  if (StartsWith(uri, "gs://")) {
    CLUSTERPROF_ASSIGN_OR_RETURN(Logdir logdir, ParseLogdir(uri));
    return For(logdir);
  }
  return local_.get();
}

absl::Status StorageSet::ResumeSpool() {
  if (!HasSpoolRecords(spool_dir_)) return absl::OkStatus();
  return Gcs(StrCat("resuming the uploads in spool ", spool_dir_)).status();
}

void StorageSet::StopWaiting() {
  MutexLock lock(&mu_);
  stopping_ = true;
  if (gcs_ != nullptr) gcs_->StopWaiting();
}

void StorageSet::Shutdown(int64_t drain_ns) {
  StopWaiting();
  GcsStorage* gcs;
  {
    MutexLock lock(&mu_);
    gcs = gcs_.get();
  }
  if (gcs != nullptr) gcs->Shutdown(drain_ns);
}

GcsStorage* StorageSet::gcs() {
  MutexLock lock(&mu_);
  return gcs_.get();
}

}  // namespace clusterprof::storage
