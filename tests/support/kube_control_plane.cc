#include "tests/support/kube_control_plane.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "cpprest/http_client.h"

namespace clusterprof::testing {
namespace {

constexpr char kInstallHint[] = "run scripts/install-kube-control-plane to install it";
constexpr auto kPollInterval = std::chrono::milliseconds(100);
constexpr auto kEtcdReadyTimeout = std::chrono::seconds(30);
constexpr auto kStopTimeout = std::chrono::seconds(10);
// Attempts at a process start that lost its port to another process between UnusedPort() and
// the bind.
constexpr int kPortAttempts = 3;

// The certificates and keys, made with `openssl` from this configuration.
constexpr char kOpensslConfig[] = R"([req]
distinguished_name = dn
prompt = no

[dn]
CN = clusterprof-test

[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash

[serving_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
)";

std::string GetEnv(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// The whole file, or empty when it cannot be read.
std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::Status WriteFile(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) return absl::InternalError(StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string Tail(const std::string& text, int lines) {
  size_t start = text.size();
  if (start > 0 && text[start - 1] == '\n') --start;
  for (int i = 0; i < lines && start > 0; ++i) {
    start = text.rfind('\n', start - 1);
    if (start == std::string::npos) return text;
  }
  return text.substr(start == 0 ? 0 : start + 1);
}

std::string Join(const std::vector<std::string>& argv) {
  std::string joined;
  for (const std::string& arg : argv) StrAppend(&joined, joined.empty() ? "" : " ", arg);
  return joined;
}

// 128 random bits in hex.
std::string RandomToken() {
  std::random_device random;
  std::string token;
  for (int i = 0; i < 4; ++i) {
    char buffer[9];
    std::snprintf(buffer, sizeof(buffer), "%08x", static_cast<unsigned>(random()));
    token += buffer;
  }
  return token;
}

// Orders versions such as "1.20.5+really1.20.2-1.1+deb12u10": digit runs compare as numbers,
// everything else character by character.
bool VersionLess(std::string_view a, std::string_view b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t end_a = i;
      size_t end_b = j;
      while (end_a < a.size() && std::isdigit(static_cast<unsigned char>(a[end_a]))) ++end_a;
      while (end_b < b.size() && std::isdigit(static_cast<unsigned char>(b[end_b]))) ++end_b;
      const std::string_view number_a = a.substr(i, end_a - i);
      const std::string_view number_b = b.substr(j, end_b - j);
      // Leading zeros do not occur in these versions; a longer number is the larger one.
      if (number_a.size() != number_b.size()) return number_a.size() < number_b.size();
      if (number_a != number_b) return number_a < number_b;
      i = end_a;
      j = end_b;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

std::string KubeCacheDir() {
  if (std::string dir = GetEnv("CLUSTERPROF_KUBE_CACHE"); !dir.empty()) return dir;
  if (std::string dir = GetEnv("XDG_CACHE_HOME"); !dir.empty()) return dir + "/clusterprof";
  return GetEnv("HOME") + "/.cache/clusterprof";
}

// GET `url`, verifying a TLS server against `ca_file` when set.
absl::StatusOr<HttpResponse> HttpGet(const std::string& url, const std::string& ca_file,
                                     const std::string& token, std::chrono::seconds timeout) {
  try {
    web::http::client::http_client_config config;
    config.set_timeout(timeout);
    if (!ca_file.empty()) {
      config.set_ssl_context_callback(
          [ca_file](boost::asio::ssl::context& context) { context.load_verify_file(ca_file); });
    }
    web::http::client::http_client client(url, config);
    web::http::http_request request(web::http::methods::GET);
    if (!token.empty()) request.headers().add("Authorization", "Bearer " + token);
    web::http::http_response response = client.request(request).get();
    HttpResponse result;
    result.status_code = response.status_code();
    result.body = response.extract_string(/*ignore_content_type=*/true).get();
    return result;
  } catch (const std::exception& e) {
    return absl::UnavailableError(StrCat("GET ", url, ": ", e.what()));
  }
}

// Whether something accepts TCP connections on 127.0.0.1:`port`. The readiness polls ask this
// before they send HTTP, so that a server still starting costs a refused connect() rather than
// an exception from the HTTP client.
bool Listening(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool connected =
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return connected;
}

bool PortTaken(const std::string& log) {
  return log.find("address already in use") != std::string::npos;
}

// Stops `process` with SIGTERM, then SIGKILL when it has not exited in kStopTimeout.
void Terminate(std::unique_ptr<Subprocess>& process) {
  if (process == nullptr) return;
  if (process->running()) {
    process->Signal(SIGTERM);
    if (!process->Wait(kStopTimeout).has_value()) process->Signal(SIGKILL);
  }
  process.reset();  // Kills and reaps what is left.
}

}  // namespace

absl::StatusOr<std::string> FindProgram(std::string_view name) {
  if (name.find('/') != std::string_view::npos) {
    std::string path(name);
    if (IsExecutableFile(path)) return path;
    return absl::NotFoundError(StrCat(path, " is not an executable file"));
  }
  const std::string path_variable = GetEnv("PATH");
  for (std::string_view dir : SplitSkipEmpty(path_variable, ':')) {
    std::string path = StrCat(dir, "/", name);
    if (IsExecutableFile(path)) return path;
  }
  return absl::NotFoundError(StrCat(name, " is not on PATH"));
}

absl::StatusOr<std::string> FindKubeApiserver() {
  if (std::string path = GetEnv("CLUSTERPROF_KUBE_APISERVER"); !path.empty()) {
    if (IsExecutableFile(path)) return path;
    return absl::FailedPreconditionError(
        StrCat("CLUSTERPROF_KUBE_APISERVER=", path, " is not an executable file"));
  }
  // kube-<source version>/kube-apiserver, as scripts/install-kube-control-plane installs it; the
  // newest version when there are several.
  const std::string cache = KubeCacheDir();
  std::string newest_version;
  std::string newest;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(cache, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::string_view version = name;
    if (!ConsumePrefix(&version, "kube-") || EndsWith(version, ".build")) continue;
    const std::string binary = it->path().string() + "/kube-apiserver";
    if (IsExecutableFile(binary) && (newest.empty() || VersionLess(newest_version, version))) {
      newest_version = std::string(version);
      newest = binary;
    }
  }
  if (!newest.empty()) return newest;
  if (absl::StatusOr<std::string> path = FindProgram("kube-apiserver"); path.ok()) return path;
  return absl::NotFoundError(
      StrCat("kube-apiserver is not installed (not in $CLUSTERPROF_KUBE_APISERVER, ", cache,
             "/kube-*/kube-apiserver or PATH); ", kInstallHint));
}

absl::StatusOr<std::string> FindEtcd() {
  if (std::string path = GetEnv("CLUSTERPROF_ETCD"); !path.empty()) {
    if (IsExecutableFile(path)) return path;
    return absl::FailedPreconditionError(
        StrCat("CLUSTERPROF_ETCD=", path, " is not an executable file"));
  }
  if (absl::StatusOr<std::string> path = FindProgram("etcd"); path.ok()) return path;
  if (IsExecutableFile("/usr/bin/etcd")) return std::string("/usr/bin/etcd");
  return absl::NotFoundError(StrCat(
      "etcd is not installed (not in $CLUSTERPROF_ETCD, PATH or /usr/bin/etcd); ", kInstallHint));
}

absl::StatusOr<CommandResult> RunCommand(std::vector<std::string> argv,
                                         std::chrono::seconds timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("RunCommand: empty command line");
  CLUSTERPROF_ASSIGN_OR_RETURN(argv[0], FindProgram(argv[0]));
  TempDir scratch;
  const std::string out_path = scratch.Join("stdout");
  const std::string err_path = scratch.Join("stderr");
  Subprocess process(argv, {}, out_path, err_path);
  const std::optional<int> status = process.Wait(timeout);
  CommandResult result;
  result.out = ReadFile(out_path);
  result.err = ReadFile(err_path);
  if (!status.has_value()) {
    return absl::DeadlineExceededError(StrCat("`", Join(argv), "` did not end in ", timeout.count(),
                                              " s; its stderr: ", result.err));
  }
  result.exit_code = WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  return result;
}

absl::StatusOr<std::unique_ptr<KubeControlPlane>> KubeControlPlane::Start(
    const KubeControlPlaneOptions& options) {
  std::string apiserver = options.apiserver_path;
  if (apiserver.empty()) {
    CLUSTERPROF_ASSIGN_OR_RETURN(apiserver, FindKubeApiserver());
  }
  std::string etcd = options.etcd_path;
  if (etcd.empty()) {
    CLUSTERPROF_ASSIGN_OR_RETURN(etcd, FindEtcd());
  }
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<KubeControlPlane> plane(new KubeControlPlane());
  CLUSTERPROF_RETURN_IF_ERROR(plane->GenerateCredentials());
  CLUSTERPROF_RETURN_IF_ERROR(plane->StartEtcd(etcd));
  CLUSTERPROF_RETURN_IF_ERROR(plane->StartApiserver(options, apiserver));
  const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  std::cerr << "kube control plane ready at " << plane->url() << " in " << elapsed.count()
            << " ms (logs in " << plane->dir() << ")\n";
  return plane;
}

KubeControlPlane::~KubeControlPlane() { Stop(); }

void KubeControlPlane::Stop() {
  // The API server first: it would log errors for every etcd request in the meantime.
  Terminate(apiserver_);
  Terminate(etcd_);
}

absl::Status KubeControlPlane::GenerateCredentials() {
  CLUSTERPROF_ASSIGN_OR_RETURN(const std::string openssl, FindProgram("openssl"));
  const std::string config = dir_.Join("openssl.cnf");
  CLUSTERPROF_RETURN_IF_ERROR(WriteFile(config, kOpensslConfig));
  ca_file_ = dir_.Join("ca.crt");
  const std::vector<std::vector<std::string>> commands = {
      {"req", "-x509", "-config", config, "-extensions", "ca_ext", "-newkey", "rsa:2048", "-nodes",
       "-keyout", dir_.Join("ca.key"), "-out", ca_file_, "-days", "7", "-subj",
       "/CN=clusterprof-test-ca"},
      {"req", "-new", "-config", config, "-newkey", "rsa:2048", "-nodes", "-keyout",
       dir_.Join("serving.key"), "-out", dir_.Join("serving.csr"), "-subj", "/CN=127.0.0.1"},
      {"x509", "-req", "-in", dir_.Join("serving.csr"), "-CA", ca_file_, "-CAkey",
       dir_.Join("ca.key"), "-set_serial", StrCat("0x", RandomToken()), "-days", "7", "-extfile",
       config, "-extensions", "serving_ext", "-out", dir_.Join("serving.crt")},
      {"genrsa", "-out", dir_.Join("service-account.key"), "2048"},
      {"rsa", "-in", dir_.Join("service-account.key"), "-pubout", "-out",
       dir_.Join("service-account.pub")},
  };
  for (const std::vector<std::string>& args : commands) {
    std::vector<std::string> argv = {openssl};
    argv.insert(argv.end(), args.begin(), args.end());
    CLUSTERPROF_ASSIGN_OR_RETURN(const CommandResult result, RunCommand(argv));
    if (result.exit_code != 0) {
      return absl::InternalError(
          StrCat("`", Join(argv), "` failed (exit code ", result.exit_code, "): ", result.err));
    }
  }
  admin_token_ = RandomToken();
  user_token_ = RandomToken();
  // token,user,uid,"groups"
  return WriteFile(dir_.Join("tokens.csv"),
                   StrCat(admin_token_, ",", kAdminUser, ",", kAdminUser, ",\"system:masters\"\n",
                          user_token_, ",", kUser, ",", kUser, "\n"));
}

absl::Status KubeControlPlane::StartEtcd(const std::string& etcd) {
  etcd_log_ = dir_.Join("etcd.log");
  for (int attempt = 1;; ++attempt) {
    const int client_port = UnusedPort();
    int peer_port = UnusedPort();
    while (peer_port == client_port) peer_port = UnusedPort();
    etcd_url_ = StrCat("http://127.0.0.1:", client_port);
    const std::string peer_url = StrCat("http://127.0.0.1:", peer_port);
    etcd_ = std::make_unique<Subprocess>(
        std::vector<std::string>{etcd, "--name=clusterprof-test",
                                 StrCat("--data-dir=", dir_.Join(StrCat("etcd-data-", attempt))),
                                 StrCat("--listen-client-urls=", etcd_url_),
                                 StrCat("--advertise-client-urls=", etcd_url_),
                                 StrCat("--listen-peer-urls=", peer_url),
                                 StrCat("--initial-advertise-peer-urls=", peer_url),
                                 StrCat("--initial-cluster=clusterprof-test=", peer_url),
                                 "--initial-cluster-state=new", "--logger=zap", "--log-level=warn"},
        std::map<std::string, std::string>{}, etcd_log_);
    const auto deadline = std::chrono::steady_clock::now() + kEtcdReadyTimeout;
    while (true) {
      if (!etcd_->running()) {
        const std::string log = ReadFile(etcd_log_);
        if (PortTaken(log) && attempt < kPortAttempts) break;
        return absl::InternalError(StrCat("etcd exited before it was ready; the end of its log (",
                                          etcd_log_, "):\n", Tail(log, 30)));
      }
      if (Listening(client_port)) {
        absl::StatusOr<HttpResponse> health =
            HttpGet(etcd_url_ + "/health", "", "", std::chrono::seconds(2));
        if (health.ok() && health->status_code == 200 &&
            health->body.find("\"true\"") != std::string::npos) {
          return absl::OkStatus();
        }
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(
            StrCat("etcd was not healthy at ", etcd_url_, " after ", kEtcdReadyTimeout.count(),
                   " s; the end of its log (", etcd_log_, "):\n", Tail(ReadFile(etcd_log_), 30)));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }
}

absl::Status KubeControlPlane::RestartApiserver() {
  if (apiserver_ != nullptr) {
    apiserver_->Signal(SIGKILL);
    apiserver_->Wait();
    apiserver_.reset();
  }
  return StartApiserver(options_, apiserver_path_, apiserver_port_);
}

absl::Status KubeControlPlane::StartApiserver(const KubeControlPlaneOptions& options,
                                              const std::string& apiserver, int fixed_port) {
  options_ = options;
  apiserver_path_ = apiserver;
  apiserver_log_ = dir_.Join("kube-apiserver.log");
  constexpr char kIssuer[] = "https://kubernetes.default.svc";
  for (int attempt = 1;; ++attempt) {
    const int port = fixed_port != 0 ? fixed_port : UnusedPort();
    apiserver_port_ = port;
    url_ = StrCat("https://127.0.0.1:", port);
    std::vector<std::string> argv = {
        apiserver,
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        StrCat("--secure-port=", port),
        StrCat("--etcd-servers=", etcd_url_),
        StrCat("--cert-dir=", dir_.Join("apiserver-certs")),
        StrCat("--tls-cert-file=", dir_.Join("serving.crt")),
        StrCat("--tls-private-key-file=", dir_.Join("serving.key")),
        StrCat("--client-ca-file=", ca_file_),
        StrCat("--token-auth-file=", dir_.Join("tokens.csv")),
        "--authorization-mode=RBAC",
        StrCat("--service-account-issuer=", kIssuer),
        StrCat("--service-account-key-file=", dir_.Join("service-account.pub")),
        StrCat("--service-account-signing-key-file=", dir_.Join("service-account.key")),
        StrCat("--api-audiences=", kIssuer),
        "--service-cluster-ip-range=10.0.0.0/24",
        "--allow-privileged=true",
        "--disable-admission-plugins=ServiceAccount",
    };
    argv.insert(argv.end(), options.extra_apiserver_flags.begin(),
                options.extra_apiserver_flags.end());
    apiserver_ =
        std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{}, apiserver_log_);
    const auto deadline = std::chrono::steady_clock::now() + options.ready_timeout;
    std::string last_answer = "no answer yet";
    while (true) {
      if (!apiserver_->running()) {
        const std::string log = ReadFile(apiserver_log_);
        if (PortTaken(log) && attempt < kPortAttempts) break;
        return absl::InternalError(StrCat("kube-apiserver (", apiserver,
                                          ") exited before it was ready; the end of its log (",
                                          apiserver_log_, "):\n", Tail(log, 40)));
      }
      if (Listening(port)) {
        absl::StatusOr<HttpResponse> ready = Get("/readyz", admin_token_, std::chrono::seconds(5));
        if (ready.ok() && ready->status_code == 200 && ready->body == "ok") {
          return absl::OkStatus();
        }
        last_answer = ready.ok() ? StrCat("HTTP ", ready->status_code, ": ", Tail(ready->body, 10))
                                 : std::string(StdView(ready.status().message()));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(
            StrCat("kube-apiserver at ", url_, " was not ready after ",
                   options.ready_timeout.count(), " s; the last /readyz answer: ", last_answer,
                   "\nthe end of its log (", apiserver_log_, "):\n", ApiserverLogTail()));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    Terminate(apiserver_);
    // The same port again: give the kernel a moment to let go of it.
    if (fixed_port != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

absl::Status KubeControlPlane::WriteKubeconfig(const std::string& path,
                                               const std::string& token) const {
  return WriteFile(path, StrCat("apiVersion: v1\n"
                                "kind: Config\n"
                                "clusters:\n"
                                "- name: clusterprof-test\n"
                                "  cluster:\n"
                                "    server: \"",
                                url_,
                                "\"\n"
                                "    certificate-authority: \"",
                                ca_file_,
                                "\"\n"
                                "users:\n"
                                "- name: clusterprof-test\n"
                                "  user:\n"
                                "    token: \"",
                                token,
                                "\"\n"
                                "contexts:\n"
                                "- name: clusterprof-test\n"
                                "  context:\n"
                                "    cluster: clusterprof-test\n"
                                "    user: clusterprof-test\n"
                                "current-context: clusterprof-test\n"));
}

absl::StatusOr<HttpResponse> KubeControlPlane::Get(const std::string& path,
                                                   const std::string& token,
                                                   std::chrono::seconds timeout) const {
  return HttpGet(url_ + path, ca_file_, token, timeout);
}

std::string KubeControlPlane::ApiserverLogTail(int lines) const {
  return Tail(ReadFile(apiserver_log_), lines);
}

}  // namespace clusterprof::testing
