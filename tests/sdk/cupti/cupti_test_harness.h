// What the injection tests share: a real clusterprof-sidecar on loopback, a CUDA process with
// libclusterprof_cupti beside it, and a Profile request through the sidecar's gRPC API. Paths
// of the binaries come from the build, or from the environment (CLUSTERPROF_TEST_SIDECAR,
// CLUSTERPROF_TEST_CUPTI_LIBRARY, CLUSTERPROF_TEST_CUPTI_HOST, CLUSTERPROF_TEST_GPU_WORKLOAD)
// when the tests run from a copy of the build on another machine.
#ifndef CLUSTERPROF_TESTS_SDK_CUPTI_CUPTI_TEST_HARNESS_H_
#define CLUSTERPROF_TESTS_SDK_CUPTI_CUPTI_TEST_HARNESS_H_

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/base/strings.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof::testing {

inline std::string BinaryPath(const char* env, const char* built) {
  const char* value = std::getenv(env);
  return value != nullptr && *value != '\0' ? value : built;
}

// Whether this machine has a usable NVIDIA GPU (a driver that initializes and sees a device).
inline bool HaveGpu() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) return false;
  auto cu_init = reinterpret_cast<int (*)(unsigned)>(dlsym(driver, "cuInit"));
  auto count = reinterpret_cast<int (*)(int*)>(dlsym(driver, "cuDeviceGetCount"));
  int devices = 0;
  return cu_init != nullptr && count != nullptr && cu_init(0) == 0 && count(&devices) == 0 &&
         devices > 0;
}

// Waits until the file at `path` contains `text`; false on timeout.
inline bool WaitForText(const std::string& path, const std::string& text,
                        std::chrono::seconds timeout = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::ifstream in(path);
    const std::string content((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    if (content.find(text) != std::string::npos) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

class SidecarWithCudaProcess {
 public:
  explicit SidecarWithCudaProcess(const TempDir& root, std::vector<std::string> extra_flags = {})
      : root_(root), shm_dir_(root.Join("shm")), log_(root.Join("sidecar.log")) {
    const std::string port_file = root.Join("ports");
    std::vector<std::string> argv = {
        BinaryPath("CLUSTERPROF_TEST_SIDECAR", CLUSTERPROF_SIDECAR_PATH),
        "--port",
        "0",
        "--http-port",
        "-1",
        "--shm-dir",
        shm_dir_,
        "--port-file",
        port_file,
        "--host-name",
        "gpu-host",
        "--log-level",
        "debug"};
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    sidecar_ = std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{}, log_);
    port_ = ReadGrpcPort(port_file);
    EXPECT_NE(port_, 0) << "the sidecar did not start";
    channel_ = grpc::CreateChannel(StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials());
  }

  // Starts `argv` as a CUDA process of the pod: CLUSTERPROF_DIR and CUDA_INJECTION64_PATH set.
  // Returns the path of its output.
  std::string StartCudaProcess(std::vector<std::string> argv) {
    const std::string output = root_.Join(StrCat("cuda", processes_.size(), ".log"));
    processes_.push_back(std::make_unique<Subprocess>(
        std::move(argv),
        std::map<std::string, std::string>{{"CLUSTERPROF_DIR", shm_dir_},
                                           {"CUDA_INJECTION64_PATH", CuptiLibrary()}},
        output));
    return output;
  }

  static std::string CuptiLibrary() {
    return BinaryPath("CLUSTERPROF_TEST_CUPTI_LIBRARY", CLUSTERPROF_CUPTI_LIBRARY_PATH);
  }

  // A Profile that starts `delay_ms` from now, returning the XSpace.
  grpc::Status Profile(int64_t delay_ms, int64_t duration_ms, tensorflow::ProfileResponse* response,
                       uint32_t device_level = 1, bool nvtx = false) {
    tensorflow::ProfileRequest request;
    auto* opts = request.mutable_opts();
    opts->set_version(1);
    opts->set_host_tracer_level(2);
    opts->set_device_tracer_level(device_level);
    opts->set_duration_ms(duration_ms);
    opts->set_start_timestamp_ns(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count() +
                              delay_ms * 1'000'000));
    if (nvtx)
      (*opts->mutable_advanced_configuration())["gpu_enable_nvtx_tracking"].set_bool_value(true);
    request.set_session_id("gpu_run");
    request.set_emit_xspace(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    return tensorflow::ProfilerService::NewStub(channel_)->Profile(&context, request, response);
  }

  std::string Log() const { return ReadFileOrDie(log_); }
  const std::string& shm_dir() const { return shm_dir_; }

 private:
  const TempDir& root_;
  const std::string shm_dir_;
  const std::string log_;
  int port_ = 0;
  std::unique_ptr<Subprocess> sidecar_;
  std::vector<std::unique_ptr<Subprocess>> processes_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SDK_CUPTI_CUPTI_TEST_HARNESS_H_
