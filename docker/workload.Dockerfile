# clusterprof/example-workload: the annotated sample training loops of examples/ (C++
# train_loop and Python train_loop.py), with nothing of clusterprof's sidecar in them: the
# image a Deployment runs to try injection and capture on a cluster. Build from the repository
# root (docker/README.md):
#
#   docker build -f docker/workload.Dockerfile -t clusterprof/example-workload:0.1.0 .
#
# The default command runs the C++ loop until the pod stops; the Python loop is
#   command: ["python3", "/usr/share/clusterprof/examples/train_loop.py"]
# Both find the sidecar through $CLUSTERPROF_DIR, which injection sets. The Python loop's
# clusterprof module is the SDK's wheel (scripts/build-wheel), installed with pip as a user's
# image would install it.

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
      zlib1g-dev libssl-dev libisal-dev libjemalloc-dev python3; \
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
    scripts/build-wheel --build-dir /build --out /out/wheels; \
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
# python3 runs train_loop.py, whose clusterprof module loads the libclusterprof_annotate.so
# inside its package. pip installs the wheel into Debian's python3 (/usr/local/lib/python3.11/
# dist-packages, where apt never writes; --break-system-packages is what PEP 668 asks for that)
# and is purged in the same step with every package it brought (ca-certificates and openssl
# among them), so the image carries no pip. A virtual environment would keep its own pip and
# need its python on PATH instead of python3. The wheel is copied in (its layer keeps its
# 0.6 MB) rather than bind-mounted with RUN --mount: buildah would reuse the cached step below
# when only a mounted file changed, and install an old wheel.
COPY --from=binaries /out/wheels/ /tmp/wheels/
RUN set -eux; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3; \
    dpkg-query -W -f '${Package}\n' | sort >/tmp/packages; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-pip; \
    python3 -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check \
      --break-system-packages /tmp/wheels/clusterprof-*.whl; \
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -q \
      $(dpkg-query -W -f '${Package}\n' | sort | comm -13 /tmp/packages -); \
    python3 -c 'import clusterprof; assert clusterprof.library_path(), "no library"'; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /tmp/wheels /tmp/packages

COPY --from=binaries /out/usr/ /usr/
USER 65532:65532
ENTRYPOINT []
CMD ["/usr/bin/train_loop", "--busy-percent", "10"]
