// A pod's clusterprof-sidecar and annotating workload as local processes, for the end-to-end
// tests that run the operator against the test control plane: the pods exist in the API server,
// their sidecars run here on 127.0.0.1.
#ifndef CLUSTERPROF_TESTS_OPERATOR_LOCAL_HOST_H_
#define CLUSTERPROF_TESTS_OPERATOR_LOCAL_HOST_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/base/strings.h"
#include "gtest/gtest.h"
#include "tests/support/local_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::testing {

class LocalHost {
 public:
  // Starts `sidecar` (the clusterprof-sidecar binary) on free loopback ports, writing under
  // `logs`, with `extra_sidecar_args`; then `annotator` (an annotating workload) on its
  // shared-memory directory, or the command `workload` when given. Fails the test when the
  // sidecar does not come up.
  LocalHost(const TempDir& root, const std::string& name, const std::string& logs,
            const std::string& sidecar, const std::string& annotator,
            const std::vector<std::string>& extra_sidecar_args = {},
            std::vector<std::string> workload = {})
      : name_(name) {
    const std::string shm_dir = root.Join(StrCat("shm-", name));
    const std::string port_file = root.Join(StrCat("ports-", name));
    log_ = root.Join(StrCat("sidecar-", name, ".log"));
    std::vector<std::string> argv = {sidecar, "--port",      "0",         "--http-port",
                                     "0",     "--address",   "127.0.0.1", "--shm-dir",
                                     shm_dir, "--port-file", port_file,   "--allowed-logdir",
                                     logs,    "--host-name", name};
    argv.insert(argv.end(), extra_sidecar_args.begin(), extra_sidecar_args.end());
    sidecar_ = std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{}, log_);
    EXPECT_TRUE(WaitForFile(port_file)) << "sidecar " << name << " did not start:\n" << Log();
    // The port file is written whole once serving; read until both ports are in.
    for (int i = 0; i < 100 && (port_ == 0 || http_port_ == 0); ++i) {
      std::map<std::string, int> ports = ReadPortFile(port_file);
      port_ = ports["grpc"];
      http_port_ = ports["http"];
      if (port_ == 0 || http_port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_NE(port_, 0) << "sidecar " << name << " wrote no gRPC port:\n" << Log();
    if (workload.empty()) workload = {annotator, "--seconds", "600"};
    workload_ = std::make_unique<Subprocess>(
        workload, std::map<std::string, std::string>{{"CLUSTERPROF_DIR", shm_dir}}, log_);
  }

  const std::string& name() const { return name_; }
  int port() const { return port_; }
  // Captures the sidecar finished, by outcome label ("ok", "empty", ...; "" for all).
  double Captures(const std::string& outcome = "") const {
    return MetricSum(HttpGet(http_port_, "/metrics"), "clusterprof_sidecar_captures_total",
                     outcome.empty() ? "" : StrCat("outcome=\"", outcome, "\""));
  }
  std::string Log() const { return ReadFileOrDie(log_); }

 private:
  std::string name_;
  int port_ = 0;
  int http_port_ = 0;
  std::string log_;
  std::unique_ptr<Subprocess> sidecar_;
  std::unique_ptr<Subprocess> workload_;
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_OPERATOR_LOCAL_HOST_H_
