// Text the commands print alike.
#ifndef CLUSTERPROF_CLI_FORMAT_H_
#define CLUSTERPROF_CLI_FORMAT_H_

#include <cstdint>
#include <string>

namespace clusterprof::cli {

// "512 B", "41.3 kB", "2.66 GB": decimal units, as object stores count.
std::string FormatBytes(uint64_t bytes);

}  // namespace clusterprof::cli

#endif  // CLUSTERPROF_CLI_FORMAT_H_
