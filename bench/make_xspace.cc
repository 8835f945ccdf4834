// Writes a synthetic .xplane.pb with a given number of events, for benchmarks of whole commands
// (peak RSS of `clusterprof convert`, for example).
//
//   make_xspace --events 10000000 --threads 16 -o /tmp/big.xplane.pb
#include <cstdio>

#include "CLI/CLI.hpp"
#include "common/storage/local_storage.h"
#include "common/xspace/xspace_io.h"
#include "tests/support/xspace_samples.h"

int main(int argc, char** argv) {
  CLI::App app{"Writes a synthetic .xplane.pb"};
  int64_t events = 1'000'000;
  int threads = 16;
  std::string output;
  app.add_option("--events", events, "Total events")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 34));
  app.add_option("--threads", threads, "Host threads (lines)")->check(CLI::Range(1, 4096));
  app.add_option("-o,--output", output, "Output file")->required();
  CLI11_PARSE(app, argc, argv);

  const auto space = clusterprof::testing::SyntheticXSpace(threads, events / threads);
  auto storage = clusterprof::storage::NewLocalStorage();
  auto writer = storage->NewWriter(output);
  if (!writer.ok()) {
    std::fprintf(stderr, "make_xspace: %s\n", std::string(writer.status().message()).c_str());
    return 1;
  }
  absl::Status status = clusterprof::xspace::WriteXSpace(space, writer->get());
  auto info =
      status.ok() ? (*writer)->Commit() : absl::StatusOr<clusterprof::storage::ObjectInfo>(status);
  if (!info.ok()) {
    std::fprintf(stderr, "make_xspace: %s\n", std::string(info.status().message()).c_str());
    return 1;
  }
  std::printf("wrote %s: %lld events, %llu bytes\n", output.c_str(),
              static_cast<long long>(events / threads * threads),
              static_cast<unsigned long long>(info->bytes));
  return 0;
}
