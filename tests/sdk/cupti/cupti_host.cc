// A minimal CUDA process for the injection tests: initializes CUDA when this machine has a
// driver (the driver then loads libclusterprof_cupti through CUDA_INJECTION64_PATH, as in a
// workload), else loads the library and calls InitializeInjection itself, as the driver would.
// Then waits `seconds` and exits.
//
//   cupti_host <libclusterprof_cupti.so> <seconds>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: cupti_host <libclusterprof_cupti.so> <seconds>\n");
    return 2;
  }
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  bool injected_by_driver = false;
  if (driver != nullptr) {
    using CuInit = int (*)(unsigned);
    auto cu_init = reinterpret_cast<CuInit>(dlsym(driver, "cuInit"));
    injected_by_driver = cu_init != nullptr && cu_init(0) == 0;
  }
  if (!injected_by_driver) {
    void* library = dlopen(argv[1], RTLD_NOW);
    if (library == nullptr) {
      std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
      return 1;
    }
    using Initialize = int (*)();
    auto initialize = reinterpret_cast<Initialize>(dlsym(library, "InitializeInjection"));
    if (initialize == nullptr || initialize() != 1) {
      std::fprintf(stderr, "InitializeInjection failed\n");
      return 1;
    }
  }
  std::printf("%s\n", injected_by_driver ? "injected by the CUDA driver" : "injected by hand");
  std::fflush(stdout);
  std::this_thread::sleep_for(
      std::chrono::milliseconds(static_cast<int64_t>(std::atof(argv[2]) * 1000)));
  return 0;
}
