#!/usr/bin/env bash
# Start skew across local sidecars: starts N sidecars, optionally beside busy workloads, runs
# `clusterprof capture` against all of them K times, and reports p50/p99/max of
# |achieved start - T0| from the run manifests (the start each sidecar reports, mapped onto the
# coordinator's clock), and the sidecars' CPU time per capture.
#
#   bench/start_skew.sh [--sidecars 16] [--captures 20] [--duration-ms 100] [--delay-ms 300]
#                       [--busy 0|N|cores] [--annotate] [--sidecar-arg ARG]... [--build-dir build]
#
# --busy N starts N processes that spin at normal priority for the whole run (`cores`: one per
# CPU), in the same session as the sidecars, so every CPU is taken when the sidecars wake.
# --sidecar-arg passes a flag to every sidecar (repeatable), e.g. --sidecar-arg=--no-start-realtime
# or --sidecar-arg=--start-spin-us=500.
# --annotate runs one annotating workload (tests/sidecar/test_annotator: a step every ~0.7 ms) per
# sidecar, and then also reports where each host's trace data starts (its first annotation at or
# after T0, from <host>.trace.json.gz) and the sidecars' wake errors (their session log lines).
set -euo pipefail
sidecars=16
captures=20
duration_ms=100
delay_ms=300
busy=0
annotate=0
sidecar_args=()
build_dir="$(cd "$(dirname "$0")/.." && pwd)/build"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sidecars) sidecars="$2"; shift 2 ;;
    --captures) captures="$2"; shift 2 ;;
    --duration-ms) duration_ms="$2"; shift 2 ;;
    --delay-ms) delay_ms="$2"; shift 2 ;;
    --busy) busy="$2"; shift 2 ;;
    --annotate) annotate=1; shift ;;
    --sidecar-arg) sidecar_args+=("$2"); shift 2 ;;
    --sidecar-arg=*) sidecar_args+=("${1#--sidecar-arg=}"); shift ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    *) echo "start_skew.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ "$busy" == cores ]] && busy="$(nproc)"
work="$(mktemp -d)"
pids=()
cleanup() {
  [[ ${#pids[@]} -gt 0 ]] && kill "${pids[@]}" 2>/dev/null && wait "${pids[@]}" 2>/dev/null
  [[ -n "${KEEP:-}" ]] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT

addresses=()
sidecar_pids=()
for i in $(seq 0 $((sidecars - 1))); do
  mkdir -p "$work/shm$i"
  "$build_dir/sidecar/clusterprof-sidecar" --port 0 --http-port -1 --host-name "s$i" \
    --shm-dir "$work/shm$i" --allowed-logdir "$work/logs" --port-file "$work/ports$i" \
    --log-level info ${sidecar_args[@]+"${sidecar_args[@]}"} 2>>"$work/sidecars.log" &
  pids+=($!)
  sidecar_pids+=($!)
done
for i in $(seq 0 $((sidecars - 1))); do
  for _ in $(seq 200); do [[ -s "$work/ports$i" ]] && break; sleep 0.05; done
  addresses+=("127.0.0.1:$(sed -n 's/^grpc=//p' "$work/ports$i")")
done
service_addr="$(IFS=,; echo "${addresses[*]}")"

# Annotating workloads, one per sidecar, attached to its shared-memory directory.
if [[ "$annotate" == 1 ]]; then
  for i in $(seq 0 $((sidecars - 1))); do
    CLUSTERPROF_DIR="$work/shm$i" "$build_dir/tests/test_annotator" --seconds 100000 >/dev/null 2>&1 &
    pids+=($!)
  done
  sleep 1
fi

# Busy workloads: plain shell loops at normal priority, one process each.
for _ in $(seq 1 "$busy"); do
  bash -c 'while :; do :; done' &
  pids+=($!)
done
[[ "$busy" -gt 0 ]] && sleep 1

# CPU time of every sidecar thread, in ns (the first field of each thread's schedstat).
sidecar_cpu_ns() {
  local total=0 t
  for pid in "${sidecar_pids[@]}"; do
    for t in /proc/"$pid"/task/*/schedstat; do
      total=$((total + $(cut -d' ' -f1 "$t" 2>/dev/null || echo 0)))
    done
  done
  echo "$total"
}
cpu_before="$(sidecar_cpu_ns)"

# The sidecars have no workloads, so every trace is empty and capture exits 1 ("no trace event
# was collected"); the manifest records each start all the same. One attempt: no retries.
for c in $(seq 1 "$captures"); do
  "$build_dir/cli/clusterprof" capture --service-addr "$service_addr" \
    --logdir "$work/logs" --duration-ms "$duration_ms" --delay-ms "$delay_ms" \
    --num-tracing-attempts 1 --run "skew_$c" --no-progress >/dev/null 2>>"$work/capture.log" ||
    true
done
cpu_after="$(sidecar_cpu_ns)"
echo "sidecars: ${sidecar_args[*]:-(default flags)}; busy processes: $busy on $(nproc) CPUs"
grep -m1 "start instants" "$work/sidecars.log" | sed 's/^/  sidecar log: /' || true
echo "  sidecar CPU per capture per sidecar: $(( (cpu_after - cpu_before) / captures / sidecars / 1000 )) us (all its threads, RPCs and file writes included)"

python3 - "$work/logs/plugins/profile" "$sidecars" "$captures" "$work/sidecars.log" <<'PY'
import glob, gzip, json, os, re, sys
root, sidecars, captures, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# All sidecars share this machine's clock, so the true error of a start is the sidecar's own
# start time minus T0; the manifest's start_error_ns maps starts through the estimated clock
# offsets, which only a probe error would make differ.
errors, per_capture, reported = [], [], []
for path in sorted(glob.glob(root + "/skew_*/clusterprof_run.json")):
    run = json.load(open(path))
    values = []
    for t in run["targets"]:
        if t["start_error_ns"] is None:
            continue
        offset = t["clock_offset_ns"] if t["clock_offset_applied"] else 0
        values.append(abs(t["achieved_start_ns"] + offset - run["t0_ns"]))
        reported.append(abs(t["start_error_ns"]))
    errors += values
    if values:
        per_capture.append(max(values))
errors.sort()
def pct(values, p):
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]
print("start skew over %d captures x %d sidecars (%d samples)" % (captures, sidecars, len(errors)))
print("  |actual start - T0|   p50 %.1f us   p99 %.1f us   max %.1f us" %
      (pct(errors, 50) / 1e3, pct(errors, 99) / 1e3, errors[-1] / 1e3))
reported.sort()
print("  as reported (through the probed offsets): p50 %.1f us   p99 %.1f us" %
      (pct(reported, 50) / 1e3, pct(reported, 99) / 1e3))
per_capture.sort()
print("  worst host per capture p50 %.1f us   max %.1f us" %
      (pct(per_capture, 50) / 1e3, per_capture[-1] / 1e3))
# The sidecars' wake-ups: "start error N us, wake error M us" in each session's log line.
wakes = sorted(int(m.group(1)) * 1000 for m in
               re.finditer(r"wake error (-?\d+) us", open(log, errors="replace").read()))
if wakes:
    print("  wake error (sidecar woke - T0, %d sessions): p50 %.1f us   p99 %.1f us   max %.1f us" %
          (len(wakes), pct(wakes, 50) / 1e3, pct(wakes, 99) / 1e3, wakes[-1] / 1e3))
# Where the data starts: each host's first annotation starting at or after T0 (ts in epoch us).
gaps = []
for path in sorted(glob.glob(root + "/skew_*/clusterprof_run.json")):
    t0_us = json.load(open(path))["t0_ns"] / 1e3
    for trace in glob.glob(os.path.dirname(path) + "/*.trace.json.gz"):
        starts = [e["ts"] for e in json.load(gzip.open(trace))["traceEvents"]
                  if e.get("ph") == "X" and e.get("ts", -1) >= t0_us]
        if starts:
            gaps.append(min(starts) - t0_us)
if gaps:
    gaps.sort()
    print("  first annotation at or after T0 (%d traces): p50 %.1f us   p99 %.1f us   max %.1f us"
          % (len(gaps), pct(gaps, 50), pct(gaps, 99), gaps[-1]))
PY
