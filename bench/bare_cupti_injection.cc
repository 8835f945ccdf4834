// The floor of GPU tracing's cost: a CUDA injection library that enables the activity kinds
// libclusterprof_cupti enables, hands CUPTI its buffers and frees them untouched when they come
// back, as NVIDIA's activity sample does minus its printing. bench/gpu_overhead.cc runs the
// workload with it beside the same workload under libclusterprof_cupti, so our overhead reads as
// a ratio to CUPTI's own.
//
//   CUDA_INJECTION64_PATH=libbare_cupti_injection.so [BARE_CUPTI_API=runtime,driver|runtime|
//   driver|none] program
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr size_t kBufferBytes = 8 << 20;  // libclusterprof_cupti's size
constexpr size_t kAlignment = 8;

void CUPTIAPI RequestBuffer(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI CompleteBuffer(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t) {
  std::free(buffer);
}

void Check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* text = "?";
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "bare_cupti_injection: %s: %s\n", what, text);
}

void FlushAtExit() { cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); }

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  Check(cuptiActivityRegisterCallbacks(RequestBuffer, CompleteBuffer), "register callbacks");
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_MEMSET,
                                  CUPTI_ACTIVITY_KIND_SYNCHRONIZATION}) {
    Check(cuptiActivityEnable(kind), "enable an activity kind");
  }
  const char* api = std::getenv("BARE_CUPTI_API");
  const std::string kinds = api != nullptr ? api : "runtime,driver";
  if (kinds.find("runtime") != std::string::npos) {
    Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime API records");
  }
  if (kinds.find("driver") != std::string::npos) {
    Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "enable driver API records");
  }
  std::atexit(FlushAtExit);
  return 1;
}
