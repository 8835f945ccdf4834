// gcs-test-server: the GCS JSON API test server (tests/support/gcs_test_server.h) as a process,
// for benchmarks and demos. Listens on 127.0.0.1, writes its port to --port-file once listening,
// prints "ready http://127.0.0.1:PORT" on stdout, and runs until SIGINT or SIGTERM.
//
//   gcs-test-server --port-file /tmp/gcs.port --data-dir /tmp/gcs --bucket profiles
//   STORAGE_EMULATOR_HOST=http://127.0.0.1:$(cat /tmp/gcs.port) ...
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "tests/support/gcs_test_server.h"

int main(int argc, char** argv) {
  CLI::App app{"A Google Cloud Storage JSON API server on 127.0.0.1 for tests and benchmarks"};
  std::string address = "127.0.0.1";
  int port = 0;
  std::string port_file;
  std::string data_dir;
  std::vector<std::string> buckets;
  bool no_md5 = false;
  app.add_option("--address", address,
                 "IPv4 address to listen on (default 127.0.0.1; the node tests give the node's "
                 "address inside its network namespace)");
  app.add_option("--port", port, "port to listen on (0: a free one)")->check(CLI::Range(0, 65535));
  app.add_option("--port-file", port_file, "write the port here once listening");
  app.add_option("--data-dir", data_dir, "keep object bytes in files here (default: in memory)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--bucket", buckets, "create this bucket at start (repeatable)");
  app.add_flag("--no-md5", no_md5, "skip MD5 of uploads (objects then have no md5Hash)");
  bool discard_data = false;
  app.add_flag("--discard-data", discard_data,
               "keep only the size and hashes of uploads, not their bytes (for benchmarks of "
               "clients)");
  CLI11_PARSE(app, argc, argv);

  // Blocked before any thread starts, so that every thread inherits the mask and sigwait() below
  // receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  clusterprof::testing::GcsTestServer::Options options;
  options.address = address;
  options.port = port;
  options.data_dir = data_dir;
  options.compute_md5 = !no_md5;
  options.discard_data = discard_data;
  auto server = clusterprof::testing::GcsTestServer::Start(options);
  if (!server.ok()) {
    std::cerr << "gcs-test-server: " << server.status().message() << "\n";
    return 1;
  }
  for (const std::string& bucket : buckets) (*server)->CreateBucket(bucket);
  if (!port_file.empty()) {
    // Written to a temporary name and renamed, so that a reader never sees a partial port.
    const std::string temporary = port_file + ".tmp";
    FILE* file = std::fopen(temporary.c_str(), "w");
    if (file == nullptr || std::fprintf(file, "%d\n", (*server)->port()) < 0 ||
        std::fclose(file) != 0 || std::rename(temporary.c_str(), port_file.c_str()) != 0) {
      std::cerr << "gcs-test-server: cannot write the port to " << port_file << "\n";
      return 1;
    }
  }
  std::cout << "ready " << (*server)->endpoint() << std::endl;
  int received = 0;
  sigwait(&signals, &received);
  return 0;
}
