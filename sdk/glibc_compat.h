// libclusterprof_annotate.so and libclusterprof_cupti.so are loaded into the workload's own
// process, whose C library may be as old as glibc 2.28 (UBI 8, Ubuntu 20.04, Debian buster). They
// are linked with -Wl,--wrap for each C library symbol that a newer glibc gave a newer version
// (glibc_compat.cc lists them and says where each comes from), so that every reference binds to
// a version glibc 2.28 has; tests/sdk/workload_libraries_glibc_test.sh holds them to it.
#ifndef CLUSTERPROF_SDK_GLIBC_COMPAT_H_
#define CLUSTERPROF_SDK_GLIBC_COMPAT_H_

#include <dlfcn.h>

extern "C" {

// _dl_find_object (glibc 2.35), which libgcc's unwinder asks for the module holding a return
// address, done with dl_iterate_phdr as glibc before 2.35 allows: the module's mapped range and
// its PT_GNU_EH_FRAME. 0 and `result` filled when a module holds `pc`, else -1. The wrapped
// _dl_find_object uses the C library's own where there is one.
int clusterprof_find_object_fallback(void* pc, struct dl_find_object* result);

}  // extern "C"

#endif  // CLUSTERPROF_SDK_GLIBC_COMPAT_H_
