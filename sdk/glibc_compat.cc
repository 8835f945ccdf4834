#include "sdk/glibc_compat.h"

#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

// The first version of each symbol on this architecture.
#if defined(__x86_64__)
#define CLUSTERPROF_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define CLUSTERPROF_GLIBC_BASE "GLIBC_2.17"
#else
#error "glibc_compat.cc knows the base symbol versions of x86_64 and aarch64 only"
#endif

// NAME_compat is NAME at the base version.
#define CLUSTERPROF_COMPAT(name) \
  __asm__(".symver " #name "_compat, " #name "@" CLUSTERPROF_GLIBC_BASE)

extern "C" {

// pthread (2.34 moved it from libpthread.so.0 into libc.so.6 with new versions): std::thread,
// std::call_once and thread-local keys, in our code and in the static libstdc++. The libraries
// keep libpthread.so.0 in their DT_NEEDED, where glibc before 2.34 defines these.
int pthread_create_compat(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
CLUSTERPROF_COMPAT(pthread_create);
int __wrap_pthread_create(pthread_t* thread, const pthread_attr_t* attributes,
                          void* (*start)(void*), void* argument) {
  return pthread_create_compat(thread, attributes, start, argument);
}
int pthread_join_compat(pthread_t, void**);
CLUSTERPROF_COMPAT(pthread_join);
int __wrap_pthread_join(pthread_t thread, void** result) {
  return pthread_join_compat(thread, result);
}
int pthread_detach_compat(pthread_t);
CLUSTERPROF_COMPAT(pthread_detach);
int __wrap_pthread_detach(pthread_t thread) { return pthread_detach_compat(thread); }
int pthread_once_compat(pthread_once_t*, void (*)(void));
CLUSTERPROF_COMPAT(pthread_once);
int __wrap_pthread_once(pthread_once_t* once, void (*init)(void)) {
  return pthread_once_compat(once, init);
}
int __pthread_key_create_compat(pthread_key_t*, void (*)(void*));
CLUSTERPROF_COMPAT(__pthread_key_create);
int __wrap___pthread_key_create(pthread_key_t* key, void (*destructor)(void*)) {
  return __pthread_key_create_compat(key, destructor);
}

// libdl, likewise (2.34): loading libcupti and the CUDA driver. libdl.so.2 stays in DT_NEEDED.
void* dlopen_compat(const char*, int);
CLUSTERPROF_COMPAT(dlopen);
void* __wrap_dlopen(const char* file, int mode) { return dlopen_compat(file, mode); }
void* dlsym_compat(void*, const char*);
CLUSTERPROF_COMPAT(dlsym);
void* __wrap_dlsym(void* handle, const char* name) { return dlsym_compat(handle, name); }
char* dlerror_compat(void);
CLUSTERPROF_COMPAT(dlerror);
char* __wrap_dlerror(void) { return dlerror_compat(); }
int dladdr_compat(const void*, Dl_info*);
CLUSTERPROF_COMPAT(dladdr);
int __wrap_dladdr(const void* address, Dl_info* info) { return dladdr_compat(address, info); }

// stat and fstat became functions in 2.33; before, the headers made them calls to these, with
// the version of struct stat (1 on x86_64 and aarch64's generic layout alike: _STAT_VER).
int __xstat_compat(int, const char*, struct stat*);
CLUSTERPROF_COMPAT(__xstat);
int __fxstat_compat(int, int, struct stat*);
CLUSTERPROF_COMPAT(__fxstat);
#if defined(__x86_64__)
constexpr int kStatVersion = 1;
#else
constexpr int kStatVersion = 0;
#endif
int __wrap_stat(const char* path, struct stat* buffer) {
  return __xstat_compat(kStatVersion, path, buffer);
}
int __wrap_fstat(int fd, struct stat* buffer) { return __fxstat_compat(kStatVersion, fd, buffer); }
int __wrap_fstat64(int fd, struct stat* buffer) {
  return __fxstat_compat(kStatVersion, fd, buffer);
}

// The static libstdc++ reads this (2.32) to skip atomic operations in single-threaded
// processes. Ours, hidden, says "not single-threaded": always the atomic operations.
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;

// std::random_device (libstdc++'s random.o, which its string instantiations pull in) takes
// arc4random (2.36) where the build's glibc has it; getrandom (2.25) does the same job.
uint32_t __wrap_arc4random(void) {
  uint32_t value = 0;
  if (syscall(SYS_getrandom, &value, sizeof(value), 0) == static_cast<long>(sizeof(value))) {
    return value;
  }
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &value, sizeof(value)) != static_cast<ssize_t>(sizeof(value))) value = 0;
    close(fd);
  }
  return value;
}

}  // extern "C"

namespace {

using FindObject = int (*)(void*, struct dl_find_object*);
FindObject g_find_object = nullptr;

// Resolved once, at load, not while an exception is being unwound.
__attribute__((constructor)) void ResolveFindObject() {
  g_find_object = reinterpret_cast<FindObject>(dlsym_compat(RTLD_DEFAULT, "_dl_find_object"));
}

struct Search {
  uintptr_t pc;
  struct dl_find_object* result;
  bool found;
};

int VisitModule(struct dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<Search*>(data);
  uintptr_t low = UINTPTR_MAX;
  uintptr_t high = 0;
  bool holds = false;
  void* eh_frame = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + segment.p_vaddr;
    if (segment.p_type == PT_LOAD) {
      const uintptr_t end = start + segment.p_memsz;
      if (start < low) low = start;
      if (end > high) high = end;
      if (search->pc >= start && search->pc < end) holds = true;
    } else if (segment.p_type == PT_GNU_EH_FRAME) {
      eh_frame = reinterpret_cast<void*>(start);
    }
  }
  if (!holds) return 0;
  std::memset(search->result, 0, sizeof(*search->result));
  search->result->dlfo_map_start = reinterpret_cast<void*>(low);
  search->result->dlfo_map_end = reinterpret_cast<void*>(high);
  search->result->dlfo_eh_frame = eh_frame;
  search->found = true;
  return 1;
}

}  // namespace

extern "C" {

int clusterprof_find_object_fallback(void* pc, struct dl_find_object* result) {
  Search search{reinterpret_cast<uintptr_t>(pc), result, false};
  dl_iterate_phdr(VisitModule, &search);
  return search.found ? 0 : -1;
}

// libgcc's unwinder (2.35): the C library's where it has one, else the walk above.
int __wrap__dl_find_object(void* pc, struct dl_find_object* result) {
  if (g_find_object != nullptr) return g_find_object(pc, result);
  return clusterprof_find_object_fallback(pc, result);
}

}  // extern "C"
