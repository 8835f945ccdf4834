# clusterprof/operator: clusterprof-operator (controllers and the sidecar-injection webhook) and
# the clusterprof CLI. Build from the repository root (docker/README.md):
#
#   docker build -f docker/operator.Dockerfile -t clusterprof/operator:0.1.0 .
#
# Two stages: a Debian bookworm build stage with the build dependencies of scripts/install-deps,
# and a bookworm-slim runtime stage with only the shared libraries the binaries load.

ARG DEBIAN_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
# Where the binaries come from: "build" compiles them in the build stage below; "prebuilt" takes
# them, already built on a Debian bookworm machine, from the build context's prebuilt/operator/
# (scripts/build-images does this: minutes instead of a whole C++ build per image).
ARG BINARIES=build

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

WORKDIR /src
COPY . .
# CLUSTERPROF_CUDA_ROOT points at a directory that does not exist: the operator needs no CUDA,
# and the configure step then skips libclusterprof_cupti.
RUN set -eux; \
    cmake -S . -B /build -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DCLUSTERPROF_BUILD_TESTS=OFF \
      -DCLUSTERPROF_BUILD_BENCHMARKS=OFF \
      -DCLUSTERPROF_CUDA_ROOT=/nonexistent; \
    cmake --build /build --target clusterprof-operator clusterprof; \
    install -D -m 0755 /build/operator/clusterprof-operator /out/usr/bin/clusterprof-operator; \
    install -D -m 0755 /build/cli/clusterprof /out/usr/bin/clusterprof; \
    strip --strip-unneeded /out/usr/bin/clusterprof-operator /out/usr/bin/clusterprof

# The same files as the build stage's /out, built elsewhere (BINARIES=prebuilt).
FROM scratch AS prebuilt
COPY prebuilt/operator/ /out/

FROM ${BINARIES} AS binaries

FROM ${RUNTIME_IMAGE}
ARG RUNTIME_IMAGE
ARG VERSION=0.1.0
ARG REVISION=""
LABEL org.opencontainers.image.title="clusterprof-operator" \
      org.opencontainers.image.description="clusterprof operator: ProfileJob and ProfileSchedule controllers, the sidecar-injection admission webhook, and the clusterprof CLI" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"

# The runtime packages of the -dev packages the build links (apt-cache show <dev> | grep Depends):
# libgrpc++1.51 brings libgrpc29, libprotobuf32, libabsl20220623, libc-ares2 and libre2-9;
# libcpprest2.10 brings libbrotli1 and libssl3. ca-certificates: HTTPS to Cloud Storage (run
# manifests on gs:// logdirs) and to API servers reached through a kubeconfig. tzdata:
# ProfileSchedule time zones. libjemalloc2: the operator's allocator.
# The admission webhook's HTTPS (Boost.Beast) links libssl3; civetweb serves /healthz, /readyz
# and /metrics over plain HTTP and needs no TLS.
RUN set -eux; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libcpprest2.10 libyaml-cpp0.7 libspdlog1.10 \
      libfmt9 libprometheus-cpp-core1.0 libcivetweb1 libisal2 libssl3 zlib1g libjemalloc2 \
      ca-certificates tzdata; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    install -d -o 65532 -g 65532 -m 0755 /etc/clusterprof/webhook

COPY --from=binaries /out/ /

# The spool for gs:// run manifests defaults to $TMPDIR/clusterprof-spool-<uid>; with a
# read-only root filesystem, mount a writable volume at /tmp (the chart does).
USER 65532:65532
EXPOSE 8081 9443
ENTRYPOINT ["/usr/bin/clusterprof-operator"]
