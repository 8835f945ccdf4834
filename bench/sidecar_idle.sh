#!/usr/bin/env bash
# Idle cost of clusterprof-sidecar: resident memory and CPU of a sidecar that serves but
# captures nothing, measured from /proc over a window after start-up.
#
#   bench/sidecar_idle.sh [--seconds 30] [--build-dir build]
set -euo pipefail
seconds=30
build_dir="$(cd "$(dirname "$0")/.." && pwd)/build"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    *) echo "sidecar_idle.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
"$build_dir/sidecar/clusterprof-sidecar" --port 0 --http-port 0 --shm-dir "$work/shm" \
  --allowed-logdir "$work/logs" --port-file "$work/ports" --log-level warn &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 200); do [[ -s "$work/ports" ]] && break; sleep 0.05; done
sleep 2  # past start-up
http="$(sed -n 's/^http=//p' "$work/ports")"
curl -s "http://127.0.0.1:$http/metrics" >/dev/null || true  # a scrape, as Prometheus would
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz="$(getconf CLK_TCK)"
t0="$(ticks)"
sleep "$seconds"
t1="$(ticks)"
rss_kib="$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")"
threads="$(awk '/^Threads/ {print $2}' "/proc/$pid/status")"
python3 - "$rss_kib" "$t0" "$t1" "$hz" "$seconds" "$threads" <<'PY'
import sys
rss, t0, t1, hz, seconds, threads = map(float, sys.argv[1:])
print("idle sidecar: RSS %.1f MiB, CPU %.3f%% of a core over %d s (%d threads)" %
      (rss / 1024, 100 * (t1 - t0) / hz / seconds, seconds, threads))
PY
