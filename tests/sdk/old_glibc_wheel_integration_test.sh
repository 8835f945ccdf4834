#!/usr/bin/env bash
# The Python SDK's wheel on an older Debian release than the build machine's: in the cached
# Debian bullseye root filesystem (glibc 2.31, Python 3.9, pip 20.3; old_debian_rootfs.sh),
# bullseye's own pip installs the wheel scripts/build-wheel makes (so it accepts the
# manylinux_2_28 tag there), and then `import clusterprof` finds the library bundled in the
# installed package and records a Trace into an armed $CLUSTERPROF_DIR (wheel_record_check.py).
#
#   old_glibc_wheel_integration_test.sh BUILD_WHEEL ANNOTATE_LIB
# Skips (77) without root, mmdebstrap, or a mirror that serves bullseye.
set -euo pipefail
build_wheel="$1"
annotate="$2"
here="$(dirname "$0")"

source "$here/old_debian_rootfs.sh"
old_debian_rootfs

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
tar -C "$root" -xf "$old_debian_rootfs_tar"
mkdir -p "$root/shm" "$root/wheel"
"$build_wheel" --library "$annotate" --out "$root/wheel" >/dev/null
wheel="$(cd "$root/wheel" && ls clusterprof-*.whl)"
cp "$here/wheel_record_check.py" "$root/wheel_record_check.py"
echo "glibc in the chroot: $(chroot "$root" /usr/bin/ldd --version | head -1)"

in_chroot() {
  chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root "$@"
}
in_chroot python3 -m pip --version
in_chroot python3 -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check \
  "/wheel/$wheel"
# Installed where pip puts root's packages, /usr/local/lib/python3.9/dist-packages.
in_chroot CLUSTERPROF_DIR=/shm python3 -B -s /wheel_record_check.py /usr/local/lib
ls "$root/shm" | grep -q '^ring-' || { echo "FAIL: no ring file in the chroot's /shm"; exit 1; }
