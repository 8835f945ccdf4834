# The root filesystem of an older Debian release, for the tests that load clusterprof's workload
# libraries under an older glibc (old_glibc_load_integration_test.sh,
# old_glibc_wheel_integration_test.sh). Sourced, not run:
#
#   source old_debian_rootfs.sh
#   old_debian_rootfs     # sets $old_debian_rootfs_tar, or exits 77 (skipped)
#
# Debian bullseye (glibc 2.31, Python 3.9) with python3 and python3-pip, made by mmdebstrap
# (minbase, no Recommends) once and cached as a tarball under ~/.cache/clusterprof/, named by its
# release and package list, so that a changed list makes a new one. Buster (glibc 2.28) is no
# longer on deb.debian.org. Skips (77) without root, mmdebstrap, or a mirror that serves
# bullseye ($CLUSTERPROF_OLD_DEBIAN_MIRROR, default deb.debian.org).
old_debian_suite=bullseye
old_debian_packages=python3,python3-pip

old_debian_rootfs() {
  local mirror="${CLUSTERPROF_OLD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  local cache="${XDG_CACHE_HOME:-$HOME/.cache}/clusterprof"
  old_debian_rootfs_tar="$cache/rootfs-$old_debian_suite-${old_debian_packages//,/-}.tar"
  if [[ $(id -u) -ne 0 ]]; then echo "skipped: chroot needs root"; exit 77; fi
  if ! command -v mmdebstrap >/dev/null; then echo "skipped: no mmdebstrap"; exit 77; fi
  mkdir -p "$cache"
  # Tests running at once make it once.
  exec {lock_fd}>"$old_debian_rootfs_tar.lock"
  flock "$lock_fd"
  if [[ ! -s "$old_debian_rootfs_tar" ]]; then
    echo "making a Debian $old_debian_suite root filesystem with $old_debian_packages" \
      "(once; cached in $old_debian_rootfs_tar)"
    # mmdebstrap writes a tarball for a name ending in .tar.
    local partial="${old_debian_rootfs_tar%.tar}.partial.tar"
    if ! mmdebstrap --quiet --variant=minbase --aptopt='APT::Install-Recommends "false"' \
      --include="$old_debian_packages" "$old_debian_suite" "$partial" "$mirror"; then
      rm -rf "$partial"
      echo "skipped: $mirror does not serve Debian $old_debian_suite"
      exit 77
    fi
    mv "$partial" "$old_debian_rootfs_tar"
    # Root filesystems of other package lists: nothing uses them any more.
    local old
    for old in "$cache/rootfs-$old_debian_suite-"*.tar; do
      [[ "$old" == "$old_debian_rootfs_tar" ]] || rm -f "$old" "$old.lock"
    done
  fi
  flock -u "$lock_fd"
  exec {lock_fd}>&-
}
