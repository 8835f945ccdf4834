#include "common/storage/spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>

#include "absl/strings/numbers.h"
#include "common/base/json_escape.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/io/crc32c.h"
#include "common/storage/dirs.h"
#include "spdlog/spdlog.h"
// After spdlog: cpprestsdk's headers break fmt's std::byte formatter when included first.
#include "cpprest/json.h"

namespace clusterprof::storage {
namespace {

constexpr std::string_view kDataSuffix = ".data";
constexpr std::string_view kRecordSuffix = ".json";
constexpr std::string_view kTempSuffix = ".tmp";

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "cannot open", path);
  std::string data;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      close(fd);
      return ErrnoToStatus(saved, "cannot read", path);
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return data;
}

}  // namespace

std::string SpoolRecordToJson(const SpoolRecord& record) {
  std::string json = "{";
  auto field = [&](std::string_view key, std::string_view value) {
    if (json.size() > 1) json.push_back(',');
    json.push_back('"');
    json.append(key);
    json += "\":\"";
    AppendJsonEscaped(value, &json);
    json.push_back('"');
  };
  auto number = [&](std::string_view key, auto value) {
    if (json.size() > 1) json.push_back(',');
    StrAppend(&json, "\"", key, "\":", value);
  };
  field("id", record.id);
  field("uri", record.uri);
  field("contentType", record.content_type);
  // 64-bit numbers as strings, as GCS writes them: JSON readers may hold numbers as doubles.
  field("bytes", StrCat(record.bytes));
  field("crc32c", Crc32cToBase64(record.crc32c));
  field("created", StrCat(record.created_wall_ns));
  if (!record.session_uri.empty()) field("sessionUri", record.session_uri);
  field("committed", StrCat(record.committed));
  if (record.failed) number("failed", "true");
  if (!record.error.empty()) field("error", record.error);
  json.push_back('}');
  return json;
}

absl::StatusOr<SpoolRecord> SpoolRecordFromJson(std::string_view text) {
  web::json::value json;
  try {
    json = web::json::value::parse(std::string(text));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(StrCat("not JSON: ", e.what()));
  }
  if (!json.is_object()) return absl::InvalidArgumentError("not a JSON object");
  SpoolRecord record;
  auto text_field = [&](const char* key, bool required, std::string* out) -> absl::Status {
    if (json.has_string_field(key)) {
      *out = json.at(key).as_string();
      return absl::OkStatus();
    }
    if (required) return absl::InvalidArgumentError(StrCat("no string field \"", key, "\""));
    return absl::OkStatus();
  };
  auto uint_field = [&](const char* key, uint64_t* out) -> absl::Status {
    std::string value;
    CLUSTERPROF_RETURN_IF_ERROR(text_field(key, true, &value));
    uint64_t parsed = 0;
    if (!absl::SimpleAtoi(AbslView(value), &parsed)) {
      return absl::InvalidArgumentError(StrCat("\"", key, "\" is not a number: ", value));
    }
    *out = parsed;
    return absl::OkStatus();
  };
  CLUSTERPROF_RETURN_IF_ERROR(text_field("id", true, &record.id));
  CLUSTERPROF_RETURN_IF_ERROR(text_field("uri", true, &record.uri));
  CLUSTERPROF_RETURN_IF_ERROR(text_field("contentType", false, &record.content_type));
  CLUSTERPROF_RETURN_IF_ERROR(uint_field("bytes", &record.bytes));
  CLUSTERPROF_RETURN_IF_ERROR(uint_field("committed", &record.committed));
  uint64_t created = 0;
  CLUSTERPROF_RETURN_IF_ERROR(uint_field("created", &created));
  record.created_wall_ns = static_cast<int64_t>(created);
  std::string crc;
  CLUSTERPROF_RETURN_IF_ERROR(text_field("crc32c", true, &crc));
  std::optional<uint32_t> parsed_crc = Crc32cFromBase64(crc);
  if (!parsed_crc) return absl::InvalidArgumentError(StrCat("\"crc32c\" is malformed: ", crc));
  record.crc32c = *parsed_crc;
  CLUSTERPROF_RETURN_IF_ERROR(text_field("sessionUri", false, &record.session_uri));
  CLUSTERPROF_RETURN_IF_ERROR(text_field("error", false, &record.error));
  record.failed = json.has_boolean_field("failed") && json.at("failed").as_bool();
  if (!StartsWith(record.uri, "gs://")) {
    return absl::InvalidArgumentError(StrCat("\"uri\" is not a gs:// URI: ", record.uri));
  }
  if (record.committed > record.bytes) {
    return absl::InvalidArgumentError(
        StrCat("\"committed\" (", record.committed, ") exceeds \"bytes\" (", record.bytes, ")"));
  }
  return record;
}

absl::StatusOr<std::unique_ptr<Spool>> Spool::Open(std::string dir, uint64_t max_bytes) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(
        StrCat("spool directory '", dir, "' must be an absolute path"));
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  constexpr std::string_view kHint =
      "; give a writable directory with --spool-dir (clusterprof-sidecar) or "
      "$CLUSTERPROF_SPOOL_DIR";
  if (absl::Status made = MakeDirs(dir, 0700); !made.ok()) {
    return absl::Status(made.code(), StrCat(made.message(), kHint));
  }
  if (access(dir.c_str(), W_OK) != 0) {
    const absl::Status status = ErrnoToStatus(errno, "cannot write to spool directory", dir);
    return absl::Status(status.code(), StrCat(status.message(), kHint));
  }
  std::unique_ptr<Spool> spool(new Spool(std::move(dir), max_bytes));
  CLUSTERPROF_RETURN_IF_ERROR(spool->Load());
  return spool;
}

absl::Status Spool::Load() {
  DIR* directory = opendir(dir_.c_str());
  if (directory == nullptr) return ErrnoToStatus(errno, "cannot list spool directory", dir_);
  std::vector<std::string> names;
  while (dirent* entry = readdir(directory)) names.emplace_back(entry->d_name);
  closedir(directory);
  std::sort(names.begin(), names.end());

  std::vector<SpoolRecord> records;
  for (const std::string& name : names) {
    if (EndsWith(name, kTempSuffix)) {
      unlink(StrCat(dir_, "/", name).c_str());
      continue;
    }
    if (!EndsWith(name, kRecordSuffix)) continue;
    const std::string path = StrCat(dir_, "/", name);
    absl::StatusOr<std::string> text = ReadSmallFile(path);
    absl::StatusOr<SpoolRecord> record =
        text.ok() ? SpoolRecordFromJson(*text) : absl::StatusOr<SpoolRecord>(text.status());
    const std::string id = name.substr(0, name.size() - kRecordSuffix.size());
    struct stat st;
    if (record.ok() && record->id != id) {
      record = absl::InvalidArgumentError(StrCat("its id is '", record->id, "'"));
    }
    if (record.ok() && (stat(DataPath(id).c_str(), &st) != 0 ||
                        static_cast<uint64_t>(st.st_size) != record->bytes)) {
      record = absl::DataLossError(StrCat("its data file ", DataPath(id), " is missing or not ",
                                          record->bytes, " bytes long"));
    }
    if (!record.ok()) {
      // Keep the bytes for a person to look at, out of the way of the uploader.
      spdlog::error("spool record {} is unusable and was set aside as {}.bad: {}", path, path,
                    std::string(record.status().message()));
      rename(path.c_str(), StrCat(path, ".bad").c_str());
      continue;
    }
    records.push_back(*std::move(record));
  }
  // Data files without a record: writes that never committed.
  for (const std::string& name : names) {
    if (!EndsWith(name, kDataSuffix)) continue;
    const std::string id = name.substr(0, name.size() - kDataSuffix.size());
    if (std::binary_search(names.begin(), names.end(), StrCat(id, kRecordSuffix))) continue;
    if (std::binary_search(names.begin(), names.end(), StrCat(id, kRecordSuffix, ".bad"))) {
      continue;
    }
    spdlog::warn("spool: removing {}, a write that never committed", DataPath(id));
    unlink(DataPath(id).c_str());
  }
  std::sort(records.begin(), records.end(), [](const SpoolRecord& a, const SpoolRecord& b) {
    return a.created_wall_ns < b.created_wall_ns;
  });
  MutexLock lock(&mu_);
  for (const SpoolRecord& record : records) used_bytes_ += record.bytes;
  recovered_ = std::move(records);
  return absl::OkStatus();
}

std::string Spool::DataPath(std::string_view id) const {
  return StrCat(dir_, "/", id, kDataSuffix);
}

absl::StatusOr<std::pair<std::string, int>> Spool::CreateDataFile() {
  static thread_local std::mt19937_64 random(std::random_device{}());
  for (int attempt = 0; attempt < 10; ++attempt) {
    uint64_t sequence;
    {
      MutexLock lock(&mu_);
      sequence = next_id_++;
    }
    // Unique across processes sharing the directory: pid, a sequence and random bits.
    const std::string id = StrCat(getpid(), "-", sequence, "-", random() % 1000000000);
    const std::string path = DataPath(id);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) return std::make_pair(id, fd);
    if (errno != EEXIST) return ErrnoToStatus(errno, "cannot create a spool file in", dir_);
  }
  return absl::InternalError(StrCat("cannot find a free spool file name in ", dir_));
}

absl::Status Spool::Reserve(uint64_t bytes, std::string_view uri) {
  MutexLock lock(&mu_);
  if (used_bytes_ + bytes > max_bytes_) {
    return absl::ResourceExhaustedError(
        StrCat("the upload spool ", dir_, " is full: ", used_bytes_, " of its ", max_bytes_,
               " bytes hold files waiting for upload, and ", uri,
               " needs more. Uploads are failing or slower than captures; check the sidecar's log "
               "and the clusterprof_spool_* metrics, or raise --spool-max-bytes"));
  }
  used_bytes_ += bytes;
  return absl::OkStatus();
}

void Spool::Release(uint64_t bytes) {
  MutexLock lock(&mu_);
  used_bytes_ -= std::min(used_bytes_, bytes);
}

uint64_t Spool::used_bytes() const {
  MutexLock lock(&mu_);
  return used_bytes_;
}

absl::Status Spool::WriteRecord(const SpoolRecord& record) {
  CLUSTERPROF_RETURN_IF_ERROR(WriteFileDurably(StrCat(dir_, "/", record.id, kRecordSuffix),
                                               SpoolRecordToJson(record), 0600));
  return SyncDirectory(dir_);
}

absl::Status Spool::Remove(std::string_view id) {
  const std::string record = StrCat(dir_, "/", id, kRecordSuffix);
  if (unlink(record.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "cannot remove", record);
  }
  CLUSTERPROF_RETURN_IF_ERROR(SyncDirectory(dir_));
  unlink(DataPath(id).c_str());
  return absl::OkStatus();
}

void Spool::RemoveDataFile(std::string_view id) { unlink(DataPath(id).c_str()); }

std::vector<SpoolRecord> Spool::TakeRecovered() {
  MutexLock lock(&mu_);
  return std::move(recovered_);
}

}  // namespace clusterprof::storage
