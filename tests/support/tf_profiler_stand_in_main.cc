// tf-profiler-stand-in: the TF/JAX profiler server stand-in of tests/support as a process, for
// tests that need one beside real sidecars and the CLI.
//
//   tf-profiler-stand-in --port-file FILE [--ignore-emit-xspace] [--answer-delay-ms N]
//                        [--padding-bytes N]
// Writes `grpc=<port>` to FILE once serving; runs until SIGTERM or SIGINT.
#include <signal.h>

#include <fstream>
#include <iostream>

#include "CLI/CLI.hpp"
#include "tests/support/tf_profiler_stand_in.h"

int main(int argc, char** argv) {
  CLI::App app{"A stand-in for the TF/JAX profiler server (tests/support/tf_profiler_stand_in.h)"};
  std::string port_file;
  clusterprof::testing::TfProfilerStandIn::Options options;
  app.add_option("--port-file", port_file, "Write grpc=<port> here once serving")->required();
  app.add_flag("--ignore-emit-xspace", options.ignore_emit_xspace,
               "Behave as an older server: always write the file, never return the XSpace");
  app.add_option("--answer-delay-ms", options.answer_delay_ms, "Answer this late");
  app.add_option("--padding-bytes", options.padding_bytes, "Pad the XSpace by this many bytes");
  CLI11_PARSE(app, argc, argv);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto server = clusterprof::testing::TfProfilerStandIn::Start(options);
  if (server == nullptr) {
    std::cerr << "tf-profiler-stand-in: cannot serve on 127.0.0.1\n";
    return 1;
  }
  {
    const std::string temp = port_file + ".tmp";
    std::ofstream out(temp);
    out << "grpc=" << server->port() << "\n";
    out.close();
    std::rename(temp.c_str(), port_file.c_str());
  }
  int signal = 0;
  sigwait(&signals, &signal);
  return 0;
}
