#include "sidecar/supervisor.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "common/base/strings.h"
#include "fmt/format.h"

namespace clusterprof::sidecar {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

void Nothing(int) {}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                  ")");
  }
  return StrCat("ended with wait status ", status);
}

std::string Seconds(milliseconds duration) {
  return fmt::format("{:.1f} s", static_cast<double>(duration.count()) / 1000.0);
}

// Starts the child with the signal mask the supervisor found. -1 when fork failed.
pid_t Spawn(const std::vector<std::string>& command, const sigset_t& mask) {
  std::vector<char*> argv;
  for (const std::string& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // A supervisor that is killed outright (outside a container, where it is not the first
    // process) takes its sidecar with it.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(0);
    signal(SIGCHLD, SIG_DFL);
    sigprocmask(SIG_SETMASK, &mask, nullptr);
    execv(argv[0], argv.data());
    const char* message = "clusterprof-sidecar --supervise: cannot run the sidecar: ";
    (void)!write(STDERR_FILENO, message, strlen(message));
    const char* reason = strerror(errno);
    (void)!write(STDERR_FILENO, reason, strlen(reason));
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  return pid;
}

}  // namespace

std::optional<std::vector<std::string>> SupervisedCommand(int argc, const char* const* argv) {
  std::vector<std::string> command = {"/proc/self/exe"};
  bool supervise = false;
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == kSuperviseFlag) {
      supervise = true;
    } else {
      command.emplace_back(argv[i]);
    }
  }
  if (!supervise) return std::nullopt;
  return command;
}

std::string LogFormatArgument(const std::vector<std::string>& argv) {
  std::string format;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string_view arg = argv[i];
    if (ConsumePrefix(&arg, "--log-format=")) {
      format = std::string(arg);
    } else if (arg == "--log-format" && i + 1 < argv.size()) {
      format = argv[i + 1];
    }
  }
  return format;
}

int RunSupervised(const std::vector<std::string>& command, const SupervisorOptions& options) {
  const auto log = [&options](const std::string& line) {
    if (options.log) options.log(line);
  };
  // SIGCHLD needs a handler (not SIG_IGN, which would reap children unseen) to stay pending
  // while blocked; every handled signal is taken by sigtimedwait below.
  struct sigaction action {};
  action.sa_handler = Nothing;
  sigemptyset(&action.sa_mask);
  sigaction(SIGCHLD, &action, nullptr);
  sigset_t handled, previous;
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGINT);
  sigprocmask(SIG_BLOCK, &handled, &previous);
  const auto finish = [&previous](int code) {
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    return code;
  };

  pid_t child = -1;
  milliseconds backoff = options.initial_backoff;
  Clock::time_point started{}, next_start = Clock::now();
  for (;;) {
    if (child < 0 && Clock::now() >= next_start) {
      child = Spawn(command, previous);
      started = Clock::now();
      if (child < 0) {
        log(StrCat("cannot start clusterprof-sidecar: fork: ", strerror(errno),
                   "; trying again in ", Seconds(backoff)));
        next_start = started + backoff;
        backoff = std::min(backoff * 2, options.max_backoff);
      }
    }
    siginfo_t info;
    int signal_number;
    if (child > 0) {
      signal_number = sigwaitinfo(&handled, &info);
    } else {
      const auto wait = std::max(
          milliseconds(0), std::chrono::duration_cast<milliseconds>(next_start - Clock::now()));
      timespec timeout{static_cast<time_t>(wait.count() / 1000),
                       static_cast<long>(wait.count() % 1000) * 1000000L};
      signal_number = sigtimedwait(&handled, &info, &timeout);
    }
    if (signal_number < 0) continue;  // the restart is due, or EINTR
    if (signal_number == SIGCHLD) {
      int status = 0;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (pid != child) continue;  // an orphan the container's first process inherited
        child = -1;
        const auto ran = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
        if (ran >= options.healthy_after) backoff = options.initial_backoff;
        log(StrCat("clusterprof-sidecar ", DescribeExit(status), " after ", Seconds(ran),
                   "; starting it again in ", Seconds(backoff),
                   ". The workload's containers are not affected; captures of this pod fail "
                   "until the sidecar runs (the lines before this one say why it stopped)"));
        next_start = Clock::now() + backoff;
        backoff = std::min(backoff * 2, options.max_backoff);
      }
      continue;
    }
    // SIGTERM or SIGINT: the container is stopping.
    if (child < 0) return finish(0);
    kill(child, signal_number);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status)) return finish(WEXITSTATUS(status));
    if (WIFSIGNALED(status) && WTERMSIG(status) == signal_number) return finish(0);
    return finish(128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
  }
}

}  // namespace clusterprof::sidecar
