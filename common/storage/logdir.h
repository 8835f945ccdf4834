// Logdirs and the TensorBoard/XProf run layout inside them (docs/protocol.md, "Files that
// TensorBoard/XProf read"):
//
//   <logdir>/plugins/profile/<run>/<host>.xplane.pb
//   <logdir>/plugins/profile/<run>/<host>.trace.json.gz
//   <logdir>/plugins/profile/<run>/clusterprof_run.json
//
// Run and host names become path components, so they are checked here, once, for every writer.
#ifndef CLUSTERPROF_COMMON_STORAGE_LOGDIR_H_
#define CLUSTERPROF_COMMON_STORAGE_LOGDIR_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace clusterprof::storage {

// A parsed logdir: a local directory or a GCS bucket prefix.
struct Logdir {
  enum class Kind { kLocal, kGcs };
  Kind kind = Kind::kLocal;
  // kLocal: the absolute, normalized directory ("/data/tb"). kGcs: "gs://bucket/prefix" without
  // a trailing slash.
  std::string uri;
  // kGcs only.
  std::string bucket;
  std::string prefix;

  // `uri` joined with a relative path by '/'.
  std::string Join(std::string_view relative) const;
  // The logdir `relative` ('/'-separated components, none "." or "..") names below this one,
  // without parsing again.
  Logdir Below(std::string_view relative) const;
  // This logdir less a trailing `relative`; nullopt when it does not end in it.
  std::optional<Logdir> Above(std::string_view relative) const;
};

// Parses "/abs/path", "relative/path" (made absolute against `cwd`), "file:///abs/path" and
// "gs://bucket[/prefix]". Rejects empty strings, other schemes, bad bucket names and '..'
// components with an InvalidArgument error that quotes the input.
absl::StatusOr<Logdir> ParseLogdir(std::string_view text, std::string_view cwd = "");

// For a logdir that arrives from elsewhere (a ProfileJob's spec, a ProfileRequest's
// repository_root), where no working directory gives a relative path its meaning: as ParseLogdir,
// but anything other than gs://, an absolute path or file:/// is refused.
absl::StatusOr<Logdir> ParseAbsoluteLogdir(std::string_view text);

// Whether `root` (a parsed repository root) lies inside `allowed`. Local paths must name the
// prefix (as given, or as its real path), and compare whole components after resolving symbolic
// links of the parts that exist, so a link inside an allowed directory cannot lead out of it.
// This is the early check; the write itself stays beneath the prefix even if a link is swapped
// in afterwards (LocalStorageOptions::write_roots).
bool IsUnderPrefix(const Logdir& root, const Logdir& allowed);

// Checks that `value` can be a single path component: not empty, not "." or "..", at most 255
// bytes, and no '/', '\\', control characters or NUL. `what` names it in the error ("run name").
absl::Status ValidatePathComponent(std::string_view what, std::string_view value);

// The file stem XProf shows as the host: ':' replaced by '_' (as upstream does for
// "10.0.0.2:8466"), then validated as a path component.
absl::StatusOr<std::string> HostFileStem(std::string_view host_name);

inline constexpr std::string_view kProfilePluginDir = "plugins/profile";
inline constexpr std::string_view kXPlaneSuffix = ".xplane.pb";
inline constexpr std::string_view kTraceJsonSuffix = ".trace.json.gz";
inline constexpr std::string_view kManifestName = "clusterprof_run.json";
// The cross-host report of a run (docs/analysis.md), next to the manifest.
inline constexpr std::string_view kReportJsonName = "clusterprof_report.json";
inline constexpr std::string_view kReportHtmlName = "clusterprof_report.html";

// Where one run's files go.
class RunLayout {
 public:
  // Fails if `run` is not a safe path component.
  static absl::StatusOr<RunLayout> Create(Logdir logdir, std::string_view run);
  // For a repository_root as the profiler protocol sends it (<logdir>/plugins/profile).
  static absl::StatusOr<RunLayout> FromRepositoryRoot(const Logdir& repository_root,
                                                      std::string_view run);

  const Logdir& logdir() const { return logdir_; }
  const std::string& run() const { return run_; }
  // <logdir>/plugins/profile
  std::string RepositoryRoot() const;
  // <logdir>/plugins/profile/<run>
  std::string RunDir() const;
  // The same, as a logdir (to check against allowed prefixes).
  Logdir RunDirLogdir() const;
  // Paths for a host; `host_stem` must come from HostFileStem.
  std::string XPlanePath(std::string_view host_stem) const;
  std::string TraceJsonPath(std::string_view host_stem) const;
  std::string ManifestPath() const;

 private:
  RunLayout(Logdir logdir, std::string run) : logdir_(std::move(logdir)), run_(std::move(run)) {}
  Logdir logdir_;
  std::string run_;
};

// The default run name: the UTC instant formatted YYYY_MM_DD_HH_MM_SS, as upstream clients name
// sessions.
std::string DefaultRunName(int64_t wall_ns);

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_LOGDIR_H_
