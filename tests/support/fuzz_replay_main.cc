// A main() for fuzz targets built without libFuzzer: replays files through
// LLVMFuzzerTestOneInput, so a corpus (seeds plus every input that once crashed) is a regression
// test in every build, sanitizers included.
//
//   xspace_reader_fuzzer tests/data/fuzz/xspace_reader [more files or directories...]
//
// Directories are walked recursively in sorted order; every regular file is one input. Arguments
// that start with '-' are libFuzzer flags and are ignored, so libFuzzer command lines work too.
// Exits 1 when a path does not exist or a file cannot be read. When an input crashes the
// process, a signal handler names the file before the process dies.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

// The input being replayed, for the crash handler (which may only use async-signal-safe calls).
char current_input[4096];

void OnCrash(int signal_number) {
  constexpr char kPrefix[] = "fuzz_replay: crashed on input ";
  (void)!write(STDERR_FILENO, kPrefix, sizeof(kPrefix) - 1);
  (void)!write(STDERR_FILENO, current_input, strnlen(current_input, sizeof(current_input)));
  (void)!write(STDERR_FILENO, "\n", 1);
  signal(signal_number, SIG_DFL);
  raise(signal_number);
}

void InstallCrashHandlers() {
  for (int signal_number : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP}) {
    struct sigaction action {};
    action.sa_handler = OnCrash;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    sigaction(signal_number, &action, nullptr);
  }
}

bool Replay(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz_replay: cannot read %s\n", path.c_str());
    return false;
  }
  const std::string contents((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (in.bad()) {
    std::fprintf(stderr, "fuzz_replay: error reading %s\n", path.c_str());
    return false;
  }
  // An exactly sized heap copy, as libFuzzer passes it, so ASan sees reads past the end.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[contents.size()]);
  std::memcpy(copy.get(), contents.data(), contents.size());
  std::snprintf(current_input, sizeof(current_input), "%s", path.c_str());
  LLVMFuzzerTestOneInput(copy.get(), contents.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  InstallCrashHandlers();
  int failures = 0;
  int replayed = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("-")) continue;
    std::error_code error;
    const fs::file_status status = fs::status(arg, error);
    if (error || !fs::exists(status)) {
      std::fprintf(stderr, "fuzz_replay: %s does not exist\n", arg.c_str());
      ++failures;
      continue;
    }
    std::vector<fs::path> files;
    if (fs::is_directory(status)) {
      for (fs::recursive_directory_iterator it(arg, error), end; !error && it != end;
           it.increment(error)) {
        if (it->is_regular_file()) files.push_back(it->path());
      }
      if (error) {
        std::fprintf(stderr, "fuzz_replay: cannot list %s: %s\n", arg.c_str(),
                     error.message().c_str());
        ++failures;
      }
      std::sort(files.begin(), files.end());
    } else if (fs::is_regular_file(status)) {
      files.push_back(arg);
    }
    for (const fs::path& file : files) {
      if (Replay(file)) {
        ++replayed;
      } else {
        ++failures;
      }
    }
  }
  std::printf("replayed %d inputs\n", replayed);
  return failures == 0 ? 0 : 1;
}
