#include "common/storage/local_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/storage/dirs.h"

namespace clusterprof::storage {
namespace {

// Accepts "/abs/path" and "file:///abs/path".
absl::StatusOr<std::string> LocalPath(std::string_view uri) {
  ConsumePrefix(&uri, "file://");
  if (!StartsWith(uri, "/")) {
    return absl::InvalidArgumentError(
        StrCat("local storage needs an absolute path, not '", uri, "'"));
  }
  return std::string(uri);
}

std::pair<std::string, std::string> SplitDirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == 0) return {"/", path.substr(1)};
  return {path.substr(0, slash), path.substr(slash + 1)};
}

class LocalObjectWriter final : public ObjectWriter {
 public:
  LocalObjectWriter(std::string uri, std::string path, std::string temp_path, int fd,
                    const LocalStorageOptions& options)
      : uri_(std::move(uri)),
        path_(std::move(path)),
        temp_path_(std::move(temp_path)),
        fd_(fd),
        options_(options) {
    buffer_.reserve(options_.buffer_size);
  }

  ~LocalObjectWriter() override { Abort(); }

  absl::Status Append(std::string_view data) override {
    if (!status_.ok()) return status_;
    if (fd_ < 0) return absl::FailedPreconditionError(StrCat("write to closed object ", uri_));
    bytes_ += data.size();
    if (buffer_.size() + data.size() <= options_.buffer_size) {
      buffer_.append(data);
      return absl::OkStatus();
    }
    status_ = FlushBuffer();
    if (!status_.ok()) return status_;
    if (data.size() >= options_.buffer_size) {
      status_ = WriteAll(data);
    } else {
      buffer_.append(data);
    }
    return status_;
  }

  absl::StatusOr<ObjectInfo> Commit() override {
    if (fd_ < 0) return absl::FailedPreconditionError(StrCat("commit of closed object ", uri_));
    if (status_.ok()) status_ = FlushBuffer();
    if (status_.ok() && options_.sync && fsync(fd_) != 0) {
      status_ = ErrnoToStatus(errno, "cannot fsync", temp_path_);
    }
    if (status_.ok() && close(fd_) != 0)
      status_ = ErrnoToStatus(errno, "cannot close", temp_path_);
    else if (!status_.ok())
      close(fd_);
    fd_ = -1;
    if (status_.ok() && rename(temp_path_.c_str(), path_.c_str()) != 0) {
      status_ = ErrnoToStatus(errno, StrCat("cannot rename ", temp_path_, " to"), path_);
    }
    if (!status_.ok()) {
      unlink(temp_path_.c_str());
      return status_;
    }
    if (options_.sync) CLUSTERPROF_RETURN_IF_ERROR(SyncDirectory(SplitDirName(path_).first));
    ObjectInfo info;
    info.uri = uri_;
    info.bytes = bytes_;
    info.bytes_committed = bytes_;
    return info;
  }

  void Abort() override {
    if (fd_ < 0) return;
    close(fd_);
    fd_ = -1;
    unlink(temp_path_.c_str());
  }

  const std::string& uri() const override { return uri_; }

 private:
  absl::Status FlushBuffer() {
    absl::Status status = WriteAll(buffer_);
    buffer_.clear();
    return status;
  }

  absl::Status WriteAll(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, "cannot write", path_);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  const std::string uri_;
  const std::string path_;
  const std::string temp_path_;
  int fd_;
  const LocalStorageOptions options_;
  std::string buffer_;
  absl::Status status_;
  uint64_t bytes_ = 0;
};

class LocalObjectReader final : public ObjectReader {
 public:
  LocalObjectReader(std::string uri, int fd) : uri_(std::move(uri)), fd_(fd) {}
  ~LocalObjectReader() override { close(fd_); }

  absl::StatusOr<size_t> Read(char* buffer, size_t size) override {
    while (true) {
      const ssize_t n = read(fd_, buffer, size);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) return ErrnoToStatus(errno, "cannot read", uri_);
    }
  }
  const std::string& uri() const override { return uri_; }

 private:
  const std::string uri_;
  const int fd_;
};

class LocalStorage final : public Storage {
 public:
  explicit LocalStorage(LocalStorageOptions options) : options_(options) {}

  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string_view uri) override {
    CLUSTERPROF_ASSIGN_OR_RETURN(std::string path, LocalPath(uri));
    auto [dir, name] = SplitDirName(path);
    if (name.empty()) {
      return absl::InvalidArgumentError(StrCat("'", uri, "' names a directory, not a file"));
    }
    CLUSTERPROF_RETURN_IF_ERROR(MakeDirs(dir, 0755));
    std::string temp = StrCat(dir, "/.", name, ".tmp-XXXXXX");
    const int fd = mkostemp(temp.data(), O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, "cannot create a file in", dir);
    fchmod(fd, 0644);
    return std::make_unique<LocalObjectWriter>(std::string(uri), std::move(path), std::move(temp),
                                               fd, options_);
  }

  absl::StatusOr<std::unique_ptr<ObjectReader>> NewReader(std::string_view uri) override {
    CLUSTERPROF_ASSIGN_OR_RETURN(std::string path, LocalPath(uri));
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, "cannot open", path);
    return std::make_unique<LocalObjectReader>(std::string(uri), fd);
  }

  absl::StatusOr<std::vector<Entry>> List(std::string_view uri) override {
    CLUSTERPROF_ASSIGN_OR_RETURN(std::string path, LocalPath(uri));
    DIR* dir = opendir(path.c_str());
    if (dir == nullptr) return ErrnoToStatus(errno, "cannot list", path);
    std::vector<Entry> entries;
    while (dirent* d = readdir(dir)) {
      const std::string_view name = d->d_name;
      if (name == "." || name == "..") continue;
      struct stat st;
      if (fstatat(dirfd(dir), d->d_name, &st, 0) != 0) continue;  // raced with a delete
      entries.push_back(Entry{std::string(name), S_ISDIR(st.st_mode),
                              S_ISDIR(st.st_mode) ? 0 : static_cast<uint64_t>(st.st_size)});
    }
    closedir(dir);
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.name < b.name; });
    return entries;
  }

  absl::StatusOr<Entry> Stat(std::string_view uri) override {
    CLUSTERPROF_ASSIGN_OR_RETURN(std::string path, LocalPath(uri));
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "cannot stat", path);
    return Entry{SplitDirName(path).second, S_ISDIR(st.st_mode),
                 S_ISDIR(st.st_mode) ? 0 : static_cast<uint64_t>(st.st_size)};
  }

 private:
  const LocalStorageOptions options_;
};

}  // namespace

std::unique_ptr<Storage> NewLocalStorage(LocalStorageOptions options) {
  return std::make_unique<LocalStorage>(options);
}

}  // namespace clusterprof::storage
