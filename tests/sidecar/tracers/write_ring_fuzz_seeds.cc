// Writes the seed corpora of ring_reader_fuzzer and gpu_ring_reader_fuzzer: rings written by the
// SDK's writers (ring_fuzz_util.h), as a workload leaves them, plus a few broken ones.
//
//   write-ring-fuzz-seeds tests/data/fuzz
//
// writes <dir>/ring_reader/*.shm and <dir>/gpu_ring_reader/*.shm (the regress_* inputs there are
// left as they are).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/sidecar/tracers/ring_fuzz_util.h"

namespace {

using clusterprof::fuzzing::SampleGpuRing;
using clusterprof::fuzzing::SampleRing;
using clusterprof::fuzzing::WriteSampleGpuRing;
using clusterprof::fuzzing::WriteSampleRing;

void Write(const std::filesystem::path& dir, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) clusterprof::fuzzing::Fail("cannot write " + (dir / name).string());
}

// The broken variants of a good ring: empty, cut inside the header, another magic.
void WriteBroken(const std::filesystem::path& dir, const std::string& good) {
  Write(dir, "empty", "");
  Write(dir, "truncated_header.shm", good.substr(0, 100));
  std::string other_magic = good;
  other_magic[7] = '2';  // "CPRING02" / "CPGPU002"
  Write(dir, "other_magic.shm", other_magic);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <tests/data/fuzz>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];

  const std::filesystem::path rings = root / "ring_reader";
  const std::string compact = WriteSampleRing({});
  Write(rings, "compact.shm", compact);
  Write(rings, "as_written.shm", WriteSampleRing({.compact = false}));
  Write(rings, "wrapped.shm", WriteSampleRing({.before_drain = 5, .after_drain = 7}));
  Write(rings, "full.shm",
        WriteSampleRing(
            {.slots_per_thread = 4, .strings_capacity = 96, .after_drain = 9, .extra_threads = 1}));
  Write(rings, "host_pid.shm",
        WriteSampleRing({.process_name = "python3",
                         .pid = 4242,
                         .max_threads = 3,
                         .slots_per_thread = 4,
                         .after_drain = 4}));
  WriteBroken(rings, compact);

  const std::filesystem::path gpu = root / "gpu_ring_reader";
  const std::string gpu_compact = WriteSampleGpuRing({});
  Write(gpu, "compact.shm", gpu_compact);
  Write(gpu, "wrapped.shm", WriteSampleGpuRing({.capacity = 8, .before_drain = 8}));
  Write(gpu, "failed.shm",
        WriteSampleGpuRing({.error = "cuptiActivityEnable: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"}));
  Write(gpu, "other_capture.shm", WriteSampleGpuRing({.armed_seq = 7}));
  Write(gpu, "host_pid.shm", WriteSampleGpuRing({.process_name = "python3", .pid = 4242}));
  WriteBroken(gpu, gpu_compact);
  return 0;
}
