#include "tests/chaos/world.h"

#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "grpcpp/grpcpp.h"
#include "operator/api/types.h"
#include "operator/kube/resource.h"
#include "tests/operator/crd_fixture.h"
#include "tests/support/local_http.h"

namespace clusterprof::chaos {

using testing::Subprocess;
using web::json::value;

namespace {

kube::RestConfig AdminConfig(const testing::KubeControlPlane& plane) {
  kube::RestConfig config;
  config.server = plane.url();
  config.ca_pem = testing::ReadFileOrDie(plane.ca_file());
  config.token = kube::StaticToken(plane.admin_token());
  config.description = "the chaos suite's control plane";
  return config;
}

kube::RestClientOptions Unlimited() {
  kube::RestClientOptions options;
  options.qps = 0;
  return options;
}

std::string Tail(const std::string& text, int lines) {
  size_t at = text.size();
  for (int i = 0; i <= lines && at != std::string::npos && at > 0; ++i) {
    at = text.rfind('\n', at - 1);
  }
  return at == std::string::npos ? text : text.substr(at + 1);
}

}  // namespace

// PhaseRecorder.

PhaseRecorder::PhaseRecorder(const testing::KubeControlPlane& plane, std::string ns)
    : plane_(plane), ns_(std::move(ns)), thread_([this] { Run(); }) {}

PhaseRecorder::~PhaseRecorder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (stream_ != nullptr) stream_->Cancel();
  }
  thread_.join();
}

std::vector<std::string> PhaseRecorder::Phases(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = phases_.find(job);
  return it == phases_.end() ? std::vector<std::string>{} : it->second;
}

bool PhaseRecorder::WaitForFinal(const std::string& job, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] {
    auto it = phases_.find(job);
    if (it == phases_.end()) return false;
    for (const std::string& phase : it->second) {
      if (phase == "Succeeded" || phase == "PartiallySucceeded" || phase == "Failed") return true;
    }
    return false;
  });
}

void PhaseRecorder::Record(const value& object) {
  if (!object.has_field("metadata") || !object.has_field("status")) return;
  const value& status = object.at("status");
  if (!status.has_string_field("phase")) return;
  const std::string name = object.at("metadata").at("name").as_string();
  const std::string phase = status.at("phase").as_string();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string>& seen = phases_[name];
  if (seen.empty() || seen.back() != phase) seen.push_back(phase);
  changed_.notify_all();
}

void PhaseRecorder::Run() {
  absl::StatusOr<std::unique_ptr<kube::RestClient>> client =
      kube::RestClient::Create(AdminConfig(plane_), &clock_, Unlimited());
  if (!client.ok()) {
    std::cerr << "chaos: the phase recorder has no client: " << client.status() << "\n";
    return;
  }
  auto pause = [this] {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; });
    return !stopping_;
  };
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    absl::StatusOr<kube::ObjectList> list = (*client)->List(api::ProfileJobs(), ns_);
    if (!list.ok()) {
      if (!pause()) return;
      continue;
    }
    for (const value& item : list->items) Record(item);
    kube::ListOptions options;
    options.resource_version = list->resource_version;
    options.timeout_seconds = 60;
    absl::StatusOr<std::unique_ptr<kube::WatchStream>> stream =
        (*client)->Watch(api::ProfileJobs(), ns_, options);
    if (!stream.ok()) {
      if (!pause()) return;
      continue;
    }
    kube::WatchStream* watch = stream->get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stream_ = *std::move(stream);
    }
    while (true) {
      absl::StatusOr<std::optional<kube::WatchEvent>> event = watch->Next();
      if (!event.ok() || !event->has_value()) break;
      if ((*event)->type == kube::WatchEvent::Type::kError) break;
      if ((*event)->type == kube::WatchEvent::Type::kAdded ||
          (*event)->type == kube::WatchEvent::Type::kModified) {
        Record((*event)->object);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    stream_.reset();
  }
}

// World.

absl::StatusOr<std::unique_ptr<World>> World::Start(WorldOptions options) {
  std::unique_ptr<World> world(new World(std::move(options)));
  CLUSTERPROF_RETURN_IF_ERROR(world->Setup());
  return world;
}

absl::Status World::Setup() {
  CLUSTERPROF_ASSIGN_OR_RETURN(plane_, testing::KubeControlPlane::Start());
  CLUSTERPROF_RETURN_IF_ERROR(
      testing::InstallCrds(*plane_, options_.source_dir, root_.Join("admin.kubeconfig")));
  CLUSTERPROF_ASSIGN_OR_RETURN(
      admin_, kube::RestClient::Create(AdminConfig(*plane_), &clock_, Unlimited()));
  value ns = value::object();
  ns["metadata"]["name"] = value::string(kNamespace);
  CLUSTERPROF_RETURN_IF_ERROR(admin_->Create(kube::Namespaces(), "", ns).status());
  recorder_ = std::make_unique<PhaseRecorder>(*plane_, kNamespace);

  CLUSTERPROF_ASSIGN_OR_RETURN(proxy_,
                               testing::KubeFaultProxy::Start(plane_->url(), plane_->ca_file()));
  proxy_kubeconfig_ = root_.Join("proxy.kubeconfig");
  testing::WriteFileOrDie(
      proxy_kubeconfig_,
      StrCat("apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: ",
             proxy_->url(), "\nusers:\n- name: admin\n  user:\n    token: ", plane_->admin_token(),
             "\ncontexts:\n- name: proxy\n  context: {cluster: proxy, user: admin}\n"
             "current-context: proxy\n"));

  CLUSTERPROF_ASSIGN_OR_RETURN(gcs_, testing::GcsTestServer::Start());
  gcs_->CreateBucket(kBucket);

  hosts_.resize(options_.hosts);
  for (int i = 0; i < options_.hosts; ++i) {
    Host& host = hosts_[i];
    host.name = StrCat("trainer-", i);
    host.shm_dir = root_.Join(StrCat("shm-", host.name));
    host.spool_dir = root_.Join(StrCat("spool-", host.name));
    host.heartbeat = root_.Join(StrCat("heartbeat-", host.name));
    host.port_file = root_.Join(StrCat("ports-", host.name));
    host.log = root_.Join(StrCat("host-", host.name, ".log"));
    std::filesystem::create_directories(host.spool_dir);
    if (i == options_.hosts - 1 && options_.small_spool_bytes > 0 && geteuid() == 0) {
      const std::string size = StrCat("size=", options_.small_spool_bytes);
      if (mount("tmpfs", host.spool_dir.c_str(), "tmpfs", 0, size.c_str()) == 0) {
        host.spool_on_tmpfs = true;
        tmpfs_mounts_.push_back(host.spool_dir);
      } else {
        std::cerr << "chaos: no tmpfs for " << host.spool_dir << ": " << std::strerror(errno)
                  << "\n";
      }
    }
    CLUSTERPROF_RETURN_IF_ERROR(StartSidecar(host));
    StartWorkload(host);
    CLUSTERPROF_RETURN_IF_ERROR(CreateRunningPod(host));
  }
  return absl::OkStatus();
}

World::~World() {
  StopOperators();
  for (Host& host : hosts_) {
    KillWorkload(host);
    KillSidecar(host);
  }
  recorder_.reset();
  for (const std::string& mount_point : tmpfs_mounts_) umount2(mount_point.c_str(), MNT_DETACH);
}

absl::Status World::StartSidecar(Host& host) {
  // A restart takes the ports of the first start back, as a restarted container would; the
  // kernel may hold them a moment after the kill.
  for (int attempt = 1;; ++attempt) {
    std::filesystem::remove(host.port_file);
    std::vector<std::string> argv = {
        options_.sidecar_path, "--port", std::to_string(host.grpc_port), "--http-port",
        std::to_string(host.http_port), "--address", "127.0.0.1", "--shm-dir", host.shm_dir,
        "--port-file", host.port_file, "--allowed-logdir", StrCat("gs://", kBucket), "--spool-dir",
        host.spool_dir, "--host-name", host.name,
        // Answers while uploads still go on, so that jobs end with
        // files pending under GCS faults (their own invariant).
        "--upload-wait-ms", "1500"};
    host.sidecar = std::make_unique<Subprocess>(
        argv, std::map<std::string, std::string>{{"STORAGE_EMULATOR_HOST", gcs_->endpoint()}},
        host.log);
    // Serving once both ports are in its port file; a sidecar that exits (its port still held)
    // is started again.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (host.sidecar->running() && std::chrono::steady_clock::now() < deadline) {
      std::map<std::string, int> ports = testing::ReadPortFile(host.port_file);
      if (ports["grpc"] != 0 && ports["http"] != 0) {
        host.grpc_port = ports["grpc"];
        host.http_port = ports["http"];
        return absl::OkStatus();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    host.sidecar.reset();
    if (attempt == 10) {
      return absl::InternalError(StrCat("sidecar ", host.name, " did not start; its log:\n",
                                        Tail(testing::ReadFileOrDie(host.log), 20)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

void World::KillSidecar(Host& host) {
  if (host.sidecar == nullptr) return;
  host.sidecar->Signal(SIGKILL);
  host.sidecar->Wait();
  host.sidecar.reset();
}

void World::StartWorkload(Host& host) {
  host.workload = std::make_unique<Subprocess>(
      std::vector<std::string>{options_.annotator_path, "--seconds", "1000000", "--heartbeat",
                               host.heartbeat},
      std::map<std::string, std::string>{{"CLUSTERPROF_DIR", host.shm_dir}}, host.log);
}

void World::KillWorkload(Host& host) {
  if (host.workload == nullptr) return;
  host.workload->Signal(SIGKILL);
  host.workload->Wait();
  host.workload.reset();
}

int64_t World::Heartbeat(const Host& host) {
  std::ifstream in(host.heartbeat);
  int64_t count = -1;
  if (!(in >> count)) return -1;
  return count;
}

double World::Captures(const Host& host, const std::string& outcome) {
  const std::string text = testing::HttpGet(host.http_port, "/metrics");
  if (text.empty()) return -1;
  return testing::MetricSum(text, "clusterprof_sidecar_captures_total",
                            outcome.empty() ? "" : StrCat("outcome=\"", outcome, "\""));
}

absl::StatusOr<v1alpha1::GetSessionResponse> World::GetSession(const Host& host,
                                                               const std::string& session) {
  auto stub = v1alpha1::Sidecar::NewStub(grpc::CreateChannel(StrCat("127.0.0.1:", host.grpc_port),
                                                             grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  v1alpha1::GetSessionRequest request;
  request.set_session_id(session);
  v1alpha1::GetSessionResponse response;
  grpc::Status status = stub->GetSession(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  return response;
}

void World::StartOperator(const std::string& identity, bool leader_elect) {
  OperatorProcess& op = operators_[identity];
  op.log = root_.Join(StrCat("operator-", identity, ".log"));
  std::vector<std::string> argv = {options_.operator_path,
                                   "--kubeconfig",
                                   proxy_kubeconfig_,
                                   "--namespace",
                                   kNamespace,
                                   "--health-port",
                                   "0",
                                   "--health-address",
                                   "127.0.0.1",
                                   "--log-format",
                                   "text",
                                   "--retry-backoff-ms",
                                   "300"};
  if (leader_elect) {
    argv.insert(argv.end(),
                {"--leader-elect", "--leader-election-namespace", kNamespace,
                 "--leader-election-identity", identity, "--lease-duration-seconds", "4",
                 "--renew-deadline-seconds", "3", "--retry-period-seconds", "0.5"});
  }
  op.process = std::make_unique<Subprocess>(
      argv, std::map<std::string, std::string>{{"STORAGE_EMULATOR_HOST", gcs_->endpoint()}},
      op.log);
}

void World::KillOperator(const std::string& identity) {
  auto it = operators_.find(identity);
  if (it == operators_.end()) return;
  it->second.process->Signal(SIGKILL);
  it->second.process->Wait();
  operators_.erase(it);
}

void World::StopOperators() {
  for (auto& [identity, op] : operators_) {
    op.process->Signal(SIGTERM);
    if (!op.process->Wait(std::chrono::seconds(20)).has_value()) op.process->Signal(SIGKILL);
  }
  operators_.clear();
}

std::vector<std::string> World::Operators() const {
  std::vector<std::string> identities;
  for (const auto& [identity, op] : operators_) identities.push_back(identity);
  return identities;
}

std::string World::Leader() {
  absl::StatusOr<value> lease = admin_->Get(kube::Leases(), kNamespace, "clusterprof-operator");
  if (!lease.ok() || !lease->has_field("spec") ||
      !lease->at("spec").has_string_field("holderIdentity")) {
    return "";
  }
  return lease->at("spec").at("holderIdentity").as_string();
}

int64_t World::OperatorRssKib(const std::string& identity) const {
  auto it = operators_.find(identity);
  if (it == operators_.end()) return 0;
  std::ifstream status(StrCat("/proc/", it->second.process->pid(), "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (StartsWith(line, "VmRSS:")) return std::atoll(line.c_str() + 6);
  }
  return 0;
}

std::string World::OperatorLogTail(const std::string& identity, int lines) const {
  return Tail(testing::ReadFileOrDie(root_.Join(StrCat("operator-", identity, ".log"))), lines);
}

void World::SaveLogs(const std::string& dir) const {
  std::filesystem::create_directories(dir);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root_.path())) {
    if (entry.path().extension() == ".log") {
      std::filesystem::copy_file(entry.path(), std::filesystem::path(dir) / entry.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing, error);
    }
  }
  std::filesystem::copy_file(plane_->apiserver_log(),
                             std::filesystem::path(dir) / "kube-apiserver.log",
                             std::filesystem::copy_options::overwrite_existing, error);
}

absl::Status World::CreateRunningPod(const Host& host) {
  value pod = value::object();
  pod["metadata"]["name"] = value::string(host.name);
  pod["metadata"]["labels"]["app"] = value::string("trainer");
  pod["metadata"]["annotations"]["clusterprof.io/port"] =
      value::string(std::to_string(host.grpc_port));
  pod["spec"]["nodeName"] = value::string("node-a");
  pod["spec"]["containers"][0]["name"] = value::string("trainer");
  pod["spec"]["containers"][0]["image"] = value::string("trainer:latest");
  CLUSTERPROF_ASSIGN_OR_RETURN(value created, admin_->Create(kube::Pods(), kNamespace, pod));
  value status = value::object();
  status["phase"] = value::string("Running");
  status["podIP"] = value::string("127.0.0.1");
  status["hostIP"] = value::string("127.0.0.1");
  status["conditions"][0]["type"] = value::string("Ready");
  status["conditions"][0]["status"] = value::string("True");
  created["status"] = status;
  return admin_->UpdateStatus(kube::Pods(), kNamespace, created).status();
}

absl::StatusOr<value> World::CreateJob(const std::string& name, const value& spec) {
  value job = value::object();
  job["metadata"]["name"] = value::string(name);
  job["spec"] = spec;
  return admin_->Create(api::ProfileJobs(), kNamespace, job);
}

absl::StatusOr<value> World::GetJob(const std::string& name) {
  return admin_->Get(api::ProfileJobs(), kNamespace, name);
}

absl::Status World::DeleteJob(const std::string& name) {
  absl::Status deleted = admin_->Delete(api::ProfileJobs(), kNamespace, name);
  return absl::IsNotFound(deleted) ? absl::OkStatus() : deleted;
}

}  // namespace clusterprof::chaos
