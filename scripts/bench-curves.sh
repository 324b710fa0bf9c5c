#!/usr/bin/env bash
# Scaling curves (BENCHMARKS.md): archive throughput and peak RSS at each
# stream size, merged-read latency of a 1,000-entry window at each archive
# size, and worker throughput at concurrency 1, 4 and 16 with a 1 ms
# handler. Prints the tables, rewrites the curves block of BENCHMARKS.md and
# draws docs/bench-*.png.
#
#   scripts/bench-curves.sh [SIZES...]      (default 100000 1000000 10000000)
#
# Starts its own redis-server. The 10M step takes a few minutes and about
# 3 GB of memory in redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(100000 1000000 10000000)

SILT_SERVERS_DIR=$(mktemp -d)
export SILT_SERVERS_DIR
work=$(mktemp -d)
trap 'scripts/servers.sh stop; rm -rf "$work"' EXIT
eval "$(scripts/servers.sh start redis)"
export SILT_QUEUE=curves
go build -o "$work/bin/" ./cmd/worker ./cmd/archiver
bin=$work/bin

ms() { date +%s%3N; }
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

archive_rows=() read_rows=()
for n in "${sizes[@]}"; do
	name=s$n
	# Every 1,000th id and the one before the next: the bounds of 1,000-entry windows.
	awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "{\"user\":\"u%d\",\"action\":\"login\",\"amount\":\"%d\"}\n", i, i % 1000 }' |
		"$bin/worker" append --stream "$name" --batch 1000 | awk 'NR % 1000 == 1 || NR % 1000 == 0' >"$work/$name.ids"
	/usr/bin/time -v "$bin/archiver" run --stream "$name" --keep-last 1 --exact --data-dir "$work/$name" \
		>"$work/$name.out" 2>"$work/$name.time"
	secs=$(grep -oE '"elapsed_seconds":[0-9.]+' "$work/$name.out" | cut -d: -f2)
	archived=$(grep -oE '"archived":[0-9]+' "$work/$name.out" | head -1 | cut -d: -f2)
	[ "$archived" = $((n - 1)) ] || { cat "$work/$name.out" "$work/$name.time" >&2; exit 1; }
	rss=$(awk -F: '/Maximum resident set size/ { gsub(/ /, "", $2); print $2 }' "$work/$name.time")
	rate=$(awk -v a="$archived" -v s="$secs" 'BEGIN { printf "%.0f", a / s }')
	archive_rows+=("$n $rate $rss")
	# Five windows at evenly spread places of the archive, each read by a fresh process.
	windows=$(($(wc -l <"$work/$name.ids") / 2 - 1))
	lat=()
	for k in 1 2 3 4 5; do
		w=$((k * windows / 6))
		from=$(sed -n "$((2 * w + 1))p" "$work/$name.ids")
		to=$(sed -n "$((2 * w + 2))p" "$work/$name.ids")
		t0=$(ms)
		got=$("$bin/archiver" read --stream "$name" --data-dir "$work/$name" --from "$from" --to "$to" | wc -l)
		t1=$(ms)
		[ "$got" = 1000 ] || { echo "window $from..$to read $got entries" >&2; exit 1; }
		lat+=($((t1 - t0)))
	done
	read_rows+=("$n $(printf '%s\n' "${lat[@]}" | median)")
	redis-cli -u "$SILT_REDIS_URL" del "emq:{curves}:stream:$name" >/dev/null # free the memory for the next size
done

conc=$(go test -run '^$' -bench 'Consumer_Concurrency' -benchtime 3x ./pkg/stream | awk '/Concurrency\/c/ {
	name = $1; sub(/.*\/c/, "", name); sub(/-[0-9]+$/, "", name)
	for (i = 1; i <= NF; i++) { if ($(i+1) == "entries/s") r = $i; if ($(i+1) == "ratio-to-ideal") q = $i }
	print name, r, q }')

{
echo "| entries | archive entries/s | peak RSS (kB) |"
echo "|---|---|---|"
for r in "${archive_rows[@]}"; do set -- $r; echo "| $1 | $2 | $3 |"; done
echo
echo "| archive size | merged read of a 1,000-entry window, median of 5 (ms, whole process) |"
echo "|---|---|"
for r in "${read_rows[@]}"; do set -- $r; echo "| $1 | $2 |"; done
echo
echo "| concurrency | worker entries/s (1 ms handler) | ratio to the ideal (concurrency × 1,000/s) |"
echo "|---|---|---|"
echo "$conc" | while read -r c r q; do echo "| $c | $r | $q |"; done
} | tee "$work/tables.md"
machine="$(date -u +%Y-%m-%d) ($(nproc) cores, $(go version | cut -d' ' -f3), redis-server $(redis-server --version | grep -oE 'v=[0-9.]+' | cut -c3-))"
block="<!-- curves: begin -->
Measured $machine:

$(cat "$work/tables.md")
<!-- curves: end -->"
BLOCK=$block awk 'BEGIN { b = ENVIRON["BLOCK"] } /<!-- curves: begin -->/ { print b; skip = 1; next } /<!-- curves: end -->/ { skip = 0; next } !skip' BENCHMARKS.md >BENCHMARKS.md.new
mv BENCHMARKS.md.new BENCHMARKS.md

points() { # points COLUMN ROWS... -> [[x,y],...]
	local col=$1 out="" sep=""
	shift
	for r in "$@"; do set -- $r; out="$out$sep[$1,${!col}]"; sep=","; done
	echo "[$out]"
}
mapfile -t conc_rows <<<"$conc"
cat >"$work/charts.json" <<JSON
[
 {"file": "bench-archive-throughput.png", "title": "archiver run: entries/s by stream size", "xlabel": "entries archived (log)", "ylabel": "entries/s", "logx": true,
  "series": [{"name": "archive throughput", "points": $(points 2 "${archive_rows[@]}")}]},
 {"file": "bench-archive-rss.png", "title": "archiver run: peak RSS by stream size", "xlabel": "entries archived (log)", "ylabel": "peak RSS (kB)", "logx": true,
  "series": [{"name": "peak RSS", "points": $(points 3 "${archive_rows[@]}")}]},
 {"file": "bench-merged-read.png", "title": "merged read of a 1,000-entry window by archive size", "xlabel": "entries in the archive (log)", "ylabel": "ms (whole process)", "logx": true,
  "series": [{"name": "median of 5 windows", "points": $(points 2 "${read_rows[@]}")}]},
 {"file": "bench-worker-concurrency.png", "title": "worker throughput by concurrency, 1 ms handler", "xlabel": "concurrency (log)", "ylabel": "entries/s", "logx": true,
  "series": [{"name": "worker", "points": $(points 2 "${conc_rows[@]}")},
             {"name": "ideal (concurrency x 1000/s)", "points": [[1,1000],[4,4000],[16,16000]]}]}
]
JSON
(cd bench && go run ./curves -out ../docs "$work/charts.json")
echo
echo "charts: docs/bench-archive-throughput.png docs/bench-archive-rss.png docs/bench-merged-read.png docs/bench-worker-concurrency.png"
