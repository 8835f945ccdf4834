#!/usr/bin/env bash
# The HTML report at scale: the size of the page `clusterprof report --html` writes for a
# synthetic run (tests/analysis/write_synthetic_run.cc: N hosts, one computing 30% slower), and
# how long headless Chromium takes to paint it (tests/analysis/report_html_browser.py: first
# contentful paint, and the second frame after the load event, when every chart is drawn), the
# median of --runs page loads. It also fails when the page logs an error or makes a request.
#
#   bench/report_html.sh [--build-dir DIR] [--hosts N] [--steps N] [--runs N]
#
# Defaults (the issue's targets): 64 hosts x 1,000 steps, 3 loads, build/; targets: <= 5 MiB and
# every chart drawn within 2 s, printed as met or not met (the time depends on the machine and its
# load). It builds nothing: cmake --build build --target clusterprof write-synthetic-run.
# Exits 77 when Chromium is not installed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build_dir="$here/../build"
hosts=64
steps=1000
runs=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    *) echo "report_html.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
clusterprof="$build_dir/cli/clusterprof"
write_run="$build_dir/tests/write-synthetic-run"
browser="$here/../tests/analysis/report_html_browser.py"
for tool in "$clusterprof" "$write_run"; do
  if [[ ! -x "$tool" ]]; then
    echo "report_html.sh: $tool is missing: cmake --build $build_dir --target clusterprof write-synthetic-run" >&2
    exit 2
  fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/run"
"$write_run" --hosts "$hosts" --steps "$steps" --slow-host $((hosts / 2)) --compute-scale 1.3 \
  --out "$work/run"
start=$(date +%s.%N)
"$clusterprof" report "$work/run" --no-progress --html "$work/report.html" > "$work/report.txt"
end=$(date +%s.%N)
bytes=$(stat -c %s "$work/report.html")
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)   $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "report --html: $hosts hosts x $steps steps in $(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", e - s }') s"
grep -m1 '^STRAGGLER\|^no straggler' "$work/report.txt" | sed 's/^/  /' || true
echo "page: $bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1048576 }') MiB);" \
  "target <= 5 MiB: $(awk -v b="$bytes" 'BEGIN { print b <= 5 * 1048576 ? "met" : "NOT met" }')"

for ((i = 1; i <= runs; i++)); do
  status=0
  python3 "$browser" "$work/report.html" --expect-rows "$hosts" > "$work/seen.$i.json" || status=$?
  if [[ $status -ne 0 ]]; then
    [[ $status -eq 77 ]] || cat "$work/seen.$i.json" >&2
    exit "$status"
  fi
done
# The median of each timing over the loads.
python3 - "$work" "$runs" <<'PY'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
seen = [json.load(open(f"{work}/seen.{i}.json"))["timings"] for i in range(1, runs + 1)]
median = {k: statistics.median(s[k] for s in seen) for k in seen[0]}
print(f"headless Chromium, median of {runs} loads: first contentful paint "
      f"{median['first_contentful_paint_ms']:.0f} ms, DOMContentLoaded "
      f"{median['dom_content_loaded_ms']:.0f} ms, load event {median['load_event_end_ms']:.0f} ms, "
      f"every chart drawn {median['drawn_frame_ms']:.0f} ms; target <= 2000 ms: "
      f"{'met' if median['drawn_frame_ms'] <= 2000 else 'NOT met'}")
PY
