#!/usr/bin/env bash
# gs:// upload throughput and memory: clusterprof's uploader (spool, resumable upload in chunks,
# CRC32C verified) against curl uploading the same bytes in one request, both to the GCS test
# server on loopback in the same run, alternating, and the uploader's peak RSS.
#
#   bench/gcs_upload.sh [--bytes N] [--runs R] [--chunk-bytes C] [--build-dir DIR]
#                       [--min-ratio F] [--max-rss-mib M]
#
# Defaults: 1 GiB, 3 runs each, 8 MiB chunks, build/. With two CPUs or more the server runs on
# the last CPU and each client on the first (taskset): left to the scheduler, a client sharing a
# CPU with the server ran at half speed in some runs and not others, whichever client it was. The uploader's time is its Commit(): fsync
# of the spool file, the upload, the CRC32C check; curl's is its whole transfer of the file
# (read from the page cache, as the uploader reads its spool file). With --min-ratio or
# --max-rss-mib it fails when the median ratio or the largest peak RSS misses.
set -euo pipefail
bytes=$((1 << 30))
runs=3
chunk=$((8 << 20))
min_ratio=""
max_rss=""
build_dir="$(cd "$(dirname "$0")/.." && pwd)/build"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bytes) bytes="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --chunk-bytes) chunk="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --min-ratio) min_ratio="$2"; shift 2 ;;
    --max-rss-mib) max_rss="$2"; shift 2 ;;
    *) echo "gcs_upload.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
command -v curl > /dev/null || { echo "gcs_upload.sh: curl is needed" >&2; exit 2; }
work="$(mktemp -d)"
server_pid=""
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2> /dev/null && wait "$server_pid" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/spool"

server_cpu=()
client_cpu=()
if command -v taskset > /dev/null && (( $(nproc) >= 2 )); then
  server_cpu=(taskset -c "$(( $(nproc) - 1 ))")
  client_cpu=(taskset -c 0)
fi

# The server keeps no bytes and computes no MD5 (it still checks CRC32C): storing 1 GiB costs it
# more than either client spends sending it, and the measure is of the clients.
"${server_cpu[@]}" "$build_dir/tests/gcs-test-server" --port 0 --port-file "$work/port" --bucket bench --no-md5 \
  --discard-data > "$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [[ -s "$work/port" ]] && break; sleep 0.05; done
port=$(cat "$work/port")
endpoint="http://127.0.0.1:$port"

# curl's payload: random bytes, as the uploader's (neither compresses on the wire).
head -c "$bytes" /dev/urandom > "$work/payload"

ours=()
theirs=()
ours_cpu=()
theirs_cpu=()
rss=()
sync
for run in $(seq "$runs"); do
  report=$(STORAGE_EMULATOR_HOST="$endpoint" "${client_cpu[@]}" "$build_dir/tests/gcs-upload" \
    --spool-dir "$work/spool" --uri "gs://bench/ours-$run" --bytes "$bytes" \
    --chunk-bytes "$chunk" --seed "$run" 2> "$work/upload.log" | tail -1)
  # Each upload starts with the disk quiet: the previous one's object deleted and written back.
  seconds=$(sed -E 's/.*"upload_seconds":([0-9.]+).*/\1/' <<< "$report")
  kib=$(sed -E 's/.*"max_rss_kib":([0-9]+).*/\1/' <<< "$report")
  ours_cpu+=("$(sed -E 's/.*"commit_cpu_seconds":([0-9.]+).*/\1/' <<< "$report")")
  grep -q '"state":"committed"' <<< "$report" || { echo "upload failed: $report" >&2; exit 1; }
  ours+=("$(awk -v b="$bytes" -v s="$seconds" 'BEGIN { printf "%.1f", b / s / 1048576 }')")
  rss+=("$((kib / 1024))")
  curl -sS -o /dev/null -X DELETE "$endpoint/storage/v1/b/bench/o/ours-$run"
  sync
  curl_out=$(/usr/bin/time -f '%U %S' -o "$work/curl.time" "${client_cpu[@]}" curl -sS -o /dev/null \
    -w '%{http_code} %{time_total}' -X POST -H 'Content-Type: application/octet-stream' \
    -T "$work/payload" "$endpoint/upload/storage/v1/b/bench/o?uploadType=media&name=curl-$run")
  read -r code curl_seconds <<< "$curl_out"
  theirs_cpu+=("$(awk '{ printf "%.3f", $1 + $2 }' "$work/curl.time")")
  [[ "$code" == 200 ]] || { echo "curl upload answered $code" >&2; exit 1; }
  curl -sS -o /dev/null -X DELETE "$endpoint/storage/v1/b/bench/o/curl-$run"
  sync
  theirs+=("$(awk -v b="$bytes" -v s="$curl_seconds" 'BEGIN { printf "%.1f", b / s / 1048576 }')")
  echo "run $run: clusterprof ${ours[-1]} MiB/s (${ours_cpu[-1]} s CPU, peak RSS ${rss[-1]} MiB)," \
    "curl ${theirs[-1]} MiB/s (${theirs_cpu[-1]} s CPU)"
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ours_median=$(median "${ours[@]}")
curl_median=$(median "${theirs[@]}")
ratio=$(awk -v a="$ours_median" -v b="$curl_median" 'BEGIN { printf "%.2f", a / b }')
max_rss_seen=$(printf '%s\n' "${rss[@]}" | sort -g | tail -1)
echo "bytes=$bytes chunk_bytes=$chunk runs=$runs"
echo "clusterprof_mib_s=$ours_median curl_mib_s=$curl_median ratio=$ratio peak_rss_mib=$max_rss_seen"
echo "best: clusterprof_mib_s=$(printf '%s\n' "${ours[@]}" | sort -g | tail -1)" \
  "curl_mib_s=$(printf '%s\n' "${theirs[@]}" | sort -g | tail -1);" \
  "median CPU seconds: clusterprof $(median "${ours_cpu[@]}") curl $(median "${theirs_cpu[@]}")"
if [[ -n "$min_ratio" ]] && awk -v r="$ratio" -v m="$min_ratio" 'BEGIN { exit !(r < m) }'; then
  echo "gcs_upload.sh: throughput ratio $ratio is under $min_ratio" >&2
  exit 1
fi
if [[ -n "$max_rss" ]] && (( max_rss_seen > max_rss )); then
  echo "gcs_upload.sh: peak RSS $max_rss_seen MiB is over $max_rss MiB" >&2
  exit 1
fi
