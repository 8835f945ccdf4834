#!/usr/bin/env bash
# The libraries loaded into workloads need no glibc symbol version newer than 2.28 (UBI 8, Ubuntu
# 20.04, Debian buster), carry their C++ runtime (no libstdc++ or libgcc_s in DT_NEEDED), and
# export only their C API.
#
#   workload_libraries_glibc_test.sh LIBRARY:EXPORTED_SYMBOL...
set -euo pipefail
status=0
for spec in "$@"; do
  library="${spec%%:*}"
  exported="${spec#*:}"
  newest="$(objdump -T "$library" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V |
    tail -1)"
  if [[ "$(printf '%s\n2.28\n' "$newest" | sort -V | tail -1)" != "2.28" ]]; then
    echo "FAIL: $library needs GLIBC_$newest; these symbols need more than 2.28:"
    objdump -T "$library" | awk '/GLIBC_2\.(29|[3-9][0-9])/ {print "  " $(NF-1), $NF}'
    status=1
  else
    echo "ok: $library needs GLIBC_$newest at most"
  fi
  if objdump -p "$library" | grep -E 'NEEDED +(libstdc\+\+|libgcc_s)' >/dev/null; then
    echo "FAIL: $library needs a shared C++ runtime:"
    objdump -p "$library" | grep NEEDED
    status=1
  fi
  # Defined, global, in the text section: the library's API and nothing else.
  api="$(objdump -T "$library" | awk '$2 == "g" && $4 == ".text" {print $NF}' | sort -u)"
  if ! grep -qx "$exported" <<<"$api"; then
    echo "FAIL: $library does not export $exported"
    status=1
  fi
  if grep -E '^_Z|^__wrap_|clusterprof_find_object' <<<"$api"; then
    echo "FAIL: $library exports the C++ or compatibility symbols above"
    status=1
  fi
done
exit $status
