#include "common/storage/dirs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/base/status.h"
#include "common/base/strings.h"

namespace clusterprof::storage {

absl::Status MakeDirs(const std::string& dir, mode_t mode) {
  if (dir.empty() || dir == "/") return absl::OkStatus();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        StrCat("cannot create directory ", dir, ": a file is in the way"));
  }
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    CLUSTERPROF_RETURN_IF_ERROR(MakeDirs(dir.substr(0, slash), mode));
  }
  if (mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, "cannot create directory", dir);
  }
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "cannot open directory", dir);
  const int rc = fsync(fd);
  const int saved = errno;
  close(fd);
  if (rc != 0) return ErrnoToStatus(saved, "cannot fsync directory", dir);
  return absl::OkStatus();
}

absl::Status WriteFileDurably(const std::string& path, std::string_view data, mode_t mode) {
  const std::string temp = StrCat(path, ".tmp");
  // A leftover of a crash goes first; then the temporary file is created afresh and never opened
  // through a link, which a process sharing the directory (the pod's workloads share the
  // shared-memory directory) could have put there to have another file overwritten.
  if (unlink(temp.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "cannot remove the stale", temp);
  }
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoToStatus(errno, "cannot create", temp);
  if (fchmod(fd, mode) != 0) {
    const int saved = errno;
    close(fd);
    unlink(temp.c_str());
    return ErrnoToStatus(saved, "cannot set the mode of", temp);
  }
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      close(fd);
      unlink(temp.c_str());
      return ErrnoToStatus(saved, "cannot write", temp);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  if (fsync(fd) != 0) {
    const int saved = errno;
    close(fd);
    unlink(temp.c_str());
    return ErrnoToStatus(saved, "cannot fsync", temp);
  }
  close(fd);
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    unlink(temp.c_str());
    return ErrnoToStatus(saved, "cannot rename into place", path);
  }
  return absl::OkStatus();
}

}  // namespace clusterprof::storage
