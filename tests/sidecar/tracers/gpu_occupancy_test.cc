// Occupancy against cases computed by hand from the devices' published limits (CUDA C
// Programming Guide, "Compute Capabilities"): registers are allocated per warp in units of 256,
// each block also takes the driver's reserved 1 KiB of shared memory, and an SM holds at most 32
// blocks on compute capability 8.0 and 9.0.
#include "sidecar/tracers/gpu_occupancy.h"

#include "gtest/gtest.h"

namespace clusterprof::sidecar {
namespace {

shm::GpuDeviceInfo H100() {
  shm::GpuDeviceInfo device{};
  device.compute_cap_major = 9;
  device.compute_cap_minor = 0;
  device.core_count = 132;
  device.max_threads_per_block = 1024;
  device.max_threads_per_sm = 2048;
  device.regs_per_block = 65536;
  device.regs_per_sm = 65536;
  device.warp_size = 32;
  device.shared_per_block = 48 * 1024;
  device.shared_per_sm = 228 * 1024;
  device.shared_per_block_optin = 227 * 1024;
  device.reserved_shared_per_block = 1024;
  return device;
}

shm::GpuDeviceInfo A100() {
  shm::GpuDeviceInfo device = H100();
  device.compute_cap_major = 8;
  device.core_count = 108;
  device.shared_per_sm = 164 * 1024;
  device.shared_per_block_optin = 163 * 1024;
  return device;
}

double Occupancy(const shm::GpuDeviceInfo& device, uint32_t block, uint32_t registers,
                 uint32_t static_shared = 0, uint32_t dynamic_shared = 0) {
  std::optional<double> pct =
      OccupancyPercent(device, {block, registers, static_shared, dynamic_shared});
  EXPECT_TRUE(pct.has_value());
  return pct.value_or(-1);
}

#if CLUSTERPROF_TEST_HAVE_CUDA_OCCUPANCY

TEST(OccupancyTest, NothingLimitsASmallKernelBelowAFullSm) {
  // 256 threads x 32 registers: 8 blocks of 8 warps fill the 64 warps.
  EXPECT_DOUBLE_EQ(Occupancy(H100(), 256, 32), 100.0);
}

TEST(OccupancyTest, RegistersLimitTheBlocks) {
  // 64 registers x 32 threads = 2048 per warp; 65536 / 2048 = 32 warps: 4 blocks of 8 warps.
  EXPECT_DOUBLE_EQ(Occupancy(H100(), 256, 64), 50.0);
  // 37 registers: 1184 per warp, allocated as 1280 (units of 256); 65536 / 1280 = 51 warps,
  // 6 whole blocks of 8 warps = 48 of 64.
  EXPECT_DOUBLE_EQ(Occupancy(H100(), 256, 37), 75.0);
}

TEST(OccupancyTest, SharedMemoryLimitsTheBlocks) {
  // 48 KiB static + 1 KiB reserved per block; 228 KiB hold 4 blocks of 4 warps: 16 of 64.
  EXPECT_DOUBLE_EQ(Occupancy(H100(), 128, 32, 48 * 1024), 25.0);
  // 100 KiB of dynamic shared memory (opted in past 48 KiB): 2 blocks of 8 warps.
  EXPECT_DOUBLE_EQ(Occupancy(H100(), 256, 32, 0, 100 * 1024), 25.0);
  // The A100's 164 KiB hold 3 blocks of 49 KiB: 12 warps of 64.
  EXPECT_DOUBLE_EQ(Occupancy(A100(), 128, 32, 48 * 1024), 18.75);
}

TEST(OccupancyTest, TheBlocksAnSmHoldsLimitSmallBlocks) {
  // One warp per block, 32 blocks at most: 32 of 64 warps.
  EXPECT_DOUBLE_EQ(Occupancy(H100(), 32, 16), 50.0);
  // 48 threads take 2 warps: 32 blocks fill all 64 (a thread count would say 75%).
  EXPECT_DOUBLE_EQ(Occupancy(H100(), 48, 16), 100.0);
}

#endif  // CLUSTERPROF_TEST_HAVE_CUDA_OCCUPANCY

TEST(OccupancyTest, UnknownLimitsGiveNoFigure) {
  shm::GpuDeviceInfo old{};  // a ring without the limits
  old.compute_cap_major = 9;
  EXPECT_FALSE(OccupancyPercent(old, {256, 32, 0, 0}).has_value());
  EXPECT_FALSE(OccupancyPercent(H100(), {0, 32, 0, 0}).has_value());
}

}  // namespace
}  // namespace clusterprof::sidecar
