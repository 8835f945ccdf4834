// The unwinder's _dl_find_object done with dl_iterate_phdr, for glibc before 2.35, against the
// C library's own on this machine's glibc: the same module range and .eh_frame_hdr for code in
// this program, in libc and in libstdc++, and no module for an address outside them all.
#include "sdk/glibc_compat.h"

#include <cstdio>
#include <stdexcept>
#include <string>

#include "gtest/gtest.h"

namespace {

void ExpectSameAsTheCLibrary(void* pc, const char* what) {
  SCOPED_TRACE(what);
  struct dl_find_object real = {};
  struct dl_find_object ours = {};
  ASSERT_EQ(_dl_find_object(pc, &real), 0);
  ASSERT_EQ(clusterprof_find_object_fallback(pc, &ours), 0);
  EXPECT_EQ(ours.dlfo_map_start, real.dlfo_map_start);
  EXPECT_EQ(ours.dlfo_map_end, real.dlfo_map_end);
  EXPECT_EQ(ours.dlfo_eh_frame, real.dlfo_eh_frame);
  EXPECT_NE(ours.dlfo_eh_frame, nullptr);
}

TEST(FindObjectFallbackTest, FindsTheModuleAndItsUnwindTablesAsTheCLibraryDoes) {
  ExpectSameAsTheCLibrary(reinterpret_cast<void*>(&ExpectSameAsTheCLibrary), "this program");
  ExpectSameAsTheCLibrary(reinterpret_cast<void*>(&std::printf), "libc");
  std::string (*to_string)(int) = &std::to_string;
  ExpectSameAsTheCLibrary(reinterpret_cast<void*>(to_string), "libstdc++ or this program");
}

TEST(FindObjectFallbackTest, AnAddressNoModuleHoldsIsNotFound) {
  struct dl_find_object ours = {};
  EXPECT_EQ(clusterprof_find_object_fallback(reinterpret_cast<void*>(16), &ours), -1);
}

}  // namespace
