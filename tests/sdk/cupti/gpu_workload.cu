// A CUDA program for the GPU tests and benchmarks: per iteration a host-to-device copy, a custom
// kernel, a cuBLAS SGEMM, a memset and a device-to-host copy on one stream, then a stream
// synchronize. Modes for the overhead benchmark: `launch` (back-to-back tiny kernels, bound by
// launch cost) and `gemm` (large SGEMMs, bound by the GPU).
//
//   gpu_workload [--mode mixed|launch|gemm] [--seconds S | --iterations N] [--size N]
// Each iteration is an NVTX range. Prints "ready" once CUDA works, and at the end "iterations=<n> seconds=<s> per_iteration_us=<u>".
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#define CHECK_CUDA(call)                                                               \
  do {                                                                                 \
    cudaError_t error = (call);                                                        \
    if (error != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(error));      \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define CHECK_CUBLAS(call)                                                             \
  do {                                                                                 \
    cublasStatus_t status = (call);                                                    \
    if (status != CUBLAS_STATUS_SUCCESS) {                                             \
      std::fprintf(stderr, "%s failed: %d\n", #call, static_cast<int>(status));       \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__global__ void clusterprof_test_saxpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void clusterprof_test_tiny(float* y) {
  if (threadIdx.x == 0) y[0] += 1.0f;
}

int main(int argc, char** argv) {
  std::string mode = "mixed";
  double seconds = 0;
  long iterations = 100;
  int size = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mode")) mode = argv[i + 1];
    else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iterations")) iterations = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--size")) size = std::atoi(argv[i + 1]);
  }
  const int n = size * size;
  float* host = nullptr;
  float *x = nullptr, *y = nullptr, *a = nullptr, *b = nullptr, *c = nullptr;
  CHECK_CUDA(cudaMallocHost(&host, n * sizeof(float)));
  for (int i = 0; i < n; ++i) host[i] = 1.0f;
  CHECK_CUDA(cudaMalloc(&x, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&a, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&c, n * sizeof(float)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  CHECK_CUBLAS(cublasCreate(&blas));
  CHECK_CUBLAS(cublasSetStream(blas, stream));
  CHECK_CUDA(cudaMemcpy(a, host, n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b, host, n * sizeof(float), cudaMemcpyHostToDevice));
  const float one = 1.0f, zero = 0.0f;

  auto iteration = [&] {
    nvtxRangePushA("clusterprof_test_iteration");
    if (mode == "launch") {
      for (int k = 0; k < 100; ++k) clusterprof_test_tiny<<<1, 32, 0, stream>>>(y);
    } else if (mode == "gemm") {
      CHECK_CUBLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, size, size, size, &one, a, size, b,
                               size, &zero, c, size));
    } else {
      CHECK_CUDA(cudaMemcpyAsync(x, host, n * sizeof(float), cudaMemcpyHostToDevice, stream));
      clusterprof_test_saxpy<<<(n + 255) / 256, 256, 0, stream>>>(n, 2.0f, x, y);
      CHECK_CUBLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, size, size, size, &one, a, size, b,
                               size, &zero, c, size));
      CHECK_CUDA(cudaMemsetAsync(y, 0, n * sizeof(float), stream));
      CHECK_CUDA(cudaMemcpyAsync(host, c, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    nvtxRangePop();
  };
  iteration();  // warm-up: module loading, cuBLAS's first call
  std::printf("ready\n");
  std::fflush(stdout);

  const auto start = std::chrono::steady_clock::now();
  long done = 0;
  while (true) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0 ? elapsed >= seconds : done >= iterations) break;
    iteration();
    ++done;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("iterations=%ld seconds=%.6f per_iteration_us=%.3f\n", done, elapsed,
              done > 0 ? elapsed * 1e6 / done : 0.0);
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  cudaFree(x);
  cudaFree(y);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFreeHost(host);
  return 0;
}
