// clusterprof-sidecar assembled: tracers, sessions, the gRPC services and the health server.
#ifndef CLUSTERPROF_SIDECAR_SERVER_H_
#define CLUSTERPROF_SIDECAR_SERVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "sidecar/config.h"

namespace clusterprof::sidecar {

class SidecarServer {
 public:
  // Checks the config, starts the tracers and both servers. Errors say which setting is wrong.
  static absl::StatusOr<std::unique_ptr<SidecarServer>> Start(const SidecarConfig& config,
                                                              Clock& clock);
  // Shuts down (see Shutdown).
  ~SidecarServer();

  // Terminates a running capture (its files are still written), finishes in-flight RPCs within
  // a grace period and stops serving. Idempotent.
  void Shutdown();

  int grpc_port() const;
  // With TLS: the plaintext listener on loopback (the same as grpc_port() unless that was
  // asked as 0); 0 without TLS.
  int loopback_grpc_port() const;
  int http_port() const;  // -1 when off

 private:
  struct Impl;
  explicit SidecarServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Copies `source` into `dir` as shm::kInjectionLibraryFileName (mode 0755), through a temporary
// file and a rename, so a CUDA process starting meanwhile never loads half a library.
absl::Status InstallInjectionLibrary(const std::string& source, const std::string& dir);

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_SERVER_H_
