#include "common/storage/local_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/storage/dirs.h"

namespace clusterprof::storage {
namespace {

// Symbolic links followed on the way to one directory, as the kernel's MAXSYMLINKS.
constexpr int kMaxLinks = 40;

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Gives up ownership.
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

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

// Whole-component prefix: "/a/b" is under "/a" and "/a/b", not under "/a/bc".
bool HasPathPrefix(std::string_view path, std::string_view prefix) {
  if (prefix == "/") return StartsWith(path, "/");
  return path == prefix || (StartsWith(path, prefix) && path[prefix.size()] == '/');
}

// "/a//b/./c/" -> "/a/b/c"; nullopt when a component is "..".
std::optional<std::string> NormalizeAbsolute(std::string_view path) {
  std::string out;
  for (std::string_view part : SplitSkipEmpty(path, '/')) {
    if (part == ".") continue;
    if (part == "..") return std::nullopt;
    StrAppend(&out, "/", part);
  }
  return out.empty() ? "/" : out;
}

std::string RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : std::string();
}

// fsyncs the directory `dir` refers to (any descriptor of it, O_PATH included).
absl::Status SyncDirectoryAt(int dir, const std::string& path) {
  Fd fd(openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "cannot open directory", path);
  if (fsync(fd.get()) != 0) return ErrnoToStatus(errno, "cannot fsync directory", path);
  return absl::OkStatus();
}

// A directory, opened, and its path for messages.
struct OpenDir {
  Fd fd;
  std::string path;
};

// Opens (creating what is missing) the directory `components` below the root `root`, whose path
// is `root_path`, one component at a time relative to the descriptor of the one above, so that
// nothing swapped in meanwhile can move the walk elsewhere. A symbolic link is followed only
// while it stays beneath the root: a relative one by walking its target from where it is (a ".."
// above the root is refused), an absolute one when it names a path under one of `root_names`
// (the root as configured and as its real path). Anything else is PERMISSION_DENIED naming the
// link.
absl::StatusOr<OpenDir> OpenBeneath(Fd root, const std::string& root_path,
                                    const std::vector<std::string>& root_names,
                                    const std::vector<std::string>& components) {
  std::vector<Fd> fds;
  std::vector<std::string> names;  // the components of fds[1..]
  fds.push_back(std::move(root));
  auto display = [&](std::string_view last) {
    std::string path = root_path == "/" ? "" : root_path;
    for (const std::string& name : names) StrAppend(&path, "/", name);
    if (!last.empty()) StrAppend(&path, "/", last);
    return path.empty() ? std::string("/") : path;
  };
  std::deque<std::string> pending(components.begin(), components.end());
  int links = 0;
  while (!pending.empty()) {
    const std::string name = std::move(pending.front());
    pending.pop_front();
    if (name.empty() || name == ".") continue;
    if (name == "..") {
      if (fds.size() == 1) {
        return absl::PermissionDeniedError(StrCat("a symbolic link below ", root_path,
                                                  " leads above it (at ", display(""),
                                                  "); files are written only beneath ", root_path));
      }
      fds.pop_back();
      names.pop_back();
      continue;
    }
    const int parent = fds.back().get();
    // O_PATH | O_NOFOLLOW opens whatever is there, a link included, without following it; what
    // it is is then read from that same inode.
    Fd entry(openat(parent, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!entry.valid() && errno == ENOENT) {
      if (mkdirat(parent, name.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoToStatus(errno, "cannot create directory", display(name));
      }
      entry = Fd(openat(parent, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    }
    if (!entry.valid()) return ErrnoToStatus(errno, "cannot open directory", display(name));
    struct stat st;
    if (fstat(entry.get(), &st) != 0) return ErrnoToStatus(errno, "cannot stat", display(name));
    if (S_ISDIR(st.st_mode)) {
      fds.push_back(std::move(entry));
      names.push_back(name);
      continue;
    }
    if (!S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(
          StrCat("cannot create directory ", display(name), ": a file is in the way"));
    }
    if (++links > kMaxLinks) {
      return ErrnoToStatus(ELOOP, "cannot open directory", display(name));
    }
    char buffer[PATH_MAX];
    const ssize_t n = readlinkat(entry.get(), "", buffer, sizeof(buffer));
    if (n < 0) return ErrnoToStatus(errno, "cannot read the symbolic link", display(name));
    std::string_view target(buffer, static_cast<size_t>(n));
    if (StartsWith(target, "/")) {
      const std::optional<std::string> normalized = NormalizeAbsolute(target);
      auto root_name = std::find_if(root_names.begin(), root_names.end(), [&](const auto& r) {
        return normalized.has_value() && HasPathPrefix(*normalized, r);
      });
      if (root_name == root_names.end()) {
        return absl::PermissionDeniedError(StrCat(display(name), " is a symbolic link to ", target,
                                                  ", outside ", root_path,
                                                  "; files are written only beneath ", root_path));
      }
      // Walk it from the root: what is below the root is walked like any other path.
      fds.resize(1);
      names.clear();
      const std::string_view below_root = std::string_view{*normalized}.substr(root_name->size());
      std::vector<std::string_view> parts = SplitSkipEmpty(below_root, '/');
      pending.insert(pending.begin(), parts.begin(), parts.end());
      continue;
    }
    std::vector<std::string_view> parts = SplitSkipEmpty(target, '/');
    pending.insert(pending.begin(), parts.begin(), parts.end());
  }
  return OpenDir{std::move(fds.back()), display("")};
}

// Creates ".<name>.tmp-XXXXXX" in `dir`, exclusively and never through a link.
absl::StatusOr<std::pair<Fd, std::string>> CreateTemp(int dir, const std::string& dir_path,
                                                      const std::string& name) {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 random{std::random_device{}()};
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string temp = StrCat(".", name, ".tmp-");
    for (int i = 0; i < 6; ++i) temp += kChars[random() % (sizeof(kChars) - 1)];
    Fd fd(openat(dir, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd.valid()) return std::make_pair(std::move(fd), std::move(temp));
    if (errno != EEXIST) return ErrnoToStatus(errno, "cannot create a file in", dir_path);
  }
  return ErrnoToStatus(EEXIST, "cannot create a file in", dir_path);
}

class LocalObjectWriter final : public ObjectWriter {
 public:
  // `dir` is the destination directory, `name` the object's name in it and `temp_name` the
  // temporary file `fd` writes.
  LocalObjectWriter(std::string uri, OpenDir dir, std::string name, std::string temp_name, Fd fd,
                    const LocalStorageOptions& options)
      : uri_(std::move(uri)),
        dir_(std::move(dir)),
        name_(std::move(name)),
        temp_name_(std::move(temp_name)),
        path_(StrCat(dir_.path == "/" ? "" : dir_.path, "/", name_)),
        temp_path_(StrCat(dir_.path == "/" ? "" : dir_.path, "/", temp_name_)),
        fd_(std::move(fd)),
        sync_(options.sync),
        buffer_size_(options.buffer_size) {
    buffer_.reserve(buffer_size_);
  }

  ~LocalObjectWriter() override { Abort(); }

  absl::Status Append(std::string_view data) override {
    if (!status_.ok()) return status_;
    if (!fd_.valid()) return absl::FailedPreconditionError(StrCat("write to closed object ", uri_));
    bytes_ += data.size();
    if (buffer_.size() + data.size() <= buffer_size_) {
      buffer_.append(data);
      return absl::OkStatus();
    }
    status_ = FlushBuffer();
    if (!status_.ok()) return status_;
    if (data.size() >= buffer_size_) {
      status_ = WriteAll(data);
    } else {
      buffer_.append(data);
    }
    return status_;
  }

  absl::StatusOr<ObjectInfo> Commit() override {
    if (!fd_.valid())
      return absl::FailedPreconditionError(StrCat("commit of closed object ", uri_));
    if (status_.ok()) status_ = FlushBuffer();
    if (status_.ok() && sync_ && fsync(fd_.get()) != 0) {
      status_ = ErrnoToStatus(errno, "cannot fsync", temp_path_);
    }
    if (close(fd_.Release()) != 0 && status_.ok()) {
      status_ = ErrnoToStatus(errno, "cannot close", temp_path_);
    }
    // Both names relative to the directory opened when the writer started: a link swapped in
    // on the way to it since then changes nothing, and a link at the final name is replaced,
    // not followed.
    if (status_.ok() &&
        renameat(dir_.fd.get(), temp_name_.c_str(), dir_.fd.get(), name_.c_str()) != 0) {
      status_ = ErrnoToStatus(errno, StrCat("cannot rename ", temp_path_, " to"), path_);
    }
    if (!status_.ok()) {
      unlinkat(dir_.fd.get(), temp_name_.c_str(), 0);
      return status_;
    }
    if (sync_) CLUSTERPROF_RETURN_IF_ERROR(SyncDirectoryAt(dir_.fd.get(), dir_.path));
    ObjectInfo info;
    info.uri = uri_;
    info.bytes = bytes_;
    info.bytes_committed = bytes_;
    return info;
  }

  void Abort() override {
    if (!fd_.valid()) return;
    fd_.Reset();
    unlinkat(dir_.fd.get(), temp_name_.c_str(), 0);
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
      const ssize_t n = write(fd_.get(), data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, "cannot write", path_);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  const std::string uri_;
  const OpenDir dir_;
  const std::string name_;
  const std::string temp_name_;
  const std::string path_;
  const std::string temp_path_;
  Fd fd_;
  const bool sync_;
  const size_t buffer_size_;
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
  explicit LocalStorage(LocalStorageOptions options) : options_(std::move(options)) {}

  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string_view uri) override {
    CLUSTERPROF_ASSIGN_OR_RETURN(std::string path, LocalPath(uri));
    auto [dir, name] = SplitDirName(path);
    if (name.empty() || name == "." || name == "..") {
      return absl::InvalidArgumentError(StrCat("'", uri, "' names a directory, not a file"));
    }
    OpenDir opened;
    if (options_.write_roots.has_value()) {
      CLUSTERPROF_ASSIGN_OR_RETURN(opened, OpenConfined(dir));
    } else {
      CLUSTERPROF_RETURN_IF_ERROR(MakeDirs(dir, 0755));
      opened.fd = Fd(open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!opened.fd.valid()) return ErrnoToStatus(errno, "cannot open directory", dir);
      opened.path = dir;
    }
    CLUSTERPROF_ASSIGN_OR_RETURN(auto temp, CreateTemp(opened.fd.get(), opened.path, name));
    fchmod(temp.first.get(), 0644);
    return std::make_unique<LocalObjectWriter>(std::string(uri), std::move(opened), std::move(name),
                                               std::move(temp.second), std::move(temp.first),
                                               options_);
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
  // The directory `dir` beneath the write root it names (the most specific one), opened as
  // OpenBeneath does.
  absl::StatusOr<OpenDir> OpenConfined(const std::string& dir) const {
    const std::optional<std::string> normalized = NormalizeAbsolute(dir);
    if (!normalized.has_value()) {
      return absl::InvalidArgumentError(StrCat("'", dir, "' has a '..' component"));
    }
    std::string best;
    std::vector<std::string> best_names;
    for (const std::string& root : *options_.write_roots) {
      const std::optional<std::string> given = NormalizeAbsolute(root);
      if (!given.has_value()) continue;
      std::vector<std::string> names = {*given};
      if (std::string real = RealPath(*given); !real.empty() && real != *given) {
        names.push_back(std::move(real));
      }
      for (const std::string& name : names) {
        if (HasPathPrefix(*normalized, name) && name.size() > best.size()) {
          best = name;
          best_names = names;
        }
      }
    }
    if (best.empty()) {
      return absl::PermissionDeniedError(StrCat(
          "cannot write under ", dir,
          ": it is outside the directories this process may "
          "write to (",
          options_.write_roots->empty() ? "none" : absl::StrJoin(*options_.write_roots, ", "),
          ")"));
    }
    // The root is configuration: created when missing and opened as it is.
    CLUSTERPROF_RETURN_IF_ERROR(MakeDirs(best, 0755));
    Fd root(open(best.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid()) return ErrnoToStatus(errno, "cannot open directory", best);
    const std::string_view below_root =
        std::string_view{*normalized}.substr(best == "/" ? 0 : best.size());
    std::vector<std::string> below;
    for (std::string_view part : SplitSkipEmpty(below_root, '/')) below.emplace_back(part);
    return OpenBeneath(std::move(root), best, best_names, below);
  }

  const LocalStorageOptions options_;
};

}  // namespace

std::unique_ptr<Storage> NewLocalStorage(LocalStorageOptions options) {
  return std::make_unique<LocalStorage>(std::move(options));
}

}  // namespace clusterprof::storage
