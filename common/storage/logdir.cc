#include "common/storage/logdir.h"

#include <filesystem>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/base/status.h"
#include "common/base/strings.h"

namespace clusterprof::storage {
namespace {

// Collapses "//" and "." components; rejects "..". `path` is absolute.
absl::StatusOr<std::string> NormalizeAbsolute(std::string_view path, std::string_view original) {
  std::string out;
  for (std::string_view part : SplitSkipEmpty(path, '/')) {
    if (part == ".") continue;
    if (part == "..") {
      return absl::InvalidArgumentError(StrCat(
          "logdir '", original, "' contains a '..' component; give the directory without it"));
    }
    StrAppend(&out, "/", part);
  }
  if (out.empty()) out = "/";
  return out;
}

// GCS bucket naming rules (the parts that matter for safety): 3-63 characters (222 with dots),
// lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit.
bool IsValidBucketName(std::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 222) return false;
  for (char c : bucket) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return absl::ascii_isalnum(bucket.front()) && absl::ascii_isalnum(bucket.back());
}

// The real path of `path`: symbolic links resolved in the longest part that exists, the rest
// appended as written.
std::string ResolveExisting(const std::string& path) {
  std::filesystem::path existing(path);
  std::filesystem::path rest;
  std::error_code ec;
  while (!existing.empty() && existing != existing.root_path() &&
         !std::filesystem::exists(existing, ec)) {
    rest = existing.filename() / rest;
    existing = existing.parent_path();
  }
  std::filesystem::path resolved = std::filesystem::canonical(existing, ec);
  if (ec) resolved = existing;
  if (!rest.empty()) resolved /= rest;
  std::string out = resolved.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

bool HasComponentPrefix(std::string_view path, std::string_view prefix) {
  if (prefix == "/") return StartsWith(path, "/");
  return path == prefix || (StartsWith(path, prefix) && path[prefix.size()] == '/');
}

}  // namespace

std::string Logdir::Join(std::string_view relative) const {
  if (uri.empty() || uri.back() == '/') return StrCat(uri, relative);
  return StrCat(uri, "/", relative);
}

Logdir Logdir::Below(std::string_view relative) const {
  Logdir below = *this;
  below.uri = Join(relative);
  if (kind == Kind::kGcs)
    below.prefix = prefix.empty() ? std::string(relative) : StrCat(prefix, "/", relative);
  return below;
}

std::optional<Logdir> Logdir::Above(std::string_view relative) const {
  std::string_view rest = uri;
  if (!ConsumeSuffix(&rest, relative) || !ConsumeSuffix(&rest, "/")) return std::nullopt;
  Logdir above = *this;
  if (kind == Kind::kGcs) {
    std::string_view prefix_rest = prefix;
    if (!ConsumeSuffix(&prefix_rest, relative)) return std::nullopt;
    ConsumeSuffix(&prefix_rest, "/");
    above.prefix = std::string(prefix_rest);
    above.uri = std::string(rest);
  } else {
    above.uri = rest.empty() ? "/" : std::string(rest);
  }
  return above;
}

absl::StatusOr<Logdir> ParseAbsoluteLogdir(std::string_view text) {
  // Leading whitespace is not stripped here: " gs://b" is not what a spec or request means.
  if (!text.empty() && !StartsWith(text, "gs://") && !StartsWith(text, "/") &&
      !StartsWith(text, "file:///")) {
    return absl::InvalidArgumentError(
        StrCat("\"", text, "\" is neither gs://bucket/prefix nor an absolute path (/... or ",
               "file:///...)"));
  }
  return ParseLogdir(text);
}

absl::StatusOr<Logdir> ParseLogdir(std::string_view text, std::string_view cwd) {
  const std::string_view original = text;
  text = StripAsciiWhitespace(text);
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "logdir is empty: give a directory (/data/tensorboard) or a bucket (gs://bucket/prefix)");
  }
  Logdir logdir;
  if (ConsumePrefix(&text, "gs://")) {
    logdir.kind = Logdir::Kind::kGcs;
    const size_t slash = text.find('/');
    logdir.bucket = std::string(text.substr(0, slash));
    if (!IsValidBucketName(logdir.bucket)) {
      return absl::InvalidArgumentError(
          StrCat("logdir '", original, "' has an invalid bucket name '", logdir.bucket,
                 "': bucket names are 3-63 lowercase letters, digits, '-', '_' or '.'"));
    }
    std::vector<std::string> parts;
    if (slash != std::string_view::npos) {
      for (std::string_view part : SplitSkipEmpty(text.substr(slash + 1), '/')) {
        if (part == "." || part == "..") {
          return absl::InvalidArgumentError(StrCat("logdir '", original, "' contains a '", part,
                                                   "' component, which GCS does not resolve"));
        }
        parts.emplace_back(part);
      }
    }
    logdir.prefix = absl::StrJoin(parts, "/");
    logdir.uri = logdir.prefix.empty() ? StrCat("gs://", logdir.bucket)
                                       : StrCat("gs://", logdir.bucket, "/", logdir.prefix);
    return logdir;
  }
  if (ConsumePrefix(&text, "file://")) {
    if (!StartsWith(text, "/")) {
      return absl::InvalidArgumentError(StrCat(
          "logdir '", original, "' is a file:// URI without an absolute path (use file:///dir)"));
    }
  } else if (const size_t scheme = text.find("://"); scheme != std::string_view::npos) {
    return absl::InvalidArgumentError(StrCat("logdir '", original, "' has an unsupported scheme '",
                                             text.substr(0, scheme),
                                             "': use a local path, file:// or gs://"));
  }
  std::string absolute;
  if (StartsWith(text, "/")) {
    absolute = std::string(text);
  } else {
    std::string base(cwd);
    if (base.empty()) {
      std::error_code ec;
      base = std::filesystem::current_path(ec).string();
      if (ec)
        return absl::InternalError(StrCat("cannot read the current directory: ", ec.message()));
    }
    absolute = StrCat(base, "/", text);
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(logdir.uri, NormalizeAbsolute(absolute, original));
  return logdir;
}

absl::Status ValidatePathComponent(std::string_view what, std::string_view value) {
  if (value.empty()) return absl::InvalidArgumentError(StrCat(what, " is empty"));
  if (value == "." || value == "..") {
    return absl::InvalidArgumentError(
        StrCat(what, " '", value, "' is not allowed: it would leave the run directory"));
  }
  if (value.size() > 255) {
    return absl::InvalidArgumentError(
        StrCat(what, " is ", value.size(), " bytes long; the limit is 255"));
  }
  for (unsigned char c : value) {
    if (c == '/' || c == '\\') {
      return absl::InvalidArgumentError(
          StrCat(what, " '", absl::CHexEscape(AbslView(value)),
                 "' contains a path separator; it must be a single path component"));
    }
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          StrCat(what, " '", absl::CHexEscape(AbslView(value)), "' contains a control character"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> HostFileStem(std::string_view host_name) {
  std::string stem(host_name);
  for (char& c : stem) {
    if (c == ':') c = '_';
  }
  CLUSTERPROF_RETURN_IF_ERROR(ValidatePathComponent("host name", stem));
  return stem;
}

absl::StatusOr<RunLayout> RunLayout::Create(Logdir logdir, std::string_view run) {
  CLUSTERPROF_RETURN_IF_ERROR(ValidatePathComponent("run name", run));
  return RunLayout(std::move(logdir), std::string(run));
}

absl::StatusOr<RunLayout> RunLayout::FromRepositoryRoot(const Logdir& repository_root,
                                                        std::string_view run) {
  std::optional<Logdir> logdir = repository_root.Above(kProfilePluginDir);
  if (!logdir) {
    return absl::InvalidArgumentError(
        StrCat("repository_root '", repository_root.uri, "' does not end in /", kProfilePluginDir,
               ": TensorBoard and XProf only find runs under <logdir>/", kProfilePluginDir));
  }
  if (logdir->kind == Logdir::Kind::kLocal && logdir->uri == "/") {
    return absl::InvalidArgumentError(
        StrCat("repository_root '", repository_root.uri,
               "' makes the file system's root the logdir; give a directory below it"));
  }
  return Create(*std::move(logdir), run);
}

std::string RunLayout::RepositoryRoot() const { return logdir_.Join(kProfilePluginDir); }

std::string RunLayout::RunDir() const { return StrCat(RepositoryRoot(), "/", run_); }

Logdir RunLayout::RunDirLogdir() const {
  return logdir_.Below(StrCat(kProfilePluginDir, "/", run_));
}

std::string RunLayout::XPlanePath(std::string_view host_stem) const {
  return StrCat(RunDir(), "/", host_stem, kXPlaneSuffix);
}

std::string RunLayout::TraceJsonPath(std::string_view host_stem) const {
  return StrCat(RunDir(), "/", host_stem, kTraceJsonSuffix);
}

std::string RunLayout::ManifestPath() const { return StrCat(RunDir(), "/", kManifestName); }

std::string DefaultRunName(int64_t wall_ns) {
  return absl::FormatTime("%Y_%m_%d_%H_%M_%S", absl::FromUnixNanos(wall_ns), absl::UTCTimeZone());
}

bool IsUnderPrefix(const Logdir& root, const Logdir& allowed) {
  if (root.kind != allowed.kind) return false;
  if (root.kind == Logdir::Kind::kGcs) return HasComponentPrefix(root.uri, allowed.uri);
  // The path must name the prefix itself (as configured, or as its real path): that is where the
  // files are then written from, walking down without leaving it (LocalStorageOptions::
  // write_roots). A path that reaches the prefix only through a link elsewhere is refused here,
  // before anything is captured.
  const std::string real_allowed = ResolveExisting(allowed.uri);
  if (!HasComponentPrefix(root.uri, allowed.uri) && !HasComponentPrefix(root.uri, real_allowed)) {
    return false;
  }
  return HasComponentPrefix(ResolveExisting(root.uri), real_allowed);
}

}  // namespace clusterprof::storage
