#include "cli/format.h"

#include "fmt/format.h"

namespace clusterprof::cli {

std::string FormatBytes(uint64_t bytes) {
  if (bytes >= 1'000'000'000) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1'000'000) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1'000) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{} B", bytes);
}

}  // namespace clusterprof::cli
