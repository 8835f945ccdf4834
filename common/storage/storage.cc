#include "common/storage/storage.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/base/env.h"
#include "common/base/status.h"
#include "common/base/strings.h"

namespace clusterprof::storage {

std::string_view UploadStateName(UploadState state) {
  switch (state) {
    case UploadState::kSpooled:
      return "spooled";
    case UploadState::kUploading:
      return "uploading";
    case UploadState::kCommitted:
      return "committed";
    case UploadState::kFailed:
      return "failed";
  }
  return "unknown";
}

absl::StatusOr<ObjectInfo> WriteObject(Storage& storage, std::string_view uri,
                                       std::string_view data) {
  CLUSTERPROF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer, storage.NewWriter(uri));
  CLUSTERPROF_RETURN_IF_ERROR(writer->Append(data));
  return writer->Commit();
}

absl::StatusOr<std::string> ReadObject(Storage& storage, std::string_view uri) {
  CLUSTERPROF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, storage.NewReader(uri));
  std::string data;
  char buffer[64 * 1024];
  while (true) {
    CLUSTERPROF_ASSIGN_OR_RETURN(size_t n, reader->Read(buffer, sizeof(buffer)));
    if (n == 0) break;
    data.append(buffer, n);
  }
  return data;
}

absl::StatusOr<std::unique_ptr<LocalCopy>> LocalCopy::Fetch(Storage& storage,
                                                            std::string_view uri) {
  if (!StartsWith(uri, "gs://")) {
    ConsumePrefix(&uri, "file://");
    return std::unique_ptr<LocalCopy>(new LocalCopy(std::string(uri), false));
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, storage.NewReader(uri));
  std::string path = StrCat(GetEnv("TMPDIR").value_or("/tmp"), "/clusterprof-XXXXXX");
  const int fd = mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "cannot create a temporary file", path);
  std::unique_ptr<LocalCopy> copy(new LocalCopy(path, true));
  std::string buffer(1 << 20, '\0');
  absl::Status status;
  while (status.ok()) {
    absl::StatusOr<size_t> n = reader->Read(buffer.data(), buffer.size());
    if (!n.ok()) {
      status = n.status();
      break;
    }
    if (*n == 0) break;
    for (size_t done = 0; done < *n;) {
      const ssize_t written = write(fd, buffer.data() + done, *n - done);
      if (written < 0 && errno == EINTR) continue;
      if (written < 0) {
        status = ErrnoToStatus(errno, "cannot write", path);
        break;
      }
      done += static_cast<size_t>(written);
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return copy;
}

LocalCopy::~LocalCopy() {
  if (temporary_) unlink(path_.c_str());
}

absl::Status CheckCommitted(const ObjectInfo& info) {
  switch (info.state) {
    case UploadState::kCommitted:
      return absl::OkStatus();
    case UploadState::kFailed:
      return absl::UnavailableError(StrCat("upload of ", info.uri, " failed: ", info.error,
                                           "; the file is kept at ", info.spool_path));
    case UploadState::kSpooled:
    case UploadState::kUploading:
      break;
  }
  return absl::UnavailableError(StrCat(
      info.uri, " is not uploaded yet (", info.bytes_committed, " of ", info.bytes, " bytes)",
      info.error.empty() ? "" : StrCat(": ", info.error), "; it waits at ", info.spool_path));
}

}  // namespace clusterprof::storage
