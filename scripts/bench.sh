#!/usr/bin/env bash
# Every benchmark ratio in one run, printed as a markdown table.
#
#   scripts/bench.sh [ROUNDS]        (default 9 interleaved rounds per ratio)
#   SILT_BENCH_RSS=1 scripts/bench.sh   also P6 (peak RSS at 10M / 100k entries; minutes)
#
# Starts its own MinIO (the benchmarks start their own redis-servers).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-9}

SILT_SERVERS_DIR=$(mktemp -d)
export SILT_SERVERS_DIR
out=$(mktemp)
trap 'scripts/servers.sh stop; rm -f "$out"' EXIT
eval "$(scripts/servers.sh start minio)"

go test -run '^$' -bench 'Ratio$' -benchtime "${rounds}x" ./pkg/... | tee "$out" >&2
go test -count=1 -run 'TestVolume_RequestsPerCommit' -v ./pkg/graft | grep 'requests per commit' | tee -a "$out" >&2

echo
echo "machine: $(nproc) cores, $(go version | cut -d' ' -f3), redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2)"
echo
echo "| benchmark | median ratio | min | max | rounds |"
echo "|---|---|---|---|---|"
awk '/^Benchmark.*ratio/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	for (i = 1; i <= NF; i++) {
		if ($(i+1) == "ratio") r = $i
		if ($(i+1) == "ratio-min") lo = $i
		if ($(i+1) == "ratio-max") hi = $i
	}
	printf "| %s | %s | %s | %s | %s |\n", name, r, lo, hi, $2
}' "$out"
awk '/requests per commit/ { sub(/.*requests per commit: /, ""); print "| P7 requests per commit (creates, gets, lists) | " $0 " | | | 20 commits |" }' "$out"
if [ -n "${SILT_BENCH_RSS:-}" ]; then
	scripts/bench-rss.sh | tail -n 1
fi
