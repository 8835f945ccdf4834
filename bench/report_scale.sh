#!/usr/bin/env bash
# The cross-host analysis at scale: wall time and peak RSS of `clusterprof report` and of
# `clusterprof convert --run` (one Perfetto trace of every host) over a synthetic run directory
# written by make_run (N hosts of a training job, one straggling), and a check that the report
# names the straggler.
#
#   bench/report_scale.sh [--build-dir DIR] [--hosts N] [--events N] [--steps N]
#                         [--straggler I] [--cache DIR] [--json-size]
#   bench/report_scale.sh --digests [--hosts N] [--steps N] [--runs N]
#   HOSTS=4 EVENTS=100000 bench/report_scale.sh          # a quick check
#
# --digests measures the report of hosts' digests as the coordinator makes it when a capture
# ends (make_run --digests: N digests handed to the report one at a time; defaults 10,000 hosts x
# 1,000 steps): wall time and peak RSS of the whole (digests made, verdict, text, JSON, HTML),
# the page's and the JSON's sizes, the terminal table's lines, and, when Chromium is installed,
# the page in headless Chromium (tests/analysis/report_html_browser.py, median of --runs loads,
# default 3). Targets: <= 10 s, <= 1 GiB, page <= 10 MB drawn within 2 s with no console error.
#
# Defaults (the issue's targets): 64 hosts x 1,000,000 events (about 1.1 GB of xplane.pb),
# 200 steps, the straggler at index hosts / 2, build/. It builds nothing: build make_run and
# clusterprof first (cmake --build build --target make_run clusterprof).
#
# --cache DIR keeps the generated run under DIR/run-h<hosts>-e<events>-s<steps>-x<straggler> and
# reuses it when one with the same parameters is there (regenerate after changing make_run.cc by
# deleting it). Without it the run goes into a temporary directory, deleted at the end.
# --json-size also measures the uncompressed size of the merged trace (gzip -dc | wc -c).
#
# The files are read from the page cache (just written, or reused): the figures leave out disk
# reads. Exits 1 when the report does not name the straggler (alone), or a command fails; the
# targets are printed as met or not met, not enforced (they depend on the machine and its load).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
build_dir="$here/../build"
hosts="${HOSTS:-64}"
events="${EVENTS:-1000000}"
steps="${STEPS:-200}"
straggler="${STRAGGLER:-}"
cache="${CACHE:-}"
json_size=0
digests=0
runs=3
hosts_given=0
steps_given=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --hosts) hosts="$2"; hosts_given=1; shift 2 ;;
    --events) events="$2"; shift 2 ;;
    --steps) steps="$2"; steps_given=1; shift 2 ;;
    --straggler) straggler="$2"; shift 2 ;;
    --cache) cache="$2"; shift 2 ;;
    --json-size) json_size=1; shift ;;
    --digests) digests=1; shift ;;
    --runs) runs="$2"; shift 2 ;;
    *) echo "report_scale.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if (( digests )); then
  (( hosts_given )) || [[ -n "${HOSTS:-}" ]] || hosts=10000
  (( steps_given )) || [[ -n "${STEPS:-}" ]] || steps=1000
fi
[[ -n "$straggler" ]] || straggler=$((hosts > 1 ? hosts / 2 : -1))

make_run="$build_dir/bench/make_run"
clusterprof="$build_dir/cli/clusterprof"
for tool in "$make_run" "$clusterprof"; do
  if [[ ! -x "$tool" ]]; then
    echo "report_scale.sh: $tool is missing: cmake --build $build_dir --target make_run clusterprof" >&2
    exit 2
  fi
done
if [[ ! -x /usr/bin/time ]]; then
  echo "report_scale.sh: needs GNU time as /usr/bin/time (Debian: apt-get install time)" >&2
  exit 2
fi

# Field of a `/usr/bin/time -v` report.
time_field() { sed -n "s/^[[:space:]]*$2: //p" "$1"; }
# "h:mm:ss" or "m:ss.ss" as seconds.
wall_seconds() { awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; printf "%.2f", s }' <<< "$1"; }
verdict() { awk -v v="$1" -v op="$2" -v t="$3" \
  'BEGIN { ok = (op == "<=") ? v <= t : v >= t; print ok ? "met" : "NOT met" }'; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if (( digests )); then
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)   $(date -u '+%Y-%m-%d %H:%M UTC')"
  /usr/bin/time -v -o "$work/digests.time" "$make_run" --digests --hosts "$hosts" --steps "$steps" \
    --straggler "$straggler" --out "$work/report" > "$work/digests.out" 2> "$work/digests.err" ||
    { cat "$work/digests.err" "$work/digests.time" >&2; exit 1; }
  wall=$(awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; printf "%.2f", s }' \
    <<< "$(sed -n 's/^[[:space:]]*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$work/digests.time")")
  rss_kb=$(sed -n 's/^[[:space:]]*Maximum resident set size (kbytes): //p' "$work/digests.time")
  expected=$(sed -n 's/.*straggler=\([^ ]*\).*/\1/p' "$work/digests.out")
  page="$work/report/clusterprof_report.html"
  page_bytes=$(stat -c %s "$page")
  json_bytes=$(stat -c %s "$work/report/clusterprof_report.json")
  named=$(python3 -c 'import json, sys; print(",".join(json.load(open(sys.argv[1]))["stragglers"]))' \
    "$work/report/clusterprof_report.json")
  echo "report of $hosts digests x $steps steps: wall ${wall} s, peak RSS $((rss_kb / 1024)) MiB;" \
    "stragglers: ${named:-none} (expected $expected)"
  sed 's/^/  /' "$work/digests.err"
  echo "  target wall <= 10 s: $(verdict "$wall" '<=' 10); peak RSS <= 1 GiB:" \
    "$(verdict "$rss_kb" '<=' $((1024 * 1024)))"
  echo "  terminal: $(wc -l < "$work/report/report.txt") lines; JSON $json_bytes bytes;" \
    "page $page_bytes bytes, target <= 10 MB: $(verdict "$page_bytes" '<=' 10000000)"
  status=0
  for ((i = 1; i <= runs; i++)); do
    python3 "$here/../tests/analysis/report_html_browser.py" "$page" --expect-straggler "$expected" \
      > "$work/seen.$i.json" || status=$?
    if (( status == 77 )); then echo "  (no Chromium: the page's load is not measured)"; break; fi
    if (( status != 0 )); then cat "$work/seen.$i.json" >&2; exit 1; fi
  done
  if (( status == 0 )); then
    python3 - "$work" "$runs" <<'PY'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
seen = [json.load(open(f"{work}/seen.{i}.json")) for i in range(1, runs + 1)]
drawn = statistics.median(s["timings"]["drawn_frame_ms"] for s in seen)
fcp = statistics.median(s["timings"]["first_contentful_paint_ms"] for s in seen)
print(f"  headless Chromium, median of {runs} loads: first contentful paint {fcp:.0f} ms, every "
      f"chart drawn {drawn:.0f} ms, console errors {sum(len(s['problems']) for s in seen)}; "
      f"target <= 2000 ms: {'met' if drawn <= 2000 else 'NOT met'}")
PY
  fi
  [[ "$named" == "$expected" ]] || { echo "report_scale.sh: named '${named:-none}', not $expected" >&2; exit 1; }
  exit 0
fi

if [[ -n "$cache" ]]; then
  mkdir -p "$cache"
  run="$(cd "$cache" && pwd)/run-h$hosts-e$events-s$steps-x$straggler"
else
  run="$work/run"
fi

# About 17 bytes per event of xplane.pb, and 12 of gzipped trace JSON.
need_kb=$(( hosts * events * (17 + 12) / 1024 ))
avail_kb=$(df -Pk "$(dirname "$run")" | awk 'NR == 2 { print $4 }')
if (( avail_kb < need_kb )); then
  echo "report_scale.sh: about $((need_kb / 1024)) MiB needed under $(dirname "$run"), $((avail_kb / 1024)) MiB free" >&2
  exit 2
fi

# make_run's summary line, beside the run (the run directory holds only what a capture writes);
# its presence marks a run written to the end.
summary="$run.make_run.out"
if [[ -f "$summary" && -d "$run" ]]; then
  echo "reusing $run"
else
  rm -rf "$run" "$summary"
  echo "generating $hosts hosts x $events events into $run"
  start=$(date +%s.%N)
  "$make_run" --hosts "$hosts" --events-per-host "$events" --steps "$steps" \
    --straggler "$straggler" --out "$run" 2> "$work/make_run.err" > "$work/make_run.out" ||
    { cat "$work/make_run.err" >&2; exit 1; }
  echo "generated in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s"
  mv "$work/make_run.out" "$summary"
fi
generated="$(cat "$summary")"
total_events=$(sed -n 's/.*events=\([0-9]*\).*/\1/p' <<< "$generated")
input_bytes=$(sed -n 's/.*bytes=\([0-9]*\).*/\1/p' <<< "$generated")
expected=$(sed -n 's/.*straggler=\([^ ]*\).*/\1/p' <<< "$generated")


echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)   $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "input: $hosts hosts, $total_events events, $input_bytes bytes of xplane.pb"

# The report.
/usr/bin/time -v -o "$work/report.time" "$clusterprof" report "$run" --json "$work/report.json" \
  --no-progress > "$work/report.txt" 2> "$work/report.err" ||
  { cat "$work/report.err" "$work/report.time" >&2; exit 1; }
report_wall=$(wall_seconds "$(time_field "$work/report.time" 'Elapsed (wall clock) time (h:mm:ss or m:ss)')")
report_rss_kb=$(time_field "$work/report.time" 'Maximum resident set size (kbytes)')
report_cpu=$(awk -v u="$(time_field "$work/report.time" 'User time (seconds)')" \
  -v s="$(time_field "$work/report.time" 'System time (seconds)')" 'BEGIN { printf "%.2f", u + s }')
# The report's JSON is one line; host names hold no quotes or commas (HostFileStem).
stragglers=$(sed -n 's/.*"stragglers":\[\([^]]*\)\].*/\1/p' "$work/report.json" | tr -d '"')
echo
echo "report: wall ${report_wall} s (cpu ${report_cpu} s), peak RSS $((report_rss_kb / 1024)) MiB," \
  "$(awk -v e="$total_events" -v w="$report_wall" 'BEGIN { printf "%.2f", e / w / 1e6 }') M events/s;" \
  "stragglers: ${stragglers:-none} (expected ${expected})"
echo "  target wall <= 20 s: $(verdict "$report_wall" '<=' 20);" \
  "peak RSS <= 512 MiB: $(verdict "$report_rss_kb" '<=' $((512 * 1024)))"
grep -m1 '^STRAGGLER\|^no straggler' "$work/report.txt" | sed 's/^/  /' || true

# One merged trace of every host.
/usr/bin/time -v -o "$work/convert.time" "$clusterprof" convert --run "$run" \
  -o "$work/merged.trace.json.gz" > "$work/convert.out" 2> "$work/convert.err" ||
  { cat "$work/convert.err" "$work/convert.time" >&2; exit 1; }
convert_wall=$(wall_seconds "$(time_field "$work/convert.time" 'Elapsed (wall clock) time (h:mm:ss or m:ss)')")
convert_rss_kb=$(time_field "$work/convert.time" 'Maximum resident set size (kbytes)')
convert_cpu=$(awk -v u="$(time_field "$work/convert.time" 'User time (seconds)')" \
  -v s="$(time_field "$work/convert.time" 'System time (seconds)')" 'BEGIN { printf "%.2f", u + s }')
convert_rate=$(awk -v e="$total_events" -v w="$convert_wall" 'BEGIN { printf "%.2f", e / w / 1e6 }')
output_bytes=$(stat -c %s "$work/merged.trace.json.gz")
echo
echo "convert --run: wall ${convert_wall} s (cpu ${convert_cpu} s), peak RSS $((convert_rss_kb / 1024)) MiB," \
  "${convert_rate} M events/s, merged.trace.json.gz ${output_bytes} bytes"
echo "  target >= 5 M events/s: $(verdict "$convert_rate" '>=' 5);" \
  "peak RSS <= 256 MiB: $(verdict "$convert_rss_kb" '<=' $((256 * 1024)))"
sed 's/^/  /' "$work/convert.out" "$work/convert.err"
if (( json_size )); then
  echo "  merged trace JSON: $(gzip -dc "$work/merged.trace.json.gz" | wc -c) bytes uncompressed"
fi

if [[ "$stragglers" != "$expected" && ! ( "$expected" == none && -z "$stragglers" ) ]]; then
  echo "report_scale.sh: the report named '${stragglers:-no straggler}', not $expected" >&2
  exit 1
fi
