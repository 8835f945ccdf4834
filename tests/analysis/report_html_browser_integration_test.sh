#!/usr/bin/env bash
# The HTML report in a real browser (report_html_browser.py drives headless Chromium): a synthetic
# run of 6 hosts, host-4 computing 15% slower, through `clusterprof report --html`: no console
# error, no request, the callout names host-4, a row per host and no band, lateness the view as
# loaded, host-4 the slowest at the top op. (10,000 hosts:
# report_html_scale_browser_integration_test.sh.)
# Then pages at the edges, which must draw without an error too: hosts with different steps and
# an unreadable host file; a run in which no host has steps. The pages and the first one's
# screenshot stay in ARTIFACTS_DIR (report_html*.html, report_html.png). Exits 77 (skipped) when
# Chromium is not installed.
#
#   report_html_browser_integration_test.sh CLUSTERPROF WRITE_SYNTHETIC_RUN ARTIFACTS_DIR
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 CLUSTERPROF WRITE_SYNTHETIC_RUN ARTIFACTS_DIR" >&2
  exit 2
fi
clusterprof="$1" write_run="$2" artifacts="$3"
browser="$(cd "$(dirname "$0")" && pwd)/report_html_browser.py"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts" "$work/run" "$work/edge"

"$write_run" --hosts 6 --steps 60 --slow-host 4 --compute-scale 1.15 --out "$work/run"
"$clusterprof" report "$work/run" --no-progress --html "$artifacts/report_html.html"
# Six hosts: each its own row everywhere, no band; lateness first, as step times are alike.
python3 "$browser" "$artifacts/report_html.html" --expect-straggler host-4 --expect-rows 6 \
  --expect-bands 0 --expect-metric lateness --expect-slowest host-4 \
  --screenshot "$artifacts/report_html.png"

# host-0 and host-1 are written again with 40 steps: host-2 has 20 steps they lack.
"$write_run" --hosts 3 --steps 60 --out "$work/edge"
"$write_run" --hosts 2 --steps 40 --out "$work/edge"
printf 'not a trace' > "$work/edge/host-3.xplane.pb"
"$clusterprof" report "$work/edge" --no-progress --html "$artifacts/report_html_edge.html"
python3 "$browser" "$artifacts/report_html_edge.html" --expect-rows 3

# No host has steps: the command fails, and still writes the page.
if "$clusterprof" report "$work/edge" --no-progress --step-pattern '^no such step$' \
     --html "$artifacts/report_html_empty.html"; then
  echo "clusterprof report succeeded without steps" >&2
  exit 1
fi
python3 "$browser" "$artifacts/report_html_empty.html" --expect-rows 0
