#!/usr/bin/env bash
# The libraries loaded into workloads, in a root filesystem of an older Debian release than the
# build machine's: Debian bullseye (glibc 2.31, Python 3.9), made by mmdebstrap and kept in the
# cache. There the annotation library is loaded by the Python module and records a Trace (no
# sidecar: it must stay a no-op), and the CUPTI library's InitializeInjection runs (no CUDA: it
# starts its watcher thread, fails to find libcupti, and says so). Buster (glibc 2.28) is no
# longer on deb.debian.org; the symbol versions test holds the libraries to 2.28.
#
#   old_glibc_load_integration_test.sh ANNOTATE_LIB PYTHON_MODULE_DIR [CUPTI_LIB]
# Skips (77) without root, mmdebstrap, or a mirror that serves bullseye.
set -euo pipefail
annotate="$1"
python_dir="$2"
cupti="${3:-}"
suite=bullseye
mirror="${CLUSTERPROF_OLD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/clusterprof/rootfs-$suite-python3.tar"

if [[ $(id -u) -ne 0 ]]; then echo "skipped: chroot needs root"; exit 77; fi
if ! command -v mmdebstrap >/dev/null; then echo "skipped: no mmdebstrap"; exit 77; fi
if [[ ! -s "$cache" ]]; then
  mkdir -p "$(dirname "$cache")"
  echo "making a Debian $suite root filesystem with python3 (once; cached in $cache)"
  # mmdebstrap writes a tarball for a name ending in .tar.
  partial="${cache%.tar}.partial.tar"
  if ! mmdebstrap --quiet --variant=minbase --include=python3 "$suite" "$partial" "$mirror"; then
    rm -rf "$partial"
    echo "skipped: $mirror does not serve Debian $suite"
    exit 77
  fi
  mv "$partial" "$cache"
fi

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
tar -C "$root" -xf "$cache"
mkdir -p "$root/opt/clusterprof/python" "$root/shm"
cp "$annotate" "$root/opt/clusterprof/libclusterprof_annotate.so"
cp -r "$python_dir/clusterprof" "$root/opt/clusterprof/python/"
[[ -n "$cupti" ]] && cp "$cupti" "$root/opt/clusterprof/libclusterprof_cupti.so"
echo "glibc in the chroot: $(chroot "$root" /usr/bin/ldd --version | head -1)"

chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin CLUSTERPROF_DIR=/shm \
  CLUSTERPROF_ANNOTATE_LIB=/opt/clusterprof/libclusterprof_annotate.so \
  /usr/bin/python3 - "${cupti:+/opt/clusterprof/libclusterprof_cupti.so}" <<'PY'
import ctypes
import sys

sys.path.insert(0, "/opt/clusterprof/python")
print("python", sys.version.split()[0])
import clusterprof

assert clusterprof._lib_path == "/opt/clusterprof/libclusterprof_annotate.so", clusterprof._lib_path
with clusterprof.Trace("step", step_num=1) as trace:
    trace.set_metadata(loss=0.5)
clusterprof.set_thread_name("main")
print("libclusterprof_annotate.so: loaded by the module; a Trace without a sidecar is a no-op")

if len(sys.argv) > 1 and sys.argv[1]:
    cupti = ctypes.CDLL(sys.argv[1])
    assert cupti.InitializeInjection() == 1
    print("libclusterprof_cupti.so: loaded, InitializeInjection returned 1")
PY
