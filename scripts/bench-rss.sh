#!/usr/bin/env bash
# P6: peak RSS of `archiver run` over a large stream ÷ over a small one;
# also each run's wall-clock and CPU seconds.
#
#   scripts/bench-rss.sh [SMALL] [LARGE]     (default 100000 10000000)
#   RUNS=3 (default): each size is measured RUNS times, interleaved, and the
#   ratio is that of the medians (one peak is a noisy maximum).
#
# Starts its own redis-server, appends each feed with `worker append`, then
# archives it all but one entry to a local-directory remote under
# /usr/bin/time -v and prints both peak RSS figures and their ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
small=${1:-100000}
large=${2:-10000000}
slice=${SLICE_ENTRIES:-10000} # entries per commit (the archiver's default)

SILT_SERVERS_DIR=$(mktemp -d)
export SILT_SERVERS_DIR
work=$(mktemp -d)
trap 'scripts/servers.sh stop; rm -rf "$work"' EXIT
eval "$(scripts/servers.sh start redis)"
export SILT_QUEUE=bench
go build -o bin/ ./cmd/worker ./cmd/archiver

peak() { # peak STREAM ENTRIES -> prints peak RSS in kB
	local name=$1 n=$2
	awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "{\"user\":\"u%d\",\"action\":\"login\",\"amount\":\"%d\"}\n", i, i % 1000 }' |
		bin/worker append --stream "$name" --batch 1000 >/dev/null
	/usr/bin/time -v bin/archiver run --stream "$name" --keep-last 1 --exact --data-dir "$work/$name" \
		--slice-entries "$slice" 2>"$work/$name.time" >"$work/$name.out"
	grep -q "\"archived\":$((n - 1))," "$work/$name.out" || { cat "$work/$name.out" "$work/$name.time" >&2; exit 1; }
	awk -F': ' '/Elapsed \(wall clock\)/ { w = $2 } /User time/ { u = $2 } /System time/ { s = $2 }
		END { printf "%s wall %s, cpu %.2f s\n", name, w, u + s }' name="$name" "$work/$name.time" >>"$work/times"
	awk -F: '/Maximum resident set size/ { gsub(/ /, "", $2); print $2 }' "$work/$name.time"
}

runs=${RUNS:-3}
smalls=() larges=()
for r in $(seq "$runs"); do
	smalls+=("$(peak "small$r" "$small")")
	larges+=("$(peak "large$r" "$large")")
	redis-cli -u "$SILT_REDIS_URL" del "emq:{bench}:stream:small$r" "emq:{bench}:stream:large$r" >/dev/null
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
rss_small=$(median "${smalls[@]}")
rss_large=$(median "${larges[@]}")
echo "slice entries  $slice"
echo "entries        peak RSS (kB), median of $runs: runs"
echo "$small         $rss_small: ${smalls[*]}"
echo "$large         $rss_large: ${larges[*]}"
awk -v a="$rss_large" -v b="$rss_small" 'BEGIN { printf "P6 ratio (large / small, medians): %.3f (goal <= 1.15)\n", a / b }'
echo "time of each run (small: $small entries, large: $large):"
cat "$work/times"
