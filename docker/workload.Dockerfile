# clusterprof/example-workload: the annotated sample training loops of examples/ (C++
# train_loop and Python train_loop.py), with nothing of clusterprof's sidecar in them: the
# image a Deployment runs to try injection and capture on a cluster. Build from the repository
# root (docker/README.md):
#
#   docker build -f docker/workload.Dockerfile -t clusterprof/example-workload:0.1.0 .
#
# The default command runs the C++ loop until the pod stops; the Python loop is
#   command: ["python3", "/usr/share/clusterprof/examples/train_loop.py"]
# Both find the sidecar through $CLUSTERPROF_DIR, which injection sets.

ARG DEBIAN_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
# "build" compiles in the build stage; "prebuilt" takes the files from the build context's
# prebuilt/workload/ (scripts/build-images).
ARG BINARIES=build

FROM ${DEBIAN_IMAGE} AS build
RUN set -eux; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      cmake ninja-build g++ pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
      libcpprest-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev prometheus-cpp-dev \
      libcivetweb-dev \
      zlib1g-dev libssl-dev libisal-dev; \
    rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN set -eux; \
    cmake -S . -B /build -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DCLUSTERPROF_BUILD_TESTS=OFF \
      -DCLUSTERPROF_BUILD_BENCHMARKS=OFF \
      -DCLUSTERPROF_CUDA_ROOT=/nonexistent; \
    cmake --build /build --target train_loop clusterprof_annotate_c; \
    install -D -m 0755 /build/examples/train_loop /out/usr/bin/train_loop; \
    strip --strip-unneeded /out/usr/bin/train_loop; \
    install -D -m 0755 /build/sidecar/libclusterprof_annotate.so \
      /out/usr/lib/clusterprof/libclusterprof_annotate.so; \
    install -D -m 0644 sidecar/sdk/python/clusterprof/__init__.py \
      /out/usr/lib/python3/dist-packages/clusterprof/__init__.py; \
    install -D -m 0644 examples/train_loop.py /out/usr/share/clusterprof/examples/train_loop.py

FROM scratch AS prebuilt
COPY prebuilt/workload/ /out/

FROM ${BINARIES} AS binaries

FROM ${RUNTIME_IMAGE}
ARG RUNTIME_IMAGE
ARG VERSION=0.1.0
ARG REVISION=""
LABEL org.opencontainers.image.title="clusterprof-example-workload" \
      org.opencontainers.image.description="clusterprof example workload: annotated C++ and Python training loops" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"

# train_loop carries clusterprof's annotation SDK statically and needs only the C++ runtime;
# python3 runs train_loop.py, whose module loads libclusterprof_annotate.so with ctypes.
RUN set -eux; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*

COPY --from=binaries /out/ /
ENV CLUSTERPROF_ANNOTATE_LIB=/usr/lib/clusterprof/libclusterprof_annotate.so
USER 65532:65532
ENTRYPOINT []
CMD ["/usr/bin/train_loop", "--busy-percent", "10"]
