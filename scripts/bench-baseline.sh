#!/usr/bin/env bash
# Every benchmark ratio of this tree beside the same ratio of a baseline
# commit, measured in the same minutes: a figure that moved with the
# machine moves on both sides; one that moved with the code does not.
#
#   scripts/bench.sh --baseline REF [ROUNDS]    (the same as scripts/bench-baseline.sh REF [ROUNDS])
#
# Builds both trees' test binaries (REF in a temporary worktree), then runs
# each package's Ratio benchmarks in three passes that alternate the trees
# (this, REF; REF, this; this, REF), ROUNDS rounds a side in all (default
# 9). Prints the medians of the passes side by side and rewrites the
# "Against a baseline" block of BENCHMARKS.md. SILT_BENCH_PKGS limits the
# packages (default: every package with Ratio benchmarks but bench/). A
# benchmark REF does not have shows "-" on its side.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: scripts/bench-baseline.sh REF [ROUNDS]}
rounds=${2:-9}
passes=3
per=$(((rounds + passes - 1) / passes))
pkgs=${SILT_BENCH_PKGS:-./pkg/stream ./pkg/graft ./pkg/archive ./pkg/export ./cmd/worker}
refname=$(git rev-parse --short "$ref")
tmp=$(mktemp -d)
base=$tmp/base
SILT_SERVERS_DIR=$tmp/servers
mkdir -p "$SILT_SERVERS_DIR"
export SILT_SERVERS_DIR
cleanup() {
	scripts/servers.sh stop >/dev/null 2>&1 || true
	git worktree remove --force "$base" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
git worktree add -q --detach "$base" "$ref"
eval "$(scripts/servers.sh start minio)"

binary() { echo "$tmp/$1$(echo "$2" | tr '/.' '__').test"; }
for pkg in $pkgs; do
	go test -c -o "$(binary cur "$pkg")" "$pkg"
	(cd "$base" && go test -c -o "$(binary base "$pkg")" "$pkg") || echo "bench-baseline: $pkg does not build at $refname: its side stays empty" >&2
done

# side: cur or base; the binary runs in its own tree's package directory.
run() {
	local side=$1 pkg=$2 dir=.
	[ "$side" = base ] && dir=$base
	local bin
	bin=$(binary "$side" "$pkg")
	[ -x "$bin" ] || return 0
	(cd "$dir/$pkg" && "$bin" -test.run '^$' -test.bench 'Ratio$' -test.benchtime "${per}x" -test.timeout 60m) |
		sed "s/^Benchmark/$side Benchmark/" | tee -a "$tmp/out" >&2
}
for pass in $(seq 1 "$passes"); do
	for pkg in $pkgs; do
		if [ $((pass % 2)) = 1 ]; then
			run cur "$pkg"
			run base "$pkg"
		else
			run base "$pkg"
			run cur "$pkg"
		fi
	done
done

machine="$(date -u +%Y-%m-%d), $(nproc) cores, $(go version | cut -d' ' -f3), redis-server $(redis-server --version | grep -oE 'v=[0-9.]+' | cut -c3-)"
table=$(awk -v ref="$refname" '
function median(s,   n, a, i, j, t) {
	n = split(s, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
$2 ~ /^Benchmark.*Ratio/ {
	name = $2; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	r = ""; cpu = ""
	for (i = 3; i <= NF; i++) { if ($(i+1) == "ratio") r = $i; if ($(i+1) == "cpu-ratio") cpu = $i }
	add($1, name, r)
	if (cpu != "") add($1, name " (cpu)", cpu) # this process CPU per item, where the benchmark prints it
}
function add(side, name, v) {
	if (!(name in seen)) { seen[name] = 1; order[++k] = name }
	vals[side, name] = vals[side, name] " " v
}
END {
	print "| benchmark | this tree | " ref " | this ÷ " ref " |"
	print "|---|---|---|---|"
	for (i = 1; i <= k; i++) {
		n = order[i]; c = median(vals["cur", n]); b = ((("base", n) in vals) ? median(vals["base", n]) : "")
		printf "| %s | %.3g | %s | %s |\n", n, c, (b == "" ? "-" : sprintf("%.3g", b)), (b == "" || b == 0 ? "-" : sprintf("%.3g", c / b))
	}
}' "$tmp/out")
echo
echo "machine: $machine"
echo "$table"

block="<!-- bench-baseline: begin -->
\`scripts/bench.sh --baseline $refname $rounds\` on $machine, packages $pkgs (medians of $passes alternating passes of $per rounds a side):

$table
<!-- bench-baseline: end -->"
BLOCK=$block awk 'BEGIN { b = ENVIRON["BLOCK"] } /<!-- bench-baseline: begin -->/ { print b; skip = 1; next } /<!-- bench-baseline: end -->/ { skip = 0; next } !skip' BENCHMARKS.md >BENCHMARKS.md.new
mv BENCHMARKS.md.new BENCHMARKS.md
echo "BENCHMARKS.md: the baseline block rewritten"
