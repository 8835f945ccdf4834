#!/usr/bin/env bash
# Peak RSS and wall time of `clusterprof convert` on a synthetic XSpace, with the sizes of the
# input, the trace it streams and the file it writes.
#
#   bench/convert_rss.sh [--events N] [--format json|perfetto] [--build-dir DIR]
#                        [--max-rss-fraction F]
#   bench/convert_rss.sh --run-hosts H [--events N] [--format json|perfetto] [--max-rss-mib M]
#
# Defaults: 10,000,000 events, json (gzipped .trace.json.gz), build/. With --format perfetto the
# output is an uncompressed .perfetto-trace and its gzip -1 size is measured too. With
# --max-rss-fraction, fails when the peak RSS exceeds F times the size of the .xplane.pb (parsing
# it whole takes about 5x; streaming takes a few MB).
#
# --run-hosts H writes a run directory of H hosts with N events each (bench/make_run: a
# data-parallel training job, clock offsets in its manifest, launches tied to kernels and NVML
# counters: --gpu-detail) and measures `convert --run` merging every host into one trace; --max-rss-mib M fails when its peak RSS is over M MiB. The 64-host
# figure of bench/RESULTS.md ("Perfetto's native format"):
#
#   bench/convert_rss.sh --run-hosts 64 --events 1000000 --format perfetto --max-rss-mib 512
set -euo pipefail
events=10000000
format=json
hosts=0
max_fraction=""
max_rss_mib=""
build_dir="$(cd "$(dirname "$0")/.." && pwd)/build"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --events) events="$2"; shift 2 ;;
    --format) format="$2"; shift 2 ;;
    --run-hosts) hosts="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --max-rss-fraction) max_fraction="$2"; shift 2 ;;
    --max-rss-mib) max_rss_mib="$2"; shift 2 ;;
    *) echo "convert_rss.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$format" in
  json) output_name=trace.json.gz ;;
  perfetto) output_name=perfetto-trace ;;
  *) echo "convert_rss.sh: --format is json or perfetto" >&2; exit 2 ;;
esac
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if (( hosts > 0 )); then
  "$build_dir/bench/make_run" --hosts "$hosts" --events-per-host "$events" --steps 200 \
    --gpu-detail --out "$work/run" > "$work/make_run.out" 2> /dev/null
  input_bytes=$(cat "$work"/run/*.xplane.pb | wc -c)
  input="$work/run"
  convert_args=(convert --run --format "$format" "$work/run" -o "$work/out.$output_name")
  total_events=$(sed -n 's/.*events=\([0-9]*\).*/\1/p' "$work/make_run.out")
else
  "$build_dir/bench/make_xspace" --events "$events" --threads 16 -o "$work/big.xplane.pb"
  input_bytes=$(stat -c %s "$work/big.xplane.pb")
  input="$work/big.xplane.pb"
  convert_args=(convert --format "$format" "$input" -o "$work/out.$output_name")
  total_events=$events
fi
/usr/bin/time -f "%M %e %U %S" -o "$work/time" "$build_dir/cli/clusterprof" "${convert_args[@]}" \
  > "$work/convert.out"
read -r rss_kb seconds user_s sys_s < "$work/time"
output_bytes=$(stat -c %s "$work/out.$output_name")
if [[ "$format" == json ]]; then
  trace_bytes=$(gzip -dc "$work/out.$output_name" | wc -c)
  echo "events=$total_events xplane_bytes=$input_bytes json_bytes=$trace_bytes gzip_bytes=$output_bytes"
else
  gzip_bytes=$(gzip -1 -c "$work/out.$output_name" | wc -c)
  echo "events=$total_events xplane_bytes=$input_bytes perfetto_bytes=$output_bytes gzip1_bytes=$gzip_bytes"
fi
echo "peak_rss_mib=$((rss_kb / 1024)) wall_s=$seconds cpu_s=$(awk -v u="$user_s" -v s="$sys_s" 'BEGIN { print u + s }')" \
  "events_per_s=$(awk -v e="$total_events" -v w="$seconds" 'BEGIN { printf "%.2fM", e / w / 1e6 }')"
sed 's/^/  /' "$work/convert.out"
if [[ -n "$max_fraction" ]] &&
   awk -v rss="$((rss_kb * 1024))" -v size="$input_bytes" -v f="$max_fraction" 'BEGIN { exit !(rss > size * f) }'; then
  echo "convert_rss.sh: peak RSS $((rss_kb / 1024)) MiB is over $max_fraction x the input ($input_bytes bytes)" >&2
  exit 1
fi
if [[ -n "$max_rss_mib" ]] && (( rss_kb > max_rss_mib * 1024 )); then
  echo "convert_rss.sh: peak RSS $((rss_kb / 1024)) MiB is over $max_rss_mib MiB" >&2
  exit 1
fi
