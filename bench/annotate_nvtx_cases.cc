// annotate_benchmark's NVTX cases: a scoped event as an NVTX range, from the CUDA toolkit's
// header-only NVTX3, with no tool attached. Without a tool, the first NVTX call finds no
// injection library and points every NVTX entry at nothing, so each call is a load of a function
// pointer and a branch. NVTX_INJECTION64_PATH must be unset: a tool would measure the tool.
#include <benchmark/benchmark.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <cstdlib>

namespace clusterprof {
namespace {

bool ToolAttached(benchmark::State& state) {
  if (std::getenv("NVTX_INJECTION64_PATH") != nullptr) {
    state.SkipWithError("NVTX_INJECTION64_PATH is set: these cases measure NVTX without a tool");
    return true;
  }
  return false;
}

void BM_Nvtx_PushPop(benchmark::State& state) {
  if (ToolAttached(state)) return;
  nvtxRangePop();  // the first call initializes NVTX
  for (auto _ : state) {
    nvtxRangePushA("train_step");
    benchmark::ClobberMemory();
    nvtxRangePop();
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Nvtx_PushPop)->ThreadRange(1, 8);

// A start/end range with attributes: the name and the step number as the payload.
void BM_Nvtx_StartEndEx(benchmark::State& state) {
  if (ToolAttached(state)) return;
  nvtxRangeEnd(nvtxRangeStartA("warm"));
  int64_t step = 0;
  for (auto _ : state) {
    nvtxEventAttributes_t attributes = {};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = "train_step";
    attributes.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    attributes.payload.llValue = ++step;
    const nvtxRangeId_t id = nvtxRangeStartEx(&attributes);
    benchmark::ClobberMemory();
    nvtxRangeEnd(id);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Nvtx_StartEndEx)->ThreadRange(1, 8);

}  // namespace
}  // namespace clusterprof
