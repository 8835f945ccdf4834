// Child processes for integration tests: started with fork/exec, output sent to a file, and
// killed and reaped when the object goes away, so a failing test leaves nothing running.
#ifndef CLUSTERPROF_TESTS_SUPPORT_SUBPROCESS_H_
#define CLUSTERPROF_TESTS_SUPPORT_SUBPROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace clusterprof::testing {

class Subprocess {
 public:
  // Starts argv[0] (a path) with `argv`; `env` adds to (or replaces in) this process's
  // environment. stdout and stderr go to `log_path` (appended), or are inherited when empty;
  // a non-empty `stderr_path` takes stderr instead (appended).
  Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env = {},
             std::string log_path = "", std::string stderr_path = "");
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  void Signal(int signal);
  // Waits for the exit; returns the wait status, or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout = std::chrono::seconds(30));

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// Waits until `path` exists and is not empty; false on timeout.
bool WaitForFile(const std::string& path,
                 std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The gRPC port a server wrote to its --port-file (`grpc=<port>` line), waiting for the file;
// 0 when it does not appear or names none.
int ReadGrpcPort(const std::string& port_file,
                 std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A TCP port on 127.0.0.1 that nothing listens on (bound, then closed).
int UnusedPort();

// A free TCP port on 127.0.0.1 that this object listens on until it is destroyed: a port another
// process holds, for tests of what a server does when its port is taken.
class HeldPort {
 public:
  HeldPort();
  ~HeldPort();
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  // 0 when no socket could be bound.
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_SUBPROCESS_H_
