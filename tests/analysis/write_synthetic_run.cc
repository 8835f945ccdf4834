// Writes a synthetic run directory (tests/analysis/synthetic_run.h) as a capture leaves it: one
// host-N.xplane.pb per host and a clusterprof_run.json manifest with each host's clock offset.
// For tests that run `clusterprof report` as a command (the HTML report's browser test).
//
//   write-synthetic-run --hosts 6 --steps 60 --slow-host 4 --compute-scale 1.15 --out DIR
#include <cstdio>
#include <fstream>
#include <string>

#include "CLI/CLI.hpp"
#include "common/base/strings.h"
#include "tests/analysis/synthetic_run.h"

namespace {

bool Write(const std::string& path, const std::string& data) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << data;
  if (file.flush()) return true;
  std::fprintf(stderr, "write-synthetic-run: cannot write %s\n", path.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  using clusterprof::StrAppend;
  using clusterprof::StrCat;
  CLI::App app{"Writes a synthetic multi-host run directory"};
  int hosts = 6;
  int slow_host = -1;
  double compute_scale = 1.15;
  std::string out;
  clusterprof::analysis::testing::RunSpec spec;
  app.add_option("--hosts", hosts, "Hosts")->check(CLI::Range(1, 4096));
  app.add_option("--steps", spec.steps, "Steps")->check(CLI::Range(1, 1'000'000));
  app.add_option("--slow-host", slow_host, "Index of the host that computes slower (-1: none)");
  app.add_option("--compute-scale", compute_scale, "How much longer its compute takes")
      ->check(CLI::Range(1.0, 100.0));
  app.add_option("--out", out, "Existing directory to write into")->required();
  CLI11_PARSE(app, argc, argv);

  spec.hosts.resize(static_cast<size_t>(hosts));
  for (int h = 0; h < hosts; ++h) {
    // Clocks that disagree by a few milliseconds, as the manifest says.
    spec.hosts[static_cast<size_t>(h)].clock_offset_ns = (h % 2 == 0 ? 3 : -3) * 1'000'000;
  }
  if (slow_host >= 0 && slow_host < hosts) {
    spec.hosts[static_cast<size_t>(slow_host)].compute_scale = compute_scale;
  }
  const std::vector<tensorflow::profiler::XSpace> spaces =
      clusterprof::analysis::testing::MakeRun(spec);
  std::string manifest = R"({"kind":"clusterprof.io/v1alpha1/CaptureRun","targets":[)";
  for (size_t h = 0; h < spaces.size(); ++h) {
    if (!Write(StrCat(out, "/host-", h, ".xplane.pb"), spaces[h].SerializeAsString())) return 1;
    StrAppend(&manifest, h == 0 ? "" : ",", R"({"host":"host-)", h, R"(","clock_offset_ns":)",
              spec.hosts[h].clock_offset_ns, "}");
  }
  manifest += "]}\n";
  return Write(StrCat(out, "/clusterprof_run.json"), manifest) ? 0 : 1;
}
