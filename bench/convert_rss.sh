#!/usr/bin/env bash
# Peak RSS and wall time of `clusterprof convert` on a synthetic XSpace, with the sizes of the
# input, the JSON it streams and the gzip file it writes.
#
#   bench/convert_rss.sh [--events N] [--build-dir DIR] [--max-rss-fraction F]
#
# Defaults: 10,000,000 events, build/. With --max-rss-fraction, fails when the peak RSS exceeds
# F times the size of the .xplane.pb (parsing it whole takes about 5x; streaming takes a few MB).
set -euo pipefail
events=10000000
max_fraction=""
build_dir="$(cd "$(dirname "$0")/.." && pwd)/build"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --events) events="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --max-rss-fraction) max_fraction="$2"; shift 2 ;;
    *) echo "convert_rss.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$build_dir/bench/make_xspace" --events "$events" --threads 16 -o "$work/big.xplane.pb"
/usr/bin/time -f "%M %e" -o "$work/time" \
  "$build_dir/cli/clusterprof" convert "$work/big.xplane.pb" -o "$work/big.trace.json.gz"
read -r rss_kb seconds < "$work/time"
input_bytes=$(stat -c %s "$work/big.xplane.pb")
output_bytes=$(stat -c %s "$work/big.trace.json.gz")
json_bytes=$(gzip -dc "$work/big.trace.json.gz" | wc -c)
echo "events=$events xplane_bytes=$input_bytes json_bytes=$json_bytes gzip_bytes=$output_bytes"
echo "peak_rss_mib=$((rss_kb / 1024)) wall_s=$seconds"
if [[ -n "$max_fraction" ]] &&
   awk -v rss="$((rss_kb * 1024))" -v size="$input_bytes" -v f="$max_fraction" 'BEGIN { exit !(rss > size * f) }'; then
  echo "convert_rss.sh: peak RSS $((rss_kb / 1024)) MiB is over $max_fraction x the input ($input_bytes bytes)" >&2
  exit 1
fi
