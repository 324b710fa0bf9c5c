#!/usr/bin/env bash
# Every benchmark ratio in RUNS whole runs of scripts/bench.sh, one after the
# other: a goal holds when it is met in each run, not in one lucky run.
#
#   scripts/bench.sh --runs RUNS [ROUNDS]    (the same as scripts/bench-runs.sh RUNS [ROUNDS])
#
# Each run is `scripts/bench.sh ROUNDS` (default 9 rounds a ratio), which
# rewrites the "Current figures" block with its own table, so that block
# holds the last run's. Then prints each row's median run by run, the
# goal and in how many runs it was met, and rewrites the "Run after run"
# block of BENCHMARKS.md with that table.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:?usage: scripts/bench-runs.sh RUNS [ROUNDS]}
rounds=${2:-9}
for n in "$runs" "$rounds"; do
	case $n in
	'' | *[!0-9]* | 0) echo "bench-runs: RUNS and ROUNDS are whole numbers above 0, not '$n' (usage: scripts/bench-runs.sh RUNS [ROUNDS])" >&2; exit 2 ;;
	esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for i in $(seq 1 "$runs"); do
	echo "bench-runs: run $i of $runs" >&2
	scripts/bench.sh "$rounds" >"$tmp/run$i"
done

machine=$(sed -n 's/^machine: //p' "$tmp/run$runs") # as the last run printed it
# The rows of each run's table (bench.sh prints it after "machine:"), joined
# on their id in the first run's order.
table=$(awk -v runs="$runs" '
function trim(s) { gsub(/^ +| +$/, "", s); return s }
FNR == 1 { run++ }
/^machine:/ { in_table = 1; next }
!in_table || !/^\| / || /^\| id \|/ || /^\|---/ { next }
{
	n = split($0, f, "|")
	id = trim(f[2])
	if (!(id in seen)) { seen[id] = 1; order[++ids] = id; goal[id] = trim(f[6]) }
	median[id, run] = trim(f[3])
	if (trim(f[7]) != "") { judged[id]++; if (trim(f[7]) == "yes") met[id]++ }
}
END {
	head = "| id |"; rule = "|---|"
	for (r = 1; r <= runs; r++) { head = head " run " r " |"; rule = rule "---|" }
	print head " goal | met in |"
	print rule "---|---|"
	for (i = 1; i <= ids; i++) {
		id = order[i]; line = "| " id " |"
		for (r = 1; r <= runs; r++) line = line " " ((id, r) in median ? median[id, r] : "-") " |"
		m = (id in judged) ? sprintf("%d of %d", met[id] + 0, judged[id]) : ""
		print line " " goal[id] " | " m " |"
	}
}' $(for i in $(seq 1 "$runs"); do echo "$tmp/run$i"; done))

echo
echo "machine: $machine"
echo "$table"

block="<!-- bench-runs: begin -->
\`scripts/bench.sh --runs $runs $rounds\` on $machine (each run's median of $rounds interleaved rounds a ratio; P13 and P1b: $(((rounds + 1) / 2))):

$table
<!-- bench-runs: end -->"
BLOCK=$block awk 'BEGIN { b = ENVIRON["BLOCK"] } /<!-- bench-runs: begin -->/ { print b; skip = 1; next } /<!-- bench-runs: end -->/ { skip = 0; next } !skip' BENCHMARKS.md >BENCHMARKS.md.new
mv BENCHMARKS.md.new BENCHMARKS.md
echo "BENCHMARKS.md: run after run rewritten"
