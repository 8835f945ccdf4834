#!/usr/bin/env bash
# What the flight recorder and the live step telemetry cost the sidecar (docs/triggers.md): CPU
# share of one core and memory of a sidecar with the recorder on (its defaults: level 2, 30 s,
# 64 MiB), measured from /proc once its window has filled, in three cases:
#   busy:  a workload annotating 10,000 events/s (bench/paced_annotator);
#   steps: a workload that marks only its steps, 20 a second (what every injected pod pays when
#          no trigger is defined and the workload annotates its steps);
#   none:  no workload at all.
#
#   bench/recorder_cost.sh [--seconds 30] [--build-dir build]
set -euo pipefail
seconds=30
build_dir="$(cd "$(dirname "$0")/.." && pwd)/build"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    *) echo "recorder_cost.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
hz="$(getconf CLK_TCK)"
measure() {  # case rate events_per_step [more sidecar flags]
  local name="$1" rate="$2" per_step="$3"
  shift 3
  local work
  work="$(mktemp -d /dev/shm/clusterprof-recorder.XXXXXX)"
  "$build_dir/sidecar/clusterprof-sidecar" --port 0 --http-port 0 --shm-dir "$work/shm" \
    --allowed-logdir "$work/logs" --port-file "$work/ports" --log-level warn --no-gpu "$@" &
  local pid=$!
  for _ in $(seq 200); do [[ -s "$work/ports" ]] && break; sleep 0.05; done
  local workload=""
  if [[ "$rate" != 0 ]]; then
    CLUSTERPROF_DIR="$work/shm" "$build_dir/bench/paced_annotator" --rate "$rate" \
      --events-per-step "$per_step" --seconds $((seconds + 40)) >/dev/null &
    workload=$!
  fi
  sleep 32  # past start-up, and the 30 s window filled
  local t0 t1
  t0="$(awk '{print $14 + $15}' "/proc/$pid/stat")"
  sleep "$seconds"
  t1="$(awk '{print $14 + $15}' "/proc/$pid/stat")"
  local rss hwm
  rss="$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")"
  hwm="$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status")"
  [[ -n "$workload" ]] && kill "$workload" 2>/dev/null
  kill "$pid"; wait "$pid" 2>/dev/null || true
  [[ -n "$workload" ]] && { wait "$workload" 2>/dev/null || true; }
  rm -rf "$work"
  python3 - "$name" "$rate" "$rss" "$hwm" "$t0" "$t1" "$hz" "$seconds" <<'PY'
import sys
name, rate = sys.argv[1], int(sys.argv[2])
rss, hwm, t0, t1, hz, seconds = map(float, sys.argv[3:])
print("%-6s %6d events/s: CPU %.3f%% of a core over %d s, RSS %.1f MiB (peak %.1f MiB)" %
      (name, rate, 100 * (t1 - t0) / hz / seconds, seconds, rss / 1024, hwm / 1024))
PY
}
measure busy 10000 50
measure steps 20 3
measure none 0 0
measure busy-off 10000 50 --recorder-level 0
