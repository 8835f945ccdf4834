# clusterprof/sidecar: clusterprof-sidecar, and the two libraries that run inside workloads:
# libclusterprof_cupti.so (GPU tracing, loaded by CUDA_INJECTION64_PATH) and
# libclusterprof_annotate.so (the annotation C ABI). Build from the repository root
# (docker/README.md):
#
#   docker build -f docker/sidecar.Dockerfile -t clusterprof/sidecar:0.1.0 .
#
# libclusterprof_cupti.so is compiled against the CUDA toolkit's headers (cuda.h, cupti.h);
# libcupti and the CUDA driver are loaded at run time inside the workload, so nothing from CUDA
# ends up in the image. CUDA_IMAGE names an image that holds a toolkit under /usr/local/cuda
# (a CUDA "devel" image); only its headers are used. The workload's libcupti must be at least as
# new as these headers (docs/gpu.md), so pick the oldest CUDA release your GPU workloads run.
# CUDA_IMAGE=no-cuda builds without the GPU library (the image then has no
# libclusterprof_cupti.so; set the chart's GPU library setting to "").

ARG DEBIAN_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
# Where the binaries come from: "build" compiles them in the build stage below; "prebuilt" takes
# them, already built on a Debian bookworm machine, from the build context's prebuilt/sidecar/
# (scripts/build-images does this: minutes instead of a whole C++ build per image).
ARG BINARIES=build
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04

# No CUDA: an empty header directory, and the configure step skips libclusterprof_cupti.
FROM ${DEBIAN_IMAGE} AS no-cuda

# The toolkit's headers, gathered in one directory: CUPTI's headers sit in include/ or in
# extras/CUPTI/include/ depending on the toolkit's packaging.
FROM ${CUDA_IMAGE} AS cuda
RUN set -e; \
    mkdir -p /cuda/include; \
    for dir in /usr/local/cuda/include /usr/local/cuda/extras/CUPTI/include; do \
      if [ -d "$dir" ]; then cp -rL "$dir/." /cuda/include/; fi; \
    done

FROM ${DEBIAN_IMAGE} AS build
# The toolchain and library groups of scripts/install-deps. Left out, because a Release build
# with tests and benchmarks off does not use them: clang, libclang-rt-14-dev and ccache
# (sanitizer, fuzzer and developer builds), clang-format (lint), tzdata (run time only), and
# the test, benchmark and Python packages.
RUN set -eux; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      cmake ninja-build g++ pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
      libcpprest-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev prometheus-cpp-dev \
      libcivetweb-dev \
      zlib1g-dev libssl-dev libisal-dev libjemalloc-dev; \
    rm -rf /var/lib/apt/lists/*

COPY --from=cuda /cuda /opt/cuda
WORKDIR /src
COPY . .
# With tests off, CMake never looks for nvcc: the headers are all the GPU library needs.
RUN set -eux; \
    cmake -S . -B /build -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DCLUSTERPROF_BUILD_TESTS=OFF \
      -DCLUSTERPROF_BUILD_BENCHMARKS=OFF \
      -DCLUSTERPROF_CUDA_ROOT=/opt/cuda; \
    targets="clusterprof-sidecar clusterprof_annotate_c"; \
    if ninja -C /build -t targets all | grep -q '^clusterprof_cupti:'; then \
      targets="$targets clusterprof_cupti"; \
    elif [ -e /opt/cuda/include/cupti.h ]; then \
      echo "CUDA headers are in /opt/cuda/include but CMake did not configure clusterprof_cupti" >&2; \
      exit 1; \
    else \
      echo "no CUDA headers (CUDA_IMAGE=no-cuda): building without libclusterprof_cupti.so" >&2; \
    fi; \
    cmake --build /build --target $targets; \
    install -D -m 0755 /build/sidecar/clusterprof-sidecar /out/usr/bin/clusterprof-sidecar; \
    strip --strip-unneeded /out/usr/bin/clusterprof-sidecar; \
    install -D -m 0755 /build/sdk/libclusterprof_annotate.so \
      /out/usr/lib/clusterprof/libclusterprof_annotate.so; \
    install -D -m 0644 sdk/clusterprof_annotate.h \
      /out/usr/include/clusterprof/clusterprof_annotate.h; \
    if [ -e /build/sdk/libclusterprof_cupti.so ]; then \
      install -D -m 0755 /build/sdk/libclusterprof_cupti.so \
        /out/usr/lib/clusterprof/libclusterprof_cupti.so; \
    fi

# The same files as the build stage's /out, built elsewhere (BINARIES=prebuilt).
FROM scratch AS prebuilt
COPY prebuilt/sidecar/ /out/

FROM ${BINARIES} AS binaries

FROM ${RUNTIME_IMAGE}
ARG RUNTIME_IMAGE
ARG VERSION=0.1.0
ARG REVISION=""
LABEL org.opencontainers.image.title="clusterprof-sidecar" \
      org.opencontainers.image.description="clusterprof sidecar: TF/JAX ProfilerService server with annotation, GPU (CUPTI) and framework tracers, plus libclusterprof_cupti.so and libclusterprof_annotate.so for workloads" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"

# The runtime packages of the -dev packages the build links (apt-cache show <dev> | grep Depends):
# libgrpc++1.51 brings libgrpc29, libprotobuf32, libabsl20220623, libc-ares2 and libre2-9;
# libcpprest2.10 brings libbrotli1 and libssl3. ca-certificates: HTTPS to Cloud Storage.
# The spool and shared-memory directories exist and belong to the runtime user, so the image
# also runs without volumes (Kubernetes mounts emptyDirs over both).
RUN set -eux; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libcpprest2.10 libyaml-cpp0.7 libspdlog1.10 \
      libfmt9 libprometheus-cpp-core1.0 libcivetweb1 libisal2 libssl3 zlib1g \
      ca-certificates; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    install -d -o 65532 -g 65532 -m 0755 /var/run/clusterprof /var/lib/clusterprof/spool

COPY --from=binaries /out/ /

USER 65532:65532
EXPOSE 8466 8467
ENTRYPOINT ["/usr/bin/clusterprof-sidecar"]
