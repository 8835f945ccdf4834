// kube-local-control-plane: a real kube-apiserver and etcd on loopback (the test support's
// KubeControlPlane) for `scripts/demo --kubernetes` and for trying the operator by hand. Writes
// an admin kubeconfig, prints "ready" on stdout, and runs until SIGINT or SIGTERM, then stops
// both processes and removes their files.
//
//   kube-local-control-plane --kubeconfig out/kubeconfig
#include <signal.h>

#include <iostream>

#include "CLI/CLI.hpp"
#include "tests/support/kube_control_plane.h"

int main(int argc, char** argv) {
  CLI::App app{"A kube-apiserver and etcd on 127.0.0.1 for local use (no nodes, no controllers)"};
  std::string kubeconfig;
  app.add_option("--kubeconfig", kubeconfig, "write an admin kubeconfig here")->required();
  CLI11_PARSE(app, argc, argv);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto plane = clusterprof::testing::KubeControlPlane::Start();
  if (!plane.ok()) {
    std::cerr << "kube-local-control-plane: " << plane.status().message() << "\n";
    return 1;
  }
  if (absl::Status written = (*plane)->WriteKubeconfig(kubeconfig, (*plane)->admin_token());
      !written.ok()) {
    std::cerr << "kube-local-control-plane: " << written.message() << "\n";
    return 1;
  }
  std::cout << "ready " << (*plane)->url() << std::endl;
  int signal = 0;
  sigwait(&signals, &signal);
  return 0;
}
