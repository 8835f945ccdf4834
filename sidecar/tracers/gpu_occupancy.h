// A kernel launch's theoretical occupancy, as XProf's kernel stats and Nsight Compute show it
// (`occ_pct` in kernel_details): the warps its blocks keep resident on one SM, over the most the
// SM holds. It follows from the launch's block size, registers per thread and shared memory, and
// the device's limits, through the CUDA toolkit's header-only occupancy calculator
// (cuda_occupancy.h): register allocation granularity, shared memory carveouts and the blocks an
// SM holds per compute capability are the calculator's, not ours.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_GPU_OCCUPANCY_H_
#define CLUSTERPROF_SIDECAR_TRACERS_GPU_OCCUPANCY_H_

#include <cstdint>
#include <optional>

#include "sdk/shm_format.h"

namespace clusterprof::sidecar {

struct KernelShape {
  uint32_t block_threads = 0;  // x * y * z
  uint32_t registers = 0;      // per thread
  uint32_t static_shared = 0;  // bytes
  uint32_t dynamic_shared = 0;
};

// Percent in (0, 100]. nullopt when the device's limits are unknown (a ring written before they
// were recorded), the calculator does not know the compute capability or refuses the launch, or
// this build had no CUDA toolkit headers.
std::optional<double> OccupancyPercent(const shm::GpuDeviceInfo& device, const KernelShape& kernel);

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_GPU_OCCUPANCY_H_
