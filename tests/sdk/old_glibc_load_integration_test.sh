#!/usr/bin/env bash
# The libraries loaded into workloads, in a root filesystem of an older Debian release than the
# build machine's: Debian bullseye (glibc 2.31, Python 3.9), made by mmdebstrap and kept in the
# cache. There the annotation library is loaded by the Python module and records a Trace (no
# sidecar: it must stay a no-op), and the CUPTI library's InitializeInjection runs (no CUDA: it
# starts its watcher thread, fails to find libcupti, and says so). Buster (glibc 2.28) is no
# longer on deb.debian.org; the symbol versions test holds the libraries to 2.28.
#
#   old_glibc_load_integration_test.sh ANNOTATE_LIB PYTHON_MODULE_DIR [CUPTI_LIB]
# Skips (77) without root, mmdebstrap, or a mirror that serves bullseye (old_debian_rootfs.sh).
set -euo pipefail
annotate="$1"
python_dir="$2"
cupti="${3:-}"

# The cached bullseye root filesystem (shared with old_glibc_wheel_integration_test.sh).
source "$(dirname "$0")/old_debian_rootfs.sh"
old_debian_rootfs

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
tar -C "$root" -xf "$old_debian_rootfs_tar"
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
