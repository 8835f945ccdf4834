#!/usr/bin/env bash
# The report of 10,000 hosts: make_run --digests hands 10,000 synthetic digests of 100 steps
# (trainer-5000 computing 30% slower) to the report one host at a time, as the coordinator does.
# The terminal table is the 20 worst hosts and one line for the rest; the JSON has every host's
# verdict; the HTML page stays under 10 MB and, in headless Chromium (report_html_browser.py),
# draws without a console error or a request: the straggler named in the callout and first of the
# heatmap's 24 host rows, the others as 6 percentile bands, lateness the view as loaded (step times
# are alike). No timing is checked here (bench/report_scale.sh --digests measures). The page and
# its screenshot stay in ARTIFACTS_DIR (report_html_10k.html, report_html_10k.png). Exits 77
# (skipped) when Chromium is not installed.
#
#   report_html_scale_browser_integration_test.sh MAKE_RUN ARTIFACTS_DIR
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 MAKE_RUN ARTIFACTS_DIR" >&2
  exit 2
fi
make_run="$1" artifacts="$2"
browser="$(cd "$(dirname "$0")" && pwd)/report_html_browser.py"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"

"$make_run" --digests --hosts 10000 --steps 100 --straggler 5000 --out "$work/run" > /dev/null
cp "$work/run/clusterprof_report.html" "$artifacts/report_html_10k.html"

lines=$(wc -l < "$work/run/report.txt")
if (( lines > 40 )); then
  echo "the terminal report of 10,000 hosts has $lines lines:" >&2
  head -40 "$work/run/report.txt" >&2
  exit 1
fi
grep -q '^STRAGGLER trainer-5000 (compute)' "$work/run/report.txt" ||
  { echo "the terminal report does not name trainer-5000:" >&2; cat "$work/run/report.txt" >&2; exit 1; }
grep -q '^  \.\.\. 9980 more hosts .*(--all lists every host)$' "$work/run/report.txt" ||
  { echo "no summary line for the other hosts:" >&2; cat "$work/run/report.txt" >&2; exit 1; }

hosts_in_json=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["hosts"]))' \
  "$work/run/clusterprof_report.json")
if [[ "$hosts_in_json" != 10000 ]]; then
  echo "the JSON report has $hosts_in_json hosts, not 10000" >&2
  exit 1
fi

bytes=$(stat -c %s "$work/run/clusterprof_report.html")
if (( bytes > 10 * 1024 * 1024 )); then
  echo "the page of 10,000 hosts is $bytes bytes, over 10 MiB" >&2
  exit 1
fi

python3 "$browser" "$artifacts/report_html_10k.html" --expect-straggler trainer-5000 \
  --expect-rows 24 --expect-bands 6 --expect-first-row trainer-5000 --expect-metric lateness \
  --expect-slowest trainer-5000 --screenshot "$artifacts/report_html_10k.png"
