#include "sidecar/tracers/gpu_occupancy.h"

#include <algorithm>

#if CLUSTERPROF_HAVE_CUDA_OCCUPANCY
#include "cuda_occupancy.h"
#endif

namespace clusterprof::sidecar {

std::optional<double> OccupancyPercent(const shm::GpuDeviceInfo& device,
                                       const KernelShape& kernel) {
#if !CLUSTERPROF_HAVE_CUDA_OCCUPANCY
  (void)device;
  (void)kernel;
  return std::nullopt;
#else
  if (device.max_threads_per_sm == 0 || device.regs_per_sm == 0 || device.warp_size == 0 ||
      device.shared_per_sm == 0 || kernel.block_threads == 0) {
    return std::nullopt;
  }
  cudaOccDeviceProp prop;
  prop.computeMajor = static_cast<int>(device.compute_cap_major);
  prop.computeMinor = static_cast<int>(device.compute_cap_minor);
  prop.maxThreadsPerBlock = static_cast<int>(device.max_threads_per_block);
  prop.maxThreadsPerMultiprocessor = static_cast<int>(device.max_threads_per_sm);
  prop.regsPerBlock = static_cast<int>(device.regs_per_block);
  prop.regsPerMultiprocessor = static_cast<int>(device.regs_per_sm);
  prop.warpSize = static_cast<int>(device.warp_size);
  prop.sharedMemPerBlock = device.shared_per_block;
  prop.sharedMemPerMultiprocessor = device.shared_per_sm;
  prop.numSms = static_cast<int>(device.core_count);
  prop.sharedMemPerBlockOptin = device.shared_per_block_optin;
  prop.reservedSharedMemPerBlock = device.reserved_shared_per_block;

  cudaOccFuncAttributes function;
  function.maxThreadsPerBlock = static_cast<int>(device.max_threads_per_block);
  function.numRegs = static_cast<int>(kernel.registers);
  function.sharedSizeBytes = kernel.static_shared;
  function.partitionedGCConfig = PARTITIONED_GC_OFF;
  // The launch ran, so a block above the default shared memory limit had opted in.
  const uint64_t shared = uint64_t{kernel.static_shared} + kernel.dynamic_shared;
  if (shared > device.shared_per_block) {
    function.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
    function.maxDynamicSharedSizeBytes = kernel.dynamic_shared;
  } else {
    function.shmemLimitConfig = FUNC_SHMEM_LIMIT_DEFAULT;
    function.maxDynamicSharedSizeBytes = 0;
  }
  cudaOccDeviceState state;  // no cache preference, the default carveout
  cudaOccResult result;
  if (cudaOccMaxActiveBlocksPerMultiprocessor(&result, &prop, &function, &state,
                                              static_cast<int>(kernel.block_threads),
                                              kernel.dynamic_shared) != CUDA_OCC_SUCCESS ||
      result.activeBlocksPerMultiprocessor <= 0) {
    return std::nullopt;
  }
  // A partial warp takes a whole one.
  const uint32_t warps_per_block = (kernel.block_threads + device.warp_size - 1) / device.warp_size;
  const double resident_warps =
      static_cast<double>(result.activeBlocksPerMultiprocessor) * warps_per_block;
  const double max_warps = static_cast<double>(device.max_threads_per_sm / device.warp_size);
  return std::min(100.0, 100.0 * resident_warps / max_warps);
#endif
}

}  // namespace clusterprof::sidecar
