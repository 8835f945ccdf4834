#include "operator/kube/exec_credential.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/time/time.h"
#include "common/base/check.h"
#include "common/base/env.h"
#include "common/base/json_writer.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "cpprest/json.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace clusterprof::kube {
namespace {

constexpr char kExecInfoEnv[] = "KUBERNETES_EXEC_INFO";
constexpr char kPluginDocs[] =
    "https://kubernetes.io/docs/reference/access-authn-authz/authentication/"
    "#client-go-credential-plugins";
// An ExecCredential is a few KiB (a certificate chain at most); more is not one.
constexpr size_t kMaxStdoutBytes = 1 << 20;
// What is kept of the plugin's stderr (its end), and how much of that an error message quotes.
constexpr size_t kMaxStderrBytes = 64 << 10;
constexpr size_t kQuotedStderrBytes = 2000;
// How often the plugin is checked for its exit while its output stays open, and how long a pipe
// may stay silent after the exit before it is given up.
constexpr int kExitPollMs = 50;
// ... and once it has closed its output (it is about to exit).
constexpr int kClosedExitPollMs = 2;
constexpr int kExitedDrainMs = 20;

std::string Quoted(std::string_view s) { return StrCat("\"", s, "\""); }

bool StdinIsTerminal(const ExecOptions& options) {
  if (options.stdin_is_terminal) return options.stdin_is_terminal();
  return isatty(STDIN_FILENO) == 1;
}

// Whether the plugin gets the terminal; an error for interactiveMode Always without one.
absl::StatusOr<bool> Interactive(const ExecConfig& config, const ExecOptions& options) {
  switch (config.interactive_mode) {
    case ExecInteractiveMode::kNever:
      return false;
    case ExecInteractiveMode::kIfAvailable:
      return StdinIsTerminal(options);
    case ExecInteractiveMode::kAlways:
      if (!StdinIsTerminal(options)) {
        return absl::FailedPreconditionError(
            StrCat(config.description,
                   ": the plugin needs to interact with the user (interactiveMode: Always), but "
                   "standard input is not a terminal; run the command from a terminal, or set "
                   "interactiveMode: IfAvailable or Never if the plugin can work without one"));
      }
      return true;
  }
  return false;
}

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string NotInstalledAdvice(const ExecConfig& config) {
  if (!config.install_hint.empty()) {
    return StrCat(std::string(StripAsciiWhitespace(config.install_hint)),
                  " (client-go credential plugins: ", kPluginDocs, ")");
  }
  return StrCat("It is a client-go credential plugin that must be installed on this machine; see ",
                kPluginDocs);
}

// The program to run: the command itself when it holds a '/', else the first executable file
// of that name on the search path.
absl::StatusOr<std::string> ResolveCommand(const ExecConfig& config, const ExecOptions& options) {
  const std::string& command = config.command;
  if (command.find('/') != std::string::npos) {
    struct stat st;
    if (stat(command.c_str(), &st) != 0) {
      const int error = errno;
      return absl::NotFoundError(StrCat(config.description, ": the command ", command,
                                        " cannot be run: ", std::strerror(error), ". ",
                                        NotInstalledAdvice(config)));
    }
    if (!IsExecutableFile(command)) {
      return absl::FailedPreconditionError(
          StrCat(config.description, ": the command ", command,
                 " is not an executable file (is it missing chmod +x?)"));
    }
    return command;
  }
  const std::string path =
      options.search_path.has_value() ? *options.search_path : GetEnv("PATH").value_or("");
  for (std::string_view dir : SplitSkipEmpty(path, ':')) {
    std::string candidate = StrCat(dir, dir.ends_with('/') ? "" : "/", command);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(StrCat(config.description, ": the command ", Quoted(command),
                                    " was not found on PATH (", path.empty() ? "empty" : path,
                                    "). ", NotInstalledAdvice(config)));
}

// This process's environment, then the exec block's variables, then KUBERNETES_EXEC_INFO; a
// later variable replaces an earlier one of the same name.
std::vector<std::string> PluginEnvironment(const ExecConfig& config, std::string exec_info) {
  std::vector<std::pair<std::string, std::string>> added = config.env;
  added.emplace_back(kExecInfoEnv, std::move(exec_info));
  std::set<std::string, std::less<>> replaced;
  for (const auto& [name, unused] : added) replaced.insert(name);
  std::vector<std::string> out;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view variable = *entry;
    if (replaced.contains(variable.substr(0, variable.find('=')))) continue;
    out.emplace_back(variable);
  }
  // The last definition of a name in `added` wins.
  for (size_t i = 0; i < added.size(); ++i) {
    bool later = false;
    for (size_t j = i + 1; j < added.size(); ++j) later |= added[j].first == added[i].first;
    if (!later) out.push_back(StrCat(added[i].first, "=", added[i].second));
  }
  return out;
}

struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) close(fd);
  }
};

struct ProcessOutcome {
  int wait_status = 0;
  bool timed_out = false;
  std::string out;
  std::string err;  // the end of it, at most kMaxStderrBytes
  bool out_too_long = false;
};

// Spawns `program` with `argv` and `envp`: stdout to `out_fd`; unless `interactive`, stdin from
// /dev/null, stderr to `err_fd` and a process group of its own (a background group could not
// read the terminal). Nothing else of this process (sockets, files) reaches it.
absl::StatusOr<pid_t> Spawn(const std::string& program, const std::vector<std::string>& argv,
                            const std::vector<std::string>& envp, bool interactive, int out_fd,
                            int err_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  struct SpawnCleanup {
    posix_spawn_file_actions_t* actions;
    posix_spawnattr_t* attributes;
    ~SpawnCleanup() {
      posix_spawn_file_actions_destroy(actions);
      posix_spawnattr_destroy(attributes);
    }
  } cleanup{&actions, &attributes};
  if (!interactive) {
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, err_fd, STDERR_FILENO);
  }
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (!interactive) {
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(&attributes, 0);
  }
  posix_spawnattr_setflags(&attributes, flags);
  sigset_t signals;
  sigemptyset(&signals);
  posix_spawnattr_setsigmask(&attributes, &signals);
  sigfillset(&signals);
  posix_spawnattr_setsigdefault(&attributes, &signals);

  std::vector<char*> c_argv;
  c_argv.push_back(const_cast<char*>(program.c_str()));
  for (const std::string& arg : argv) c_argv.push_back(const_cast<char*>(arg.c_str()));
  c_argv.push_back(nullptr);
  std::vector<char*> c_envp;
  for (const std::string& variable : envp) c_envp.push_back(const_cast<char*>(variable.c_str()));
  c_envp.push_back(nullptr);
  pid_t pid = -1;
  if (const int error =
          posix_spawn(&pid, program.c_str(), &actions, &attributes, c_argv.data(), c_envp.data());
      error != 0) {
    return ErrnoToStatus(error, "run", program);
  }
  return pid;
}

// One read of the child's stdout (`is_out`) or stderr into `outcome`; the pipe is closed at EOF,
// and stdout also when it passes kMaxStdoutBytes (the plugin gets EPIPE if it writes on). Of
// stderr only the last kMaxStderrBytes are kept.
void ReadFromChild(bool is_out, FdCloser& pipe, ProcessOutcome& outcome) {
  char buffer[16384];
  const ssize_t n = read(pipe.fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    close(pipe.fd);
    pipe.fd = -1;
    return;
  }
  if (is_out) {
    if (outcome.out.size() + static_cast<size_t>(n) > kMaxStdoutBytes) {
      outcome.out_too_long = true;
      close(pipe.fd);
      pipe.fd = -1;
      return;
    }
    outcome.out.append(buffer, static_cast<size_t>(n));
    return;
  }
  outcome.err.append(buffer, static_cast<size_t>(n));
  if (outcome.err.size() > kMaxStderrBytes) {
    outcome.err.erase(0, outcome.err.size() - kMaxStderrBytes);
  }
}

// Starts `program` with `argv` and `envp`, stdout (and stderr unless `interactive`) into pipes,
// and reads them until the child has exited and closed them; kills it at `deadline_ns`
// (monotonic, on the system clock: a plugin runs in real time whatever clock the caller keeps;
// 0: no deadline). The child runs in a process group of its own unless interactive, so that a
// kill reaches what it started too.
absl::StatusOr<ProcessOutcome> RunProcess(const std::string& program,
                                          const std::vector<std::string>& argv,
                                          const std::vector<std::string>& envp, bool interactive,
                                          int64_t deadline_ns) {
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe", program);
  FdCloser out_read{out_pipe[0]};
  FdCloser out_write{out_pipe[1]};
  int err_pipe[2] = {-1, -1};
  if (!interactive && pipe2(err_pipe, O_CLOEXEC) != 0) {
    return ErrnoToStatus(errno, "pipe", program);
  }
  FdCloser err_read{err_pipe[0]};
  FdCloser err_write{err_pipe[1]};
  CLUSTERPROF_ASSIGN_OR_RETURN(const pid_t pid,
                               Spawn(program, argv, envp, interactive, out_write.fd, err_write.fd));
  // The child holds the write ends now; EOF comes when it (and what it started) closes them.
  close(out_write.fd);
  out_write.fd = -1;
  if (err_write.fd >= 0) {
    close(err_write.fd);
    err_write.fd = -1;
  }

  Clock& clock = SystemClock();
  ProcessOutcome outcome;
  // Milliseconds to the deadline, at most `cap`; 0 once it has passed.
  const auto wait_ms = [&](int cap) -> int {
    if (deadline_ns == 0) return cap;
    const int64_t left = deadline_ns - clock.MonotonicNs();
    if (left <= 0) return 0;
    return static_cast<int>(std::min<int64_t>((left + kNanosPerMilli - 1) / kNanosPerMilli, cap));
  };
  const auto kill_child = [&] {
    kill(interactive ? pid : -pid, SIGKILL);
    while (waitpid(pid, &outcome.wait_status, 0) < 0 && errno == EINTR) {
    }
  };
  bool exited = false;
  while (true) {
    if (!exited) {
      const pid_t done = waitpid(pid, &outcome.wait_status, WNOHANG);
      if (done == pid) {
        exited = true;
      } else if (done < 0 && errno != EINTR) {
        const int error = errno;
        kill_child();
        return ErrnoToStatus(error, "wait for", program);
      }
    }
    if (exited && out_read.fd < 0 && err_read.fd < 0) return outcome;
    // After the exit, what the plugin wrote is already in the pipes: a pipe that stays silent
    // is held open by something it started, and is not waited for.
    const bool closed = out_read.fd < 0 && err_read.fd < 0;
    const int timeout_ms =
        exited ? kExitedDrainMs : wait_ms(closed ? kClosedExitPollMs : kExitPollMs);
    if (timeout_ms == 0) {
      outcome.timed_out = true;
      kill_child();
      return outcome;
    }
    pollfd fds[2] = {{out_read.fd, POLLIN, 0}, {err_read.fd, POLLIN, 0}};
    const int ready = poll(fds, 2, timeout_ms);
    if (ready < 0 && errno != EINTR) {
      const int error = errno;
      if (!exited) kill_child();
      return ErrnoToStatus(error, "poll", program);
    }
    if (ready == 0 && exited) return outcome;
    for (int i = 0; ready > 0 && i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ReadFromChild(i == 0, i == 0 ? out_read : err_read, outcome);
    }
  }
}

// The end of the plugin's stderr for an error message: whitespace trimmed, cut to its last
// kQuotedStderrBytes.
std::string StderrExcerpt(std::string_view err) {
  std::string_view text = StripAsciiWhitespace(err);
  if (text.empty()) return "";
  if (text.size() <= kQuotedStderrBytes) return std::string(text);
  return StrCat("...", text.substr(text.size() - kQuotedStderrBytes));
}

absl::StatusOr<int64_t> ParseTimestamp(std::string_view text) {
  absl::Time time;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, AbslView(text), &time, &error)) {
    return absl::InvalidArgumentError(error);
  }
  return absl::ToUnixNanos(time);
}

// The ExecCredential the plugin printed. Nothing of the output is quoted in errors: it may hold
// the token.
absl::StatusOr<ExecCredential> ParseCredential(const ExecConfig& config, const std::string& out) {
  const auto bad = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        StrCat(config.description, ": ", what,
               "; the plugin must print an ExecCredential object (apiVersion ", config.api_version,
               ") with status.token, or status.clientCertificateData and "
               "status.clientKeyData"));
  };
  if (StripAsciiWhitespace(out).empty()) return bad("the plugin printed nothing");
  web::json::value json;
  try {
    std::error_code error;
    json = web::json::value::parse(out, error);
    if (error) return bad(StrCat("its output is not JSON (", error.message(), ")"));
  } catch (const std::exception& e) {
    return bad(StrCat("its output is not JSON (", e.what(), ")"));
  }
  if (!json.is_object()) return bad("its output is JSON but not an object");
  const auto string_field = [](const web::json::value& object,
                               const char* name) -> std::optional<std::string> {
    if (!object.has_field(name)) return std::nullopt;
    const web::json::value& value = object.at(name);
    if (!value.is_string()) return std::nullopt;
    return value.as_string();
  };
  const std::optional<std::string> api_version = string_field(json, "apiVersion");
  if (!api_version.has_value() || api_version->empty()) return bad("its output has no apiVersion");
  if (*api_version != config.api_version) {
    return absl::InvalidArgumentError(StrCat(
        config.description, ": the kubeconfig asks for apiVersion ", config.api_version,
        ", and the plugin answered with ", *api_version,
        "; set exec.apiVersion in the kubeconfig to the version the plugin speaks (or update "
        "the plugin)"));
  }
  if (const std::optional<std::string> kind = string_field(json, "kind");
      kind != "ExecCredential") {
    return bad(StrCat("its output has kind ", Quoted(kind.value_or("")), ", not ExecCredential"));
  }
  if (!json.has_field("status") || !json.at("status").is_object()) {
    return bad("its output has no status");
  }
  const web::json::value& status = json.at("status");
  for (const char* name : {"token", "clientCertificateData", "clientKeyData"}) {
    if (status.has_field(name) && !status.at(name).is_string() && !status.at(name).is_null()) {
      return bad(StrCat("status.", name, " is not a string"));
    }
  }
  ExecCredential credential;
  credential.token = string_field(status, "token").value_or("");
  credential.client_cert_pem = string_field(status, "clientCertificateData").value_or("");
  credential.client_key_pem = string_field(status, "clientKeyData").value_or("");
  if (credential.token.empty() && credential.client_cert_pem.empty() &&
      credential.client_key_pem.empty()) {
    return bad("its status has neither a token nor a client certificate and key");
  }
  if (credential.client_cert_pem.empty() != credential.client_key_pem.empty()) {
    return bad(StrCat("its status has a client ", credential.client_cert_pem.empty()
                                                      ? "key but no certificate"
                                                      : "certificate but no key"));
  }
  for (const std::string* pem : {&credential.client_cert_pem, &credential.client_key_pem}) {
    if (!pem->empty() && pem->find("-----BEGIN ") == std::string::npos) {
      return bad("status.clientCertificateData or clientKeyData is not PEM (no -----BEGIN line)");
    }
  }
  if (status.has_field("expirationTimestamp") && !status.at("expirationTimestamp").is_null()) {
    const std::optional<std::string> text = string_field(status, "expirationTimestamp");
    if (!text.has_value()) return bad("status.expirationTimestamp is not a string");
    absl::StatusOr<int64_t> expires = ParseTimestamp(*text);
    if (!expires.ok()) {
      return bad(StrCat("status.expirationTimestamp ", Quoted(*text),
                        " is not an RFC 3339 time such as 2030-01-02T15:04:05Z (",
                        expires.status().message(), ")"));
    }
    credential.expires_wall_ns = *expires;
  }
  return credential;
}

}  // namespace

std::string ExecInfoJson(const ExecConfig& config, bool interactive) {
  std::string out;
  JsonWriter json(&out);
  json.Open('{');
  json.Field("kind", "ExecCredential");
  json.Field("apiVersion", config.api_version);
  json.Key("spec");
  json.Open('{');
  if (config.cluster.has_value()) {
    const ExecClusterInfo& cluster = *config.cluster;
    json.Key("cluster");
    json.Open('{');
    json.Field("server", cluster.server);
    if (!cluster.tls_server_name.empty()) json.Field("tls-server-name", cluster.tls_server_name);
    if (cluster.insecure_skip_tls_verify) json.Field("insecure-skip-tls-verify", true);
    if (!cluster.ca_pem.empty()) {
      json.Field("certificate-authority-data", absl::Base64Escape(AbslView(cluster.ca_pem)));
    }
    if (cluster.disable_compression) json.Field("disable-compression", true);
    if (!cluster.config_json.empty()) {
      json.Key("config");
      out.append(cluster.config_json);
    }
    json.Close('}');
  }
  json.Field("interactive", interactive);
  json.Close('}');
  json.Close('}');
  return out;
}

absl::StatusOr<ExecCredential> RunExecPlugin(const ExecConfig& config, const ExecOptions& options) {
  if (!options.allow) {
    return absl::FailedPreconditionError(
        StrCat(config.description, ": exec credential plugins are turned off here"));
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(const bool interactive, Interactive(config, options));
  CLUSTERPROF_ASSIGN_OR_RETURN(const std::string program, ResolveCommand(config, options));
  const std::vector<std::string> envp =
      PluginEnvironment(config, ExecInfoJson(config, interactive));
  const int64_t deadline_ns =
      interactive ? 0 : SystemClock().MonotonicNs() + std::max<int64_t>(options.timeout_ns, 1);
  absl::StatusOr<ProcessOutcome> outcome =
      RunProcess(program, config.args, envp, interactive, deadline_ns);
  if (!outcome.ok()) return Annotate(outcome.status(), config.description);
  const std::string err = StderrExcerpt(outcome->err);
  const std::string said = err.empty() ? "" : StrCat("; it said: ", err);
  if (outcome->timed_out) {
    const int64_t timeout_ms = options.timeout_ns / kNanosPerMilli;
    return absl::DeadlineExceededError(
        StrCat(config.description, ": the plugin did not finish within ",
               timeout_ms % 1000 == 0 ? StrCat(timeout_ms / 1000, " s") : StrCat(timeout_ms, " ms"),
               " and was killed", said,
               ". If it waits for input (a login prompt), run the command from a terminal"));
  }
  const int wait_status = outcome->wait_status;
  if (WIFSIGNALED(wait_status)) {
    return absl::UnauthenticatedError(StrCat(config.description, ": the plugin was killed by ",
                                             strsignal(WTERMSIG(wait_status)), said));
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) != 0) {
    return absl::UnauthenticatedError(
        StrCat(config.description, ": the plugin failed (exit code ", WEXITSTATUS(wait_status), ")",
               err.empty() ? " and printed nothing on stderr" : said));
  }
  if (outcome->out_too_long) {
    return absl::InvalidArgumentError(StrCat(config.description, ": the plugin printed more than ",
                                             kMaxStdoutBytes,
                                             " bytes, which is no ExecCredential"));
  }
  absl::StatusOr<ExecCredential> credential = ParseCredential(config, outcome->out);
  // A plugin's notices (deprecations, "token refreshed") reach the user as kubectl shows them.
  if (credential.ok() && !err.empty()) spdlog::info("{}: {}", config.description, err);
  return credential;
}

ExecTokenSource::ExecTokenSource(ExecConfig config, ExecOptions options, Clock* clock)
    : config_(std::move(config)), options_(std::move(options)), clock_(clock) {
  CLUSTERPROF_CHECK(clock_ != nullptr);
}

absl::StatusOr<ExecCredential> ExecTokenSource::CredentialLocked() {
  if (cached_.has_value() &&
      (!cached_->expires_wall_ns.has_value() || clock_->WallNs() <= *cached_->expires_wall_ns)) {
    return *cached_;
  }
  cached_.reset();
  ++runs_;
  CLUSTERPROF_ASSIGN_OR_RETURN(ExecCredential credential, RunExecPlugin(config_, options_));
  cached_ = credential;
  return credential;
}

absl::StatusOr<ExecCredential> ExecTokenSource::Credential() {
  MutexLock lock(&mu_);
  return CredentialLocked();
}

absl::StatusOr<std::string> ExecTokenSource::Token() {
  MutexLock lock(&mu_);
  CLUSTERPROF_ASSIGN_OR_RETURN(ExecCredential credential, CredentialLocked());
  if (credential.token.empty()) {
    return absl::UnauthenticatedError(
        StrCat(config_.description,
               ": the plugin answered with a client certificate but no token, and a token is "
               "needed here"));
  }
  return credential.token;
}

void ExecTokenSource::Invalidate() {
  MutexLock lock(&mu_);
  cached_.reset();
}

int ExecTokenSource::runs() const {
  MutexLock lock(&mu_);
  return runs_;
}

}  // namespace clusterprof::kube
