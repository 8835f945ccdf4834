#include "operator/kube/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "common/base/check.h"
#include "common/base/env.h"
#include "common/base/json_escape.h"
#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "operator/kube/exec_credential.h"

namespace clusterprof::kube {

std::optional<std::string> ProcessEnvironment::Get(std::string_view name) const {
  return GetEnv(name);
}

std::optional<std::string> MapEnvironment::Get(std::string_view name) const {
  auto it = variables_.find(name);
  if (it == variables_.end()) return std::nullopt;
  return it->second;
}

TokenSource::~TokenSource() = default;

namespace {

// Larger than any kubeconfig, CA bundle or token in use; the cap keeps a path like /dev/zero or
// a mistaken multi-gigabyte file from exhausting memory.
constexpr int64_t kMaxFileBytes = 16 << 20;

// What stat() tells about a file's contents without reading them.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  int64_t mtime_ns = 0;
  int64_t size = 0;

  bool operator==(const FileIdentity&) const = default;
};

FileIdentity IdentityOf(const struct stat& st) {
  return {st.st_dev, st.st_ino, st.st_mtim.tv_sec * kNanosPerSecond + st.st_mtim.tv_nsec,
          st.st_size};
}

// Reads the regular file at `path` (symlinks followed) whole, and the identity of what it read.
absl::Status ReadSmallFile(const std::string& path, std::string* contents,
                           FileIdentity* identity = nullptr) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is then refused as not regular.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoToStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(StrCat(path, " is not a regular file"));
  }
  if (st.st_size > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        StrCat(path, " is ", st.st_size, " bytes, more than the ", kMaxFileBytes, " allowed"));
  }
  contents->clear();
  char buffer[16384];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read", path);
    }
    if (n == 0) break;
    contents->append(buffer, static_cast<size_t>(n));
    // A file that grows while being read.
    if (static_cast<int64_t>(contents->size()) > kMaxFileBytes) {
      return absl::InvalidArgumentError(
          StrCat(path, " is more than the ", kMaxFileBytes, " bytes allowed"));
    }
  }
  if (identity != nullptr) *identity = IdentityOf(st);
  return absl::OkStatus();
}

bool LooksLikePem(std::string_view data) { return data.find("-----BEGIN ") != data.npos; }

class StaticTokenSource final : public TokenSource {
 public:
  explicit StaticTokenSource(std::string token) : token_(std::move(token)) {}
  absl::StatusOr<std::string> Token() override { return token_; }

 private:
  const std::string token_;
};

class FileTokenSource final : public TokenSource {
 public:
  FileTokenSource(std::string path, Clock* clock, int64_t max_age_ns)
      : path_(std::move(path)), clock_(clock), max_age_ns_(max_age_ns) {
    CLUSTERPROF_CHECK(clock_ != nullptr);
  }

  absl::StatusOr<std::string> Token() override {
    MutexLock lock(&mu_);
    struct stat st;
    if (stat(path_.c_str(), &st) != 0) {
      return Annotate(ErrnoToStatus(errno, "stat", path_), "bearer token file");
    }
    const int64_t now_ns = clock_->MonotonicNs();
    if (identity_.has_value() && *identity_ == IdentityOf(st) &&
        now_ns - read_at_ns_ < max_age_ns_) {
      return token_;
    }
    std::string contents;
    FileIdentity identity;
    CLUSTERPROF_RETURN_IF_ERROR(
        Annotate(ReadSmallFile(path_, &contents, &identity), "bearer token file"));
    const std::string_view token = StripAsciiWhitespace(contents);
    if (token.empty()) {
      identity_.reset();
      return absl::InvalidArgumentError(
          StrCat("bearer token file ", path_, " is empty: it must hold the token"));
    }
    token_ = std::string(token);
    identity_ = identity;
    read_at_ns_ = now_ns;
    return token_;
  }

  void Invalidate() override {
    MutexLock lock(&mu_);
    identity_.reset();
  }

 private:
  const std::string path_;
  Clock* const clock_;
  const int64_t max_age_ns_;
  Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  // Of the file token_ came from; nullopt: read it on the next Token().
  std::optional<FileIdentity> identity_ ABSL_GUARDED_BY(mu_);
  int64_t read_at_ns_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::shared_ptr<TokenSource> StaticToken(std::string token) {
  return std::make_shared<StaticTokenSource>(std::move(token));
}

std::shared_ptr<TokenSource> FileToken(std::string path, Clock* clock, int64_t max_age_ns) {
  return std::make_shared<FileTokenSource>(std::move(path), clock, max_age_ns);
}

namespace {

// ---------------------------------------------------------------------------------------------
// Kubeconfig files, decoded into plain entries that remember where each value came from.

// A string value and where it was set, for error messages about it later.
struct Field {
  std::string value;
  // "kubeconfig /x/config: clusters[0].cluster.server (line 4, column 13)".
  std::string where;

  // An empty string is the same as no value, as in client-go.
  bool set() const { return !value.empty(); }
};

struct ClusterEntry {
  std::string file;
  std::string where;  // "kubeconfig /x/config: clusters[0]"
  Field server;
  Field ca_data;  // decoded PEM
  Field ca_file;  // resolved against the file's directory
  Field tls_server_name;
  Field proxy_url;
  Field insecure_skip_tls_verify;  // "true" or empty
  bool disable_compression = false;
  // The JSON of the extension named client.authentication.k8s.io/exec; empty: none.
  std::string exec_extension_json;
};

// A user's `exec` block as written; checked when a context selects the user.
struct ExecEntry {
  bool present = false;
  std::string where;  // "kubeconfig /x/config: users[0].user.exec (line 4, column 7)"
  Field command;      // resolved against the file's directory when it holds a '/'
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;
  Field api_version;
  Field install_hint;
  bool provide_cluster_info = false;
  Field interactive_mode;
};

struct UserEntry {
  std::string file;
  std::string where;
  Field token;
  Field token_file;
  Field cert_data;
  Field cert_file;
  Field key_data;
  Field key_file;
  Field username;
  Field password;
  ExecEntry exec;
  Field auth_provider;  // the provider's name; "(no name)" when it has none
  Impersonation impersonate;
};

struct ContextEntry {
  std::string file;
  std::string where;
  std::string cluster;
  std::string user;
  std::string namespace_;
};

// One file's contents, or the merge of several.
struct Kubeconfig {
  std::vector<std::string> files;
  std::string current_context;
  std::map<std::string, ClusterEntry> clusters;
  std::map<std::string, UserEntry> users;
  std::map<std::string, ContextEntry> contexts;
};

// "line 3, column 7"; empty for a node without a position.
std::string LineColumn(const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0) return "";
  return StrCat("line ", mark.line + 1, ", column ", mark.column + 1);
}

// " (line 3, column 7)", or empty.
std::string MarkText(const YAML::Node& node) {
  if (!node.IsDefined()) return "";
  const std::string position = LineColumn(node.Mark());
  return position.empty() ? "" : StrCat(" (", position, ")");
}

std::string Quoted(std::string_view s) { return StrCat("\"", s, "\""); }

std::string QuotedList(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& name : names) StrAppend(&out, out.empty() ? "" : ", ", Quoted(name));
  return out;
}

template <typename Entry>
std::set<std::string> NamesOf(const std::map<std::string, Entry>& entries) {
  std::set<std::string> names;
  for (const auto& [name, unused] : entries) names.insert(name);
  return names;
}

std::string JoinPaths(const std::vector<std::string>& paths) {
  std::string out;
  for (const std::string& path : paths) StrAppend(&out, out.empty() ? "" : ":", path);
  return out;
}

// `reference` from a kubeconfig at `file`: absolute as is, else against the file's directory.
std::string ResolveAgainst(std::string_view file, const std::string& reference) {
  if (reference.empty() || reference.front() == '/') return reference;
  const std::filesystem::path dir = std::filesystem::path(file).parent_path();
  if (dir.empty()) return reference;
  return (dir / reference).string();
}

// Whether `text` is a number as JSON writes one.
bool IsJsonNumber(std::string_view text) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > start;
  };
  if (i < text.size() && text[i] == '-') ++i;
  if (i < text.size() && text[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < text.size() && text[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == text.size();
}

// Appends `node` as JSON: a quoted scalar is a string; a plain one null, true, false or a
// number when it reads as one (as sigs.k8s.io/yaml converts), else a string.
void AppendYamlAsJson(const YAML::Node& node, std::string* out) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      out->push_back('{');
      bool first = true;
      for (const auto& pair : node) {
        if (!first) out->push_back(',');
        first = false;
        out->push_back('"');
        AppendJsonEscaped(pair.first.IsScalar() ? pair.first.Scalar() : "", out);
        out->append("\":");
        AppendYamlAsJson(pair.second, out);
      }
      out->push_back('}');
      return;
    }
    case YAML::NodeType::Sequence: {
      out->push_back('[');
      for (size_t i = 0; i < node.size(); ++i) {
        if (i > 0) out->push_back(',');
        AppendYamlAsJson(node[i], out);
      }
      out->push_back(']');
      return;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() != "!") {
        if (text == "~" || text == "null" || text == "Null" || text == "NULL") {
          out->append("null");
          return;
        }
        if (text == "true" || text == "True" || text == "TRUE") {
          out->append("true");
          return;
        }
        if (text == "false" || text == "False" || text == "FALSE") {
          out->append("false");
          return;
        }
        if (IsJsonNumber(text)) {
          out->append(text);
          return;
        }
      }
      out->push_back('"');
      AppendJsonEscaped(text, out);
      out->push_back('"');
      return;
    }
    default:
      out->append("null");
  }
}

// Decodes one file's YAML (already parsed) into entries. Not thread-safe; one per file.
class FileDecoder {
 public:
  explicit FileDecoder(std::string path) : path_(std::move(path)) {}

  absl::Status Decode(const YAML::Node& root, Kubeconfig* out) {
    out->files.push_back(path_);
    if (root.IsNull()) return absl::OkStatus();  // an empty file sets nothing, as in client-go
    if (!root.IsMap()) {
      return Error("the document", root,
                   "must be a mapping with clusters, users, contexts and current-context");
    }
    CLUSTERPROF_RETURN_IF_ERROR(CheckUniqueKeys(root, ""));
    const YAML::Node kind = root["kind"];
    if (kind.IsDefined() && kind.IsScalar() && !kind.Scalar().empty() &&
        kind.Scalar() != "Config") {
      return Error(
          "kind", kind,
          StrCat("is ", Quoted(kind.Scalar()), ", not \"Config\": this is not a kubeconfig file"));
    }
    Field current;
    CLUSTERPROF_RETURN_IF_ERROR(GetString(root, "current-context", "", &current));
    out->current_context = current.value;
    CLUSTERPROF_RETURN_IF_ERROR(
        DecodeList(root, "clusters", "cluster", &out->clusters,
                   [this](const YAML::Node& node, const std::string& at, ClusterEntry* entry) {
                     return DecodeCluster(node, at, entry);
                   }));
    CLUSTERPROF_RETURN_IF_ERROR(
        DecodeList(root, "users", "user", &out->users,
                   [this](const YAML::Node& node, const std::string& at, UserEntry* entry) {
                     return DecodeUser(node, at, entry);
                   }));
    return DecodeList(root, "contexts", "context", &out->contexts,
                      [this](const YAML::Node& node, const std::string& at, ContextEntry* entry) {
                        return DecodeContext(node, at, entry);
                      });
  }

 private:
  std::string Where(std::string_view field, const YAML::Node& node) const {
    return StrCat("kubeconfig ", path_, ": ", field, MarkText(node));
  }

  absl::Status Error(std::string_view field, const YAML::Node& node,
                     std::string_view message) const {
    return absl::InvalidArgumentError(StrCat(Where(field, node), ": ", message));
  }

  static std::string Join(std::string_view prefix, std::string_view key) {
    return prefix.empty() ? std::string(key) : StrCat(prefix, ".", key);
  }

  // A key twice in one mapping is an error, as in client-go ("key already set in map"): a
  // lookup would silently take one of them.
  absl::Status CheckUniqueKeys(const YAML::Node& map, std::string_view prefix) const {
    std::map<std::string, std::string> seen;  // key -> where
    for (const auto& pair : map) {
      if (!pair.first.IsScalar()) continue;  // never looked up
      const std::string& key = pair.first.Scalar();
      const std::string field = Join(prefix, key);
      auto [it, inserted] = seen.emplace(key, LineColumn(pair.first.Mark()));
      if (!inserted) {
        return Error(field, pair.first,
                     it->second.empty() ? "is set twice"
                                        : StrCat("is set twice (first at ", it->second, ")"));
      }
    }
    return absl::OkStatus();
  }

  // A string field of the mapping `map` (prefix names it); null or absent leaves it unset.
  absl::Status GetString(const YAML::Node& map, std::string_view key, std::string_view prefix,
                         Field* out) const {
    const YAML::Node node = map[std::string(key)];
    if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
    const std::string field = Join(prefix, key);
    if (!node.IsScalar()) return Error(field, node, "must be a string, not a list or mapping");
    out->value = node.Scalar();
    out->where = Where(field, node);
    return absl::OkStatus();
  }

  absl::Status GetBool(const YAML::Node& map, std::string_view key, std::string_view prefix,
                       bool* out) const {
    const YAML::Node node = map[std::string(key)];
    if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
    if (!node.IsScalar() || !YAML::convert<bool>::decode(node, *out)) {
      return Error(Join(prefix, key), node, "must be true or false");
    }
    return absl::OkStatus();
  }

  absl::Status GetStringList(const YAML::Node& node, const std::string& field,
                             std::vector<std::string>* out) const {
    if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
    if (!node.IsSequence()) return Error(field, node, "must be a list of strings");
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node item = node[i];
      if (!item.IsScalar()) {
        return Error(StrCat(field, "[", i, "]"), item, "must be a string");
      }
      out->push_back(item.Scalar());
    }
    return absl::OkStatus();
  }

  // A base64 field holding PEM data, decoded into `out`.
  absl::Status GetPemData(const YAML::Node& map, std::string_view key, std::string_view prefix,
                          Field* out) const {
    CLUSTERPROF_RETURN_IF_ERROR(GetString(map, key, prefix, out));
    if (!out->set()) return absl::OkStatus();
    // Go's decoder skips line breaks; people also paste the base64 folded with spaces.
    std::string compact;
    for (char c : out->value) {
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') compact.push_back(c);
    }
    std::string decoded;
    if (!absl::Base64Unescape(AbslView(compact), &decoded)) {
      return absl::InvalidArgumentError(
          StrCat(out->where, ": not valid base64 (", key, " holds the base64 of a PEM file, ",
                 "as from `base64 -w0 file.pem`; a path belongs in ",
                 key.substr(0, key.size() - std::string_view("-data").size()), ")"));
    }
    if (!LooksLikePem(decoded)) {
      return absl::InvalidArgumentError(
          StrCat(out->where,
                 ": the base64 does not decode to PEM data (no -----BEGIN line); it must be the "
                 "base64 of a PEM file, as from `base64 -w0 file.pem`"));
    }
    out->value = std::move(decoded);
    return absl::OkStatus();
  }

  // A file reference, resolved against this file's directory.
  absl::Status GetPath(const YAML::Node& map, std::string_view key, std::string_view prefix,
                       Field* out) const {
    CLUSTERPROF_RETURN_IF_ERROR(GetString(map, key, prefix, out));
    out->value = ResolveAgainst(path_, out->value);
    return absl::OkStatus();
  }

  // `list_key` is a list of {name: ..., `item_key`: {...}}; decodes each body with `decode`.
  // The first definition of a name in the merge wins; a name twice in one file is an error
  // (client-go refuses it too).
  template <typename Entry, typename DecodeFn>
  absl::Status DecodeList(const YAML::Node& root, const std::string& list_key,
                          const std::string& item_key, std::map<std::string, Entry>* out,
                          DecodeFn decode) {
    const YAML::Node list = root[list_key];
    if (!list.IsDefined() || list.IsNull()) return absl::OkStatus();
    if (!list.IsSequence()) {
      return Error(list_key, list,
                   StrCat("must be a list of {name: ..., ", item_key, ": {...}} entries"));
    }
    std::map<std::string, size_t> seen;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = StrCat(list_key, "[", i, "]");
      const YAML::Node item = list[i];
      if (!item.IsMap()) {
        return Error(at, item, StrCat("must be a mapping with name and ", item_key));
      }
      CLUSTERPROF_RETURN_IF_ERROR(CheckUniqueKeys(item, at));
      Field name;
      CLUSTERPROF_RETURN_IF_ERROR(GetString(item, "name", at, &name));
      if (!name.set()) return Error(at, item, "has no name");
      if (auto [it, inserted] = seen.emplace(name.value, i); !inserted) {
        return absl::InvalidArgumentError(StrCat(name.where, ": the name ", Quoted(name.value),
                                                 " is also used by ", list_key, "[", it->second,
                                                 "]; names must be unique within a file"));
      }
      const YAML::Node body = item[item_key];
      const std::string body_at = StrCat(at, ".", item_key);
      Entry entry;
      entry.file = path_;
      entry.where = Where(at, item);
      if (body.IsDefined() && !body.IsNull()) {
        if (!body.IsMap()) return Error(body_at, body, "must be a mapping");
        CLUSTERPROF_RETURN_IF_ERROR(CheckUniqueKeys(body, body_at));
        CLUSTERPROF_RETURN_IF_ERROR(decode(body, body_at, &entry));
      }
      out->emplace(name.value, std::move(entry));
    }
    return absl::OkStatus();
  }

  absl::Status DecodeCluster(const YAML::Node& node, const std::string& at, ClusterEntry* entry) {
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "server", at, &entry->server));
    CLUSTERPROF_RETURN_IF_ERROR(
        GetPemData(node, "certificate-authority-data", at, &entry->ca_data));
    CLUSTERPROF_RETURN_IF_ERROR(GetPath(node, "certificate-authority", at, &entry->ca_file));
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "tls-server-name", at, &entry->tls_server_name));
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "proxy-url", at, &entry->proxy_url));
    bool insecure = false;
    CLUSTERPROF_RETURN_IF_ERROR(GetBool(node, "insecure-skip-tls-verify", at, &insecure));
    if (insecure) {
      entry->insecure_skip_tls_verify = {
          "true", Where(Join(at, "insecure-skip-tls-verify"), node["insecure-skip-tls-verify"])};
    }
    CLUSTERPROF_RETURN_IF_ERROR(DecodeExtensions(node, at, entry));
    return GetBool(node, "disable-compression", at, &entry->disable_compression);
  }

  absl::Status DecodeUser(const YAML::Node& node, const std::string& at, UserEntry* entry) {
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "token", at, &entry->token));
    CLUSTERPROF_RETURN_IF_ERROR(GetPath(node, "tokenFile", at, &entry->token_file));
    CLUSTERPROF_RETURN_IF_ERROR(GetPemData(node, "client-certificate-data", at, &entry->cert_data));
    CLUSTERPROF_RETURN_IF_ERROR(GetPath(node, "client-certificate", at, &entry->cert_file));
    CLUSTERPROF_RETURN_IF_ERROR(GetPemData(node, "client-key-data", at, &entry->key_data));
    CLUSTERPROF_RETURN_IF_ERROR(GetPath(node, "client-key", at, &entry->key_file));
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "username", at, &entry->username));
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "password", at, &entry->password));
    Impersonation& as = entry->impersonate;
    Field user;
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "as", at, &user));
    as.user = user.value;
    Field uid;
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "as-uid", at, &uid));
    as.uid = uid.value;
    CLUSTERPROF_RETURN_IF_ERROR(
        GetStringList(node["as-groups"], Join(at, "as-groups"), &as.groups));
    const YAML::Node extra = node["as-user-extra"];
    if (extra.IsDefined() && !extra.IsNull()) {
      const std::string extra_at = Join(at, "as-user-extra");
      if (!extra.IsMap()) return Error(extra_at, extra, "must be a mapping of key: [values]");
      CLUSTERPROF_RETURN_IF_ERROR(CheckUniqueKeys(extra, extra_at));
      for (const auto& pair : extra) {
        if (!pair.first.IsScalar()) return Error(extra_at, pair.first, "keys must be strings");
        const std::string key = pair.first.Scalar();
        CLUSTERPROF_RETURN_IF_ERROR(
            GetStringList(pair.second, StrCat(extra_at, ".", key), &as.extra[key]));
      }
    }

    const YAML::Node exec = node["exec"];
    if (exec.IsDefined() && !exec.IsNull()) {
      CLUSTERPROF_RETURN_IF_ERROR(DecodeExec(exec, Join(at, "exec"), &entry->exec));
    }
    const YAML::Node provider = node["auth-provider"];
    if (provider.IsDefined() && !provider.IsNull()) {
      const std::string provider_at = Join(at, "auth-provider");
      if (!provider.IsMap()) return Error(provider_at, provider, "must be a mapping");
      CLUSTERPROF_RETURN_IF_ERROR(CheckUniqueKeys(provider, provider_at));
      Field name;
      CLUSTERPROF_RETURN_IF_ERROR(GetString(provider, "name", provider_at, &name));
      entry->auth_provider = {name.set() ? name.value : "(no name)", Where(provider_at, provider)};
    }
    return absl::OkStatus();
  }

  absl::Status DecodeExec(const YAML::Node& exec, const std::string& at, ExecEntry* entry) {
    if (!exec.IsMap()) return Error(at, exec, "must be a mapping");
    CLUSTERPROF_RETURN_IF_ERROR(CheckUniqueKeys(exec, at));
    entry->present = true;
    entry->where = Where(at, exec);
    CLUSTERPROF_RETURN_IF_ERROR(GetString(exec, "command", at, &entry->command));
    // As clientcmd: only a command with a '/' is a file reference; a bare name is for PATH.
    if (entry->command.value.find('/') != std::string::npos) {
      entry->command.value = ResolveAgainst(path_, entry->command.value);
    }
    CLUSTERPROF_RETURN_IF_ERROR(GetStringList(exec["args"], Join(at, "args"), &entry->args));
    const YAML::Node env = exec["env"];
    if (env.IsDefined() && !env.IsNull()) {
      const std::string env_at = Join(at, "env");
      if (!env.IsSequence()) return Error(env_at, env, "must be a list of {name: ..., value: ...}");
      for (size_t i = 0; i < env.size(); ++i) {
        const std::string item_at = StrCat(env_at, "[", i, "]");
        const YAML::Node item = env[i];
        if (!item.IsMap()) return Error(item_at, item, "must be a mapping with name and value");
        CLUSTERPROF_RETURN_IF_ERROR(CheckUniqueKeys(item, item_at));
        Field name;
        Field value;
        CLUSTERPROF_RETURN_IF_ERROR(GetString(item, "name", item_at, &name));
        CLUSTERPROF_RETURN_IF_ERROR(GetString(item, "value", item_at, &value));
        if (!name.set() || name.value.find('=') != std::string::npos) {
          return Error(item_at, item, "needs a name (without '=') for the variable");
        }
        entry->env.emplace_back(name.value, value.value);
      }
    }
    CLUSTERPROF_RETURN_IF_ERROR(GetString(exec, "apiVersion", at, &entry->api_version));
    CLUSTERPROF_RETURN_IF_ERROR(GetString(exec, "installHint", at, &entry->install_hint));
    CLUSTERPROF_RETURN_IF_ERROR(
        GetBool(exec, "provideClusterInfo", at, &entry->provide_cluster_info));
    return GetString(exec, "interactiveMode", at, &entry->interactive_mode);
  }

  // The cluster's `extensions` (a list of {name, extension}): the one an exec plugin gets as
  // spec.cluster.config, as JSON.
  absl::Status DecodeExtensions(const YAML::Node& node, const std::string& at,
                                ClusterEntry* entry) const {
    const YAML::Node extensions = node["extensions"];
    if (!extensions.IsDefined() || extensions.IsNull()) return absl::OkStatus();
    const std::string list_at = Join(at, "extensions");
    if (!extensions.IsSequence()) {
      return Error(list_at, extensions, "must be a list of {name: ..., extension: ...}");
    }
    for (size_t i = 0; i < extensions.size(); ++i) {
      const std::string item_at = StrCat(list_at, "[", i, "]");
      const YAML::Node item = extensions[i];
      if (!item.IsMap()) return Error(item_at, item, "must be a mapping with name and extension");
      Field name;
      CLUSTERPROF_RETURN_IF_ERROR(GetString(item, "name", item_at, &name));
      if (name.value != kExecClusterExtension) continue;
      const YAML::Node extension = item["extension"];
      if (extension.IsDefined() && !extension.IsNull()) {
        AppendYamlAsJson(extension, &entry->exec_extension_json);
      }
    }
    return absl::OkStatus();
  }

  absl::Status DecodeContext(const YAML::Node& node, const std::string& at, ContextEntry* entry) {
    Field cluster;
    Field user;
    Field namespace_;
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "cluster", at, &cluster));
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "user", at, &user));
    CLUSTERPROF_RETURN_IF_ERROR(GetString(node, "namespace", at, &namespace_));
    entry->cluster = cluster.value;
    entry->user = user.value;
    entry->namespace_ = namespace_.value;
    return absl::OkStatus();
  }

  const std::string path_;
};

// Parses and decodes one file's text; never throws.
absl::Status DecodeKubeconfig(std::string_view yaml, const std::string& path, Kubeconfig* out) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    const std::string position = LineColumn(e.mark);
    // yaml-cpp's depth limit reports "bad file".
    const bool too_deep = dynamic_cast<const YAML::DeepRecursion*>(&e) != nullptr;
    return absl::InvalidArgumentError(StrCat("kubeconfig ", path, ": not valid YAML",
                                             position.empty() ? "" : StrCat(" at ", position), ": ",
                                             too_deep ? "nested too deeply" : e.msg));
  }
  try {
    return FileDecoder(path).Decode(root, out);
  } catch (const YAML::Exception& e) {
    // The decoder checks each node's type before it reads it; this is the net under that.
    return absl::InvalidArgumentError(
        StrCat("kubeconfig ", path, ": unexpected structure: ", e.what()));
  }
}

// Adds `file` under `merged`: the first definition of each name, and the first current-context,
// win.
void Merge(Kubeconfig file, Kubeconfig* merged) {
  merged->files.insert(merged->files.end(), file.files.begin(), file.files.end());
  if (merged->current_context.empty()) merged->current_context = file.current_context;
  merged->clusters.merge(file.clusters);
  merged->users.merge(file.users);
  merged->contexts.merge(file.contexts);
}

// Reads a file a kubeconfig entry refers to; errors name the field.
absl::StatusOr<std::string> ReadReferencedFile(const Field& field, bool pem) {
  std::string contents;
  if (absl::Status status = ReadSmallFile(field.value, &contents); !status.ok()) {
    return absl::Status(status.code(), StrCat(field.where, ": ", status.message()));
  }
  if (pem && !LooksLikePem(contents)) {
    return absl::InvalidArgumentError(
        StrCat(field.where, ": ", field.value, " does not hold PEM data (no -----BEGIN line)"));
  }
  return contents;
}

// PEM from a `-data` field or a file field, at most one of them set.
absl::StatusOr<std::string> PemFromDataOrFile(const Field& data, const Field& file,
                                              std::string_view data_key,
                                              std::string_view file_key) {
  if (data.set() && file.set()) {
    return absl::InvalidArgumentError(
        StrCat(data.where, ": both ", data_key, " and ", file_key, " are set; keep one"));
  }
  if (data.set()) return data.value;
  if (file.set()) return ReadReferencedFile(file, /*pem=*/true);
  return std::string();
}

bool IsDigits(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

// What is wrong with the host[:port] of a server URL; empty when nothing is.
std::string AuthorityProblem(std::string_view authority) {
  if (authority.empty()) return "has no host";
  if (authority.find('@') != authority.npos) return "holds user information (user@host)";
  std::string_view host = authority;
  std::string_view port;
  if (host.front() == '[') {
    const size_t close = host.find(']');
    if (close == host.npos) return "has a '[' without ']' around an IPv6 address";
    std::string_view after = host.substr(close + 1);
    host = host.substr(1, close - 1);
    if (host.find_first_not_of("0123456789abcdefABCDEF:.%") != host.npos || host.empty()) {
      return "has an invalid IPv6 address in brackets";
    }
    if (!after.empty()) {
      if (!ConsumePrefix(&after, ":")) return "has characters after the ']' of its IPv6 address";
      port = after;
      if (port.empty()) return "has an empty port";
    }
  } else {
    const size_t colon = host.find(':');
    if (colon != host.npos) {
      if (host.find(':', colon + 1) != host.npos) return "has an IPv6 address without brackets";
      port = host.substr(colon + 1);
      host = host.substr(0, colon);
      if (port.empty()) return "has an empty port";
    }
    if (host.empty()) return "has no host";
    if (host.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") != host.npos) {
      return "has characters that are not allowed in a host name";
    }
  }
  if (!port.empty() && (!IsDigits(port) || port.size() > 5 || std::stoi(std::string(port)) == 0 ||
                        std::stoi(std::string(port)) > 65535)) {
    return "has a port that is not a number from 1 to 65535";
  }
  return "";
}

// "https://host:port[/path]" with no trailing slash; a server without a scheme gets https://.
absl::StatusOr<std::string> NormalizeServer(const Field& server) {
  std::string url = server.value;
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
      return absl::InvalidArgumentError(
          StrCat(server.where, ": ", Quoted(server.value), " holds spaces or control characters"));
    }
  }
  if (url.find("://") == std::string::npos) url = StrCat("https://", url);
  std::string_view rest = url;
  if (!ConsumePrefix(&rest, "https://") && !ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        StrCat(server.where, ": ", Quoted(server.value), " is not an http:// or https:// URL"));
  }
  if (const std::string problem = AuthorityProblem(rest.substr(0, rest.find_first_of("/?#")));
      !problem.empty()) {
    return absl::InvalidArgumentError(
        StrCat(server.where, ": the server URL ", Quoted(server.value), " ", problem));
  }
  while (url.back() == '/') url.pop_back();
  return url;
}

// Parses interactiveMode; empty is IfAvailable, which only v1beta1 allows (as client-go).
absl::StatusOr<ExecInteractiveMode> InteractiveModeOf(const ExecEntry& exec, std::string_view who) {
  const Field& mode = exec.interactive_mode;
  if (mode.value == "Never") return ExecInteractiveMode::kNever;
  if (mode.value == "IfAvailable") return ExecInteractiveMode::kIfAvailable;
  if (mode.value == "Always") return ExecInteractiveMode::kAlways;
  if (!mode.set()) {
    if (exec.api_version.value == kExecApiV1Beta1) return ExecInteractiveMode::kIfAvailable;
    return absl::InvalidArgumentError(
        StrCat(exec.where, ": ", who, " has an exec block of apiVersion ", kExecApiV1,
               " without interactiveMode, which that version requires; set interactiveMode: "
               "Never (or IfAvailable, or Always for a plugin that prompts the user)"));
  }
  return absl::InvalidArgumentError(
      StrCat(mode.where, ": ", Quoted(mode.value),
             " is not an interactiveMode; use Never, IfAvailable or Always"));
}

// The checked ExecConfig of `user`'s exec block, for the cluster `rest` describes.
absl::StatusOr<ExecConfig> ExecConfigOf(const ExecEntry& exec, const ClusterEntry& cluster,
                                        const RestConfig& rest, std::string_view who) {
  if (!exec.command.set()) {
    return absl::InvalidArgumentError(
        StrCat(exec.where, ": ", who,
               " has an exec block without a command (the credential plugin to run)"));
  }
  const Field& version = exec.api_version;
  if (!version.set()) {
    return absl::InvalidArgumentError(
        StrCat(exec.where, ": ", who, " has an exec block without apiVersion; set it to ",
               kExecApiV1, " (or ", kExecApiV1Beta1, " for plugins that predate it)"));
  }
  if (version.value != kExecApiV1 && version.value != kExecApiV1Beta1) {
    const bool alpha = version.value == "client.authentication.k8s.io/v1alpha1";
    return absl::InvalidArgumentError(StrCat(
        version.where, ": ", Quoted(version.value),
        alpha ? " is no longer supported (Kubernetes 1.24 removed it)"
              : " is not an exec credential apiVersion",
        "; use ", kExecApiV1, " or ", kExecApiV1Beta1, " (and a plugin version that speaks it)"));
  }
  ExecConfig config;
  config.command = exec.command.value;
  config.args = exec.args;
  config.env = exec.env;
  config.api_version = version.value;
  config.install_hint = exec.install_hint.value;
  CLUSTERPROF_ASSIGN_OR_RETURN(config.interactive_mode, InteractiveModeOf(exec, who));
  if (exec.provide_cluster_info) {
    ExecClusterInfo info;
    info.server = rest.server;
    info.tls_server_name = rest.tls_server_name;
    info.insecure_skip_tls_verify = rest.insecure_skip_tls_verify;
    info.ca_pem = rest.ca_pem;
    info.disable_compression = rest.disable_compression;
    info.config_json = cluster.exec_extension_json;
    config.cluster = std::move(info);
  }
  config.description =
      StrCat(exec.where, ": exec plugin ", Quoted(exec.command.value), " of ", who);
  return config;
}

// What to install instead of a legacy auth-provider, which client-go no longer has either.
std::string AuthProviderAdvice(std::string_view provider) {
  if (provider == "gcp") {
    return "Install gke-gcloud-auth-plugin (`gcloud components install gke-gcloud-auth-plugin`) "
           "and run `gcloud container clusters get-credentials CLUSTER`, which rewrites the "
           "user to run it as an exec plugin";
  }
  if (provider == "azure") {
    return "Install kubelogin (`az aks install-cli`) and run `kubelogin convert-kubeconfig -l "
           "azurecli`, which rewrites the user to run it as an exec plugin";
  }
  if (provider == "oidc") {
    return "Use an OIDC exec plugin instead, such as kubelogin (int128/kubelogin: "
           "`kubectl oidc-login setup`), configured as the user's exec block";
  }
  return "Replace it with the exec credential plugin your cluster's provider documents";
}

// The entries one context names, looked up.
struct SelectedContext {
  std::string name;
  const ContextEntry* context = nullptr;
  const ClusterEntry* cluster = nullptr;
  const UserEntry* user = nullptr;  // null: the context names no user
};

// `context_flag`, else the current context, with its cluster and user; an error names what is
// missing and what the kubeconfig has instead.
absl::StatusOr<SelectedContext> SelectContext(const Kubeconfig& config,
                                              std::string_view context_flag) {
  const std::string files = JoinPaths(config.files);
  const std::set<std::string> context_names = NamesOf(config.contexts);
  const std::string available = context_names.empty()
                                    ? "it defines no contexts"
                                    : StrCat("available contexts: ", QuotedList(context_names));
  SelectedContext selected;
  selected.name = context_flag.empty() ? config.current_context : std::string(context_flag);
  if (selected.name.empty()) {
    return absl::FailedPreconditionError(StrCat("kubeconfig ", files,
                                                " sets no current-context; choose a context "
                                                "with --context (",
                                                available, ")"));
  }
  auto context_it = config.contexts.find(selected.name);
  if (context_it == config.contexts.end()) {
    return absl::NotFoundError(StrCat("context ", Quoted(selected.name), " is not in kubeconfig ",
                                      files, " (", available, ")"));
  }
  const ContextEntry& context = context_it->second;
  selected.context = &context;
  if (context.cluster.empty()) {
    return absl::InvalidArgumentError(
        StrCat(context.where, ": context ", Quoted(selected.name), " names no cluster"));
  }
  auto cluster_it = config.clusters.find(context.cluster);
  if (cluster_it == config.clusters.end()) {
    const std::set<std::string> names = NamesOf(config.clusters);
    return absl::NotFoundError(StrCat(
        context.where, ": context ", Quoted(selected.name), " uses cluster ",
        Quoted(context.cluster), ", which is not in kubeconfig ", files, " (",
        names.empty() ? "it defines no clusters" : StrCat("clusters: ", QuotedList(names)), ")"));
  }
  selected.cluster = &cluster_it->second;
  if (!context.user.empty()) {
    auto user_it = config.users.find(context.user);
    if (user_it == config.users.end()) {
      const std::set<std::string> names = NamesOf(config.users);
      return absl::NotFoundError(StrCat(
          context.where, ": context ", Quoted(selected.name), " uses user ", Quoted(context.user),
          ", which is not in kubeconfig ", files, " (",
          names.empty() ? "it defines no users" : StrCat("users: ", QuotedList(names)), ")"));
    }
    selected.user = &user_it->second;
  }
  return selected;
}

// The server and how its certificate is checked.
absl::Status ApplyCluster(const ClusterEntry& cluster, const std::string& name, RestConfig* rest) {
  if (!cluster.server.set()) {
    return absl::InvalidArgumentError(StrCat(cluster.where, ": cluster ", Quoted(name),
                                             " has no server (cluster.server: https://host:port)"));
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(rest->server, NormalizeServer(cluster.server));
  if (cluster.proxy_url.set()) {
    return absl::UnimplementedError(
        StrCat(cluster.proxy_url.where, ": cluster ", Quoted(name),
               " is reached through a proxy, which clusterprof's Kubernetes client does not "
               "support; remove proxy-url and make the server directly reachable"));
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(
      rest->ca_pem, PemFromDataOrFile(cluster.ca_data, cluster.ca_file,
                                      "certificate-authority-data", "certificate-authority"));
  if (cluster.insecure_skip_tls_verify.set() && !rest->ca_pem.empty()) {
    return absl::InvalidArgumentError(
        StrCat(cluster.insecure_skip_tls_verify.where, ": cluster ", Quoted(name),
               " sets insecure-skip-tls-verify and a certificate authority; keep one"));
  }
  rest->insecure_skip_tls_verify = cluster.insecure_skip_tls_verify.set();
  rest->tls_server_name = cluster.tls_server_name.value;
  rest->disable_compression = cluster.disable_compression;
  return absl::OkStatus();
}

// The ways of authenticating that clusterprof refuses, each with what to use instead.
absl::Status RefuseUnsupportedAuth(const UserEntry& user, const std::string& who) {
  constexpr std::string_view kInstead =
      "Use a kubeconfig whose user has an exec credential plugin, a token (for example a "
      "service-account token from `kubectl create token`), a tokenFile or a client certificate, "
      "or run clusterprof in the cluster with a service account.";
  if (user.auth_provider.set()) {
    if (user.exec.present) {
      return absl::InvalidArgumentError(
          StrCat(user.auth_provider.where, ": ", who,
                 " has both an auth-provider and an exec block; keep only the exec block"));
    }
    return absl::UnimplementedError(
        StrCat(user.auth_provider.where, ": ", who, " gets its credentials from the auth-provider ",
               Quoted(user.auth_provider.value),
               ", which clusterprof does not support (client-go itself removed the gcp and azure "
               "providers in Kubernetes 1.26). ",
               AuthProviderAdvice(user.auth_provider.value), ". ", kInstead));
  }
  if (user.username.set() || user.password.set()) {
    const Field& field = user.username.set() ? user.username : user.password;
    return absl::UnimplementedError(
        StrCat(field.where, ": ", who,
               " uses basic authentication (username and password), which kube-apiserver "
               "no longer accepts (removed in Kubernetes 1.19). ",
               kInstead));
  }
  return absl::OkStatus();
}

// The client certificate and key, both or neither.
absl::Status ApplyClientCertificate(const UserEntry& user, const std::string& who,
                                    RestConfig* rest) {
  CLUSTERPROF_ASSIGN_OR_RETURN(rest->client_cert_pem,
                               PemFromDataOrFile(user.cert_data, user.cert_file,
                                                 "client-certificate-data", "client-certificate"));
  CLUSTERPROF_ASSIGN_OR_RETURN(
      rest->client_key_pem,
      PemFromDataOrFile(user.key_data, user.key_file, "client-key-data", "client-key"));
  if (rest->client_cert_pem.empty() != rest->client_key_pem.empty()) {
    const Field& set = rest->client_cert_pem.empty()
                           ? (user.key_data.set() ? user.key_data : user.key_file)
                           : (user.cert_data.set() ? user.cert_data : user.cert_file);
    return absl::InvalidArgumentError(
        StrCat(set.where, ": ", who, " has a client ",
               rest->client_cert_pem.empty() ? "key but no certificate" : "certificate but no key",
               "; set both client-certificate(-data) and client-key(-data)"));
  }
  return absl::OkStatus();
}

// The user's credentials: a client certificate, a token or token file, else an exec plugin (run
// now).
absl::Status ApplyUser(const UserEntry& user, const ClusterEntry& cluster, const std::string& who,
                       Clock* clock, const ExecOptions& exec_options, RestConfig* rest) {
  CLUSTERPROF_RETURN_IF_ERROR(RefuseUnsupportedAuth(user, who));
  CLUSTERPROF_RETURN_IF_ERROR(ApplyClientCertificate(user, who, rest));
  // As clientcmd: token before tokenFile.
  if (user.token.set()) {
    rest->token = StaticToken(user.token.value);
  } else if (user.token_file.set()) {
    rest->token = FileToken(user.token_file.value, clock);
    // Fail now, not at the first request, when the file cannot be read.
    if (absl::StatusOr<std::string> token = rest->token->Token(); !token.ok()) {
      return absl::Status(token.status().code(),
                          StrCat(user.token_file.where, ": ", token.status().message()));
    }
  }
  rest->impersonate = user.impersonate;
  // As client-go: a token or client certificate written in the kubeconfig wins, and the plugin
  // is not run at all.
  if (user.exec.present && rest->token == nullptr && rest->client_cert_pem.empty()) {
    CLUSTERPROF_ASSIGN_OR_RETURN(ExecConfig exec, ExecConfigOf(user.exec, cluster, *rest, who));
    auto source = std::make_shared<ExecTokenSource>(std::move(exec), exec_options, clock);
    // Run it now: a missing or failing plugin is reported at load, and client certificates
    // (which the TLS setup needs before any request) come only from this run.
    CLUSTERPROF_ASSIGN_OR_RETURN(ExecCredential credential, source->Credential());
    rest->client_cert_pem = std::move(credential.client_cert_pem);
    rest->client_key_pem = std::move(credential.client_key_pem);
    if (!credential.token.empty()) rest->token = std::move(source);
  }
  return absl::OkStatus();
}

absl::StatusOr<RestConfig> BuildConfig(const Kubeconfig& config, std::string_view context_flag,
                                       Clock* clock, const ExecOptions& exec_options) {
  CLUSTERPROF_CHECK(clock != nullptr);
  CLUSTERPROF_ASSIGN_OR_RETURN(const SelectedContext selected, SelectContext(config, context_flag));
  const ContextEntry& context = *selected.context;
  RestConfig rest;
  rest.description = StrCat("kubeconfig ", context.file, ", context ", Quoted(selected.name),
                            ", cluster ", Quoted(context.cluster), ", user ",
                            selected.user == nullptr ? "(none)" : Quoted(context.user));
  rest.namespace_ = context.namespace_.empty() ? "default" : context.namespace_;
  CLUSTERPROF_RETURN_IF_ERROR(ApplyCluster(*selected.cluster, context.cluster, &rest));
  if (selected.user == nullptr) return rest;
  const std::string who =
      StrCat("user ", Quoted(context.user), " (context ", Quoted(selected.name), ")");
  CLUSTERPROF_RETURN_IF_ERROR(
      ApplyUser(*selected.user, *selected.cluster, who, clock, exec_options, &rest));
  return rest;
}

// The service account "namespace/name" from the `sub` claim of a service-account JWT; empty
// when the token is not one.
std::string ServiceAccountOf(std::string_view token) {
  const size_t first_dot = token.find('.');
  if (first_dot == token.npos) return "";
  const size_t second_dot = token.find('.', first_dot + 1);
  if (second_dot == token.npos) return "";
  std::string payload;
  if (!absl::WebSafeBase64Unescape(
          AbslView(token.substr(first_dot + 1, second_dot - first_dot - 1)), &payload)) {
    return "";
  }
  constexpr std::string_view kPrefix = "system:serviceaccount:";
  const size_t start = payload.find(kPrefix);
  if (start == payload.npos) return "";
  const size_t end = payload.find('"', start);
  if (end == payload.npos) return "";
  std::string account = payload.substr(start + kPrefix.size(), end - start - kPrefix.size());
  const size_t colon = account.find(':');
  if (colon == account.npos) return "";
  account[colon] = '/';
  return account;
}

// The variable's value; empty when it is not set.
std::string EnvOrEmpty(const Environment& env, std::string_view name) {
  return env.Get(name).value_or("");
}

}  // namespace

absl::StatusOr<RestConfig> LoadInClusterConfig(const Environment& env, const InClusterPaths& paths,
                                               Clock* clock) {
  CLUSTERPROF_CHECK(clock != nullptr);
  const std::string host = EnvOrEmpty(env, "KUBERNETES_SERVICE_HOST");
  const std::string port = EnvOrEmpty(env, "KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    return absl::FailedPreconditionError(
        "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set "
        "(kubelet sets them in every pod); outside a cluster, use a kubeconfig");
  }
  RestConfig rest;
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  rest.server = ipv6 ? StrCat("https://[", host, "]:", port) : StrCat("https://", host, ":", port);
  rest.token = FileToken(paths.token_file, clock);
  absl::StatusOr<std::string> token = rest.token->Token();
  if (!token.ok()) {
    return Annotate(token.status(), "in-cluster config: the service account's token");
  }
  std::string ca;
  CLUSTERPROF_RETURN_IF_ERROR(
      Annotate(ReadSmallFile(paths.ca_file, &ca), "in-cluster config: the cluster's CA bundle"));
  if (!LooksLikePem(ca)) {
    return absl::InvalidArgumentError(StrCat("in-cluster config: the cluster's CA bundle ",
                                             paths.ca_file,
                                             " does not hold PEM data (no -----BEGIN line)"));
  }
  rest.ca_pem = std::move(ca);
  rest.namespace_ = EnvOrEmpty(env, "POD_NAMESPACE");
  if (rest.namespace_.empty()) {
    std::string contents;
    if (ReadSmallFile(paths.namespace_file, &contents).ok()) {
      rest.namespace_ = std::string(StripAsciiWhitespace(contents));
    }
  }
  if (rest.namespace_.empty()) rest.namespace_ = "default";
  const std::string account = ServiceAccountOf(*token);
  rest.description = account.empty()
                         ? StrCat("in-cluster (namespace ", Quoted(rest.namespace_), ")")
                         : StrCat("in-cluster (service account ", Quoted(account), ")");
  return rest;
}

absl::StatusOr<RestConfig> LoadKubeconfigFromString(std::string_view yaml, std::string_view path,
                                                    std::string_view context, Clock* clock,
                                                    const ExecOptions& exec) {
  Kubeconfig config;
  CLUSTERPROF_RETURN_IF_ERROR(DecodeKubeconfig(yaml, std::string(path), &config));
  return BuildConfig(config, context, clock, exec);
}

absl::StatusOr<RestConfig> LoadKubeconfig(const KubeconfigOptions& options, const Environment& env,
                                          Clock* clock) {
  std::vector<std::string> paths;
  bool skip_missing = false;
  if (!options.paths.empty()) {
    paths = options.paths;
  } else if (const std::string list = EnvOrEmpty(env, "KUBECONFIG"); !list.empty()) {
    skip_missing = true;
    std::set<std::string_view> seen;
    for (std::string_view path : SplitSkipEmpty(list, ':')) {
      if (seen.insert(path).second) paths.emplace_back(path);
    }
  } else {
    const std::string home = EnvOrEmpty(env, "HOME");
    if (home.empty()) {
      return absl::FailedPreconditionError(
          "no kubeconfig: neither KUBECONFIG nor HOME is set; pass --kubeconfig");
    }
    paths.push_back(StrCat(home, "/.kube/config"));
  }

  Kubeconfig merged;
  std::vector<std::string> missing;
  for (const std::string& path : paths) {
    std::string yaml;
    if (absl::Status status = ReadSmallFile(path, &yaml); !status.ok()) {
      if (skip_missing && absl::IsNotFound(status)) {
        missing.push_back(path);
        continue;
      }
      if (options.paths.empty() && absl::IsNotFound(status)) {
        return absl::NotFoundError(StrCat(
            "no kubeconfig: ", path,
            " does not exist and KUBECONFIG is not set; pass --kubeconfig, set KUBECONFIG, or "
            "run in a pod with a service account"));
      }
      return Annotate(status, StrCat("kubeconfig ", path));
    }
    Kubeconfig file;
    CLUSTERPROF_RETURN_IF_ERROR(DecodeKubeconfig(yaml, path, &file));
    Merge(std::move(file), &merged);
  }
  if (merged.files.empty()) {
    return absl::NotFoundError(
        StrCat("no kubeconfig: none of the files in KUBECONFIG exist (", JoinPaths(missing), ")"));
  }
  return BuildConfig(merged, options.context, clock, options.exec);
}

absl::StatusOr<RestConfig> LoadDefaultConfig(const KubeconfigOptions& options,
                                             const Environment& env,
                                             const InClusterPaths& in_cluster, Clock* clock) {
  if (options.paths.empty() && options.context.empty() &&
      !EnvOrEmpty(env, "KUBERNETES_SERVICE_HOST").empty() &&
      EnvOrEmpty(env, "KUBECONFIG").empty()) {
    return LoadInClusterConfig(env, in_cluster, clock);
  }
  return LoadKubeconfig(options, env, clock);
}

}  // namespace clusterprof::kube
