#!/usr/bin/env bash
# Every benchmark ratio in one run: prints the table and rewrites the
# "Current figures" block of BENCHMARKS.md.
#
#   scripts/bench.sh [ROUNDS]            (default 9 interleaved rounds per ratio)
#   SILT_BENCH_RSS=1 scripts/bench.sh    also P6 (peak RSS at 10M / 100k entries; minutes)
#   scripts/bench.sh --baseline REF [ROUNDS]   each ratio beside REF's, in the same minutes
#   scripts/bench.sh --table LOG [ROUNDS]      the table again from a run's saved stderr
#   scripts/bench.sh --runs RUNS [ROUNDS]      RUNS whole runs, each row's median run by run (scripts/bench-runs.sh)
#
# Starts its own MinIO (the benchmarks start their own redis-servers).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --baseline ]; then # each ratio beside a baseline commit's (scripts/bench-baseline.sh)
	shift
	exec scripts/bench-baseline.sh "$@"
fi
if [ "${1:-}" = --runs ]; then # whole runs one after the other, each row run by run
	shift
	exec scripts/bench-runs.sh "$@"
fi
if [ "${1:-}" = --table ]; then # the table again from a saved run's output (this script's stderr)
	out=$2
	rounds=${3:-9}
	rss=$(grep -h 'P6 ratio' "$out" | tail -n 1 || true)
else
	rounds=${1:-9}

	SILT_SERVERS_DIR=$(mktemp -d)
	export SILT_SERVERS_DIR
	out=$(mktemp)
	trap 'scripts/servers.sh stop; rm -f "$out"' EXIT
	eval "$(scripts/servers.sh start minio)"
	eval "$(scripts/clients.sh --bench)" # BullMQ, the peer of P13

	go test -run '^$' -bench 'Ratio$|Archive_Steps' -benchtime "${rounds}x" -timeout 60m ./pkg/... ./cmd/... | tee "$out" >&2
	(cd bench && go test -run '^$' -bench 'Ratio$' -benchtime "$(((rounds + 1) / 2))x" -timeout 60m ./peers) | tee -a "$out" >&2
	go test -count=1 -run 'TestVolume_RequestsPerCommit' -v ./pkg/graft | grep 'requests per commit' | tee -a "$out" >&2
	rss=""
	if [ -n "${SILT_BENCH_RSS:-}" ]; then
		rss=$(scripts/bench-rss.sh | tee /dev/stderr | tail -n 1)
	fi
fi

machine="$(date -u +%Y-%m-%d), $(nproc) cores, $(go version | cut -d' ' -f3), redis-server $(redis-server --version | grep -oE 'v=[0-9.]+' | cut -c3-)"
table=$(awk -v rounds="$rounds" '
BEGIN {
	id["Consumer_Ratio"] = "P1";            goal["P1"] = ">= 0.85"; cmd["P1"] = "-bench Consumer_Ratio ./pkg/stream"
	id["WorkerVsWatermill_Ratio/silt"] = "P1b";  goal["P1b"] = ">= 25";  cmd["P1b"] = "-bench WorkerVsWatermill_Ratio ./peers (in bench/)"
	# the ceiling of P1b: the raw loop of P1 timed beside each round of watermill (bench/peers/watermill_test.go)
	k = "P1b ceiling (raw loop ÷ watermill)"; id["WorkerVsWatermill_Ratio/silt reachable"] = k; goal[k] = "none"; cmd[k] = "the same (the raw loop beside each of watermill'"'"'s rounds)"
	k = "P1b ÷ raw loop"; id["WorkerVsWatermill_Ratio/silt of-floor"] = k; goal[k] = "none"; cmd[k] = "the same"
	id["AppendBatch_Ratio/silt"] = "P2";    goal["P2"] = ">= 0.8";  cmd["P2"] = "-bench AppendBatch_Ratio ./pkg/stream"
	id["AppendBatch_Ratio/multi-ceiling"] = "P2 ceiling (MULTI/EXEC ÷ raw)";  goal["P2 ceiling (MULTI/EXEC ÷ raw)"] = "none";  cmd["P2 ceiling (MULTI/EXEC ÷ raw)"] = "the same"
	id["Archive_Ratio"] = "P3";             goal["P3"] = ">= 0.85";  cmd["P3"] = "-bench Archive_Ratio ./pkg/archive (MinIO)"
	id["Upload_Ratio"] = "P4";              goal["P4"] = ">= 0.85";  cmd["P4"] = "-bench Upload_Ratio ./pkg/graft (MinIO)"
	id["MergedRead_Ratio"] = "P5";          goal["P5"] = ">= 1.0";  cmd["P5"] = "-bench MergedRead_Ratio ./pkg/archive"
	id["DeadPeerRecovery_Ratio"] = "P8";    goal["P8"] = "<= 1.2";  cmd["P8"] = "-bench DeadPeerRecovery_Ratio ./pkg/stream"
	id["Metrics_Ratio"] = "P1m";            goal["P1m"] = ">= 0.95"; cmd["P1m"] = "-bench Metrics_Ratio ./cmd/worker"
	id["Latency_Ratio/steady"] = "P9";      goal["P9"] = "<= 1.2";   cmd["P9"] = "-bench Latency_Ratio ./pkg/stream (p99 worker ÷ raw BLOCK loop, 1,000/s)"
	id["Latency_Ratio/burst"] = "P9 burst"; goal["P9 burst"] = "<= 1.2"; cmd["P9 burst"] = "the same, bursts of 200"
	id["Pipe_Ratio/stdout"] = "P10 wall";   goal["P10 wall"] = "none";  cmd["P10 wall"] = "-bench Pipe_Ratio ./cmd/worker (wall clock, printed beside P10 cpu: the co-process, the user'"'"'s code, shares the cores)"
	id["Pipe_Ratio/stdout cpu"] = "P10 cpu"; goal["P10 cpu"] = "<= 2";  cmd["P10 cpu"] = "the same (the worker'"'"'s own CPU per entry, --pipe ÷ --stdout)"
	id["Pipe_Ratio/exec"] = "P10b";         goal["P10b"] = ">= 50";  cmd["P10b"] = "the same"
	id["ConsumerStrong_Ratio"] = "P11";     goal["P11"] = ">= 0.9";  cmd["P11"] = "-bench ConsumerStrong_Ratio ./pkg/stream"
	id["ConsumerStrong_Ratio cpu"] = "P11 cpu (this process per entry, silt ÷ raw)"; goal["P11 cpu (this process per entry, silt ÷ raw)"] = "none"; cmd["P11 cpu (this process per entry, silt ÷ raw)"] = "the same"
	id["Webhook_Ratio"] = "P12";            goal["P12"] = ">= 0.8";  cmd["P12"] = "-bench Webhook_Ratio ./cmd/worker"
	id["Export_Ratio"] = "X1";              goal["X1"] = ">= 0.5";  cmd["X1"] = "-bench Export_Ratio ./pkg/export"
	id["Compaction_Ratio"] = "D5";          goal["D5"] = ">= 0.7";  cmd["D5"] = "-bench Compaction_Ratio ./pkg/graft (MinIO)"
	id["SegmentWrite_Ratio"] = "seg";       goal["seg"] = "none";   cmd["seg"] = "-bench SegmentWrite_Ratio ./pkg/graft"
	id["GC_Ratio/serial"] = "gc (÷ serial deletes)"; goal["gc (÷ serial deletes)"] = "none"; cmd["gc (÷ serial deletes)"] = "-bench GC_Ratio ./pkg/graft (MinIO)"
	id["GC_Ratio/parallel"] = "gc (÷ 16 deletes at once)"; goal["gc (÷ 16 deletes at once)"] = "none"; cmd["gc (÷ 16 deletes at once)"] = "the same"
	id["Walk_Ratio"] = "walk (÷ a segment at a time)"; goal["walk (÷ a segment at a time)"] = "none"; cmd["walk (÷ a segment at a time)"] = "-bench Walk_Ratio ./pkg/graft (MinIO)"
	id["Archive_Ratio both"] = "P3 against both at once"; goal["P3 against both at once"] = "none"; cmd["P3 against both at once"] = "the same as P3 (the raw scan and PUTs run together)"
	id["Archive_Ratio floor"] = "P3 reachable (both at once ÷ slower alone)"; goal["P3 reachable (both at once ÷ slower alone)"] = "none"; cmd["P3 reachable (both at once ÷ slower alone)"] = "the same"
	id["Archive_Steps fold"] = "P3 fold (÷ raw XRANGE, a slice)"; goal["P3 fold (÷ raw XRANGE, a slice)"] = "<= 1.25"; cmd["P3 fold (÷ raw XRANGE, a slice)"] = "-bench Archive_Steps ./pkg/archive (MinIO)"
	id["Archive_Steps commit"] = "P3 commit (÷ raw create)"; goal["P3 commit (÷ raw create)"] = "<= 1.2"; cmd["P3 commit (÷ raw create)"] = "the same"
	id["Archive_Steps create"] = "P3 create, the commit without its proof (÷ raw create)"; goal["P3 create, the commit without its proof (÷ raw create)"] = "none"; cmd["P3 create, the commit without its proof (÷ raw create)"] = "the same"
	id["Archive_Steps commit-proven"] = "P3 commit ÷ raw create and read back (PUT, then GET of its last 4 KiB)"; goal[id["Archive_Steps commit-proven"]] = "none"; cmd[id["Archive_Steps commit-proven"]] = "the same"
	k = "P3 commit reachable while proving (raw create and read back ÷ raw create)"; id["Archive_Steps proof-floor"] = k; goal[k] = "none"; cmd[k] = "the same"
	id["Archive_Steps create-floor"] = "P3 create ÷ staged floor (raw create + local fsync beside)"; goal["P3 create ÷ staged floor (raw create + local fsync beside)"] = "none"; cmd["P3 create ÷ staged floor (raw create + local fsync beside)"] = "the same"
	id["Upload_Ratio staged"] = "P4 against its staged floor (raw create + local fsync beside)"; goal["P4 against its staged floor (raw create + local fsync beside)"] = "none"; cmd["P4 against its staged floor (raw create + local fsync beside)"] = "the same as P4"
	id["Upload_Ratio staged-floor"] = "P4 reachable (raw create ÷ staged floor)"; goal["P4 reachable (raw create ÷ staged floor)"] = "none"; cmd["P4 reachable (raw create ÷ staged floor)"] = "the same"
	id["Archive_FarRemote_Ratio"] = "P3 far (remote 20 ms away)"; goal["P3 far (remote 20 ms away)"] = ">= 0.85"; cmd["P3 far (remote 20 ms away)"] = "-bench Archive_FarRemote_Ratio ./pkg/archive (MinIO, each request delayed 20 ms)"
	id["Archive_FarRemote_Ratio both"] = ""; id["Archive_FarRemote_Ratio floor"] = "P3 far reachable"; goal["P3 far reachable"] = "none"; cmd["P3 far reachable"] = "the same"
	id["Archive_Ratio proven"] = "P3 against its proven floor (first slice read, then scan beside PUTs, then the last read back)"; goal[id["Archive_Ratio proven"]] = "none"; cmd[id["Archive_Ratio proven"]] = "the same as P3"
	id["Archive_Ratio proven-reach"] = "P3 reachable while proving (slower alone ÷ proven floor)"; goal[id["Archive_Ratio proven-reach"]] = "none"; cmd[id["Archive_Ratio proven-reach"]] = "the same"
	id["Archive_FarRemote_Ratio proven"] = "P3 far against its proven floor"; goal[id["Archive_FarRemote_Ratio proven"]] = "none"; cmd[id["Archive_FarRemote_Ratio proven"]] = "the same as P3 far"
	id["Archive_FarRemote_Ratio proven-reach"] = "P3 far reachable while proving"; goal[id["Archive_FarRemote_Ratio proven-reach"]] = "none"; cmd[id["Archive_FarRemote_Ratio proven-reach"]] = "the same"
	id["BullMQ_Ratio/go-noop-c1"] = "P13 go c1";  goal["P13 go c1"] = ">= 10";  cmd["P13 go c1"] = "-bench BullMQ_Ratio ./peers (in bench/; Go worker ÷ BullMQ 6.7, no-op, concurrency 1)"
	id["BullMQ_Ratio/go-noop-c8"] = "P13 go c8";  goal["P13 go c8"] = ">= 10";  cmd["P13 go c8"] = "the same, concurrency 8"
	id["BullMQ_Ratio/pipe-noop-c1"] = "P13 pipe c1";  goal["P13 pipe c1"] = ">= 2.5";  cmd["P13 pipe c1"] = "the same, worker run --pipe (Node) ÷ BullMQ, concurrency 1"
	id["BullMQ_Ratio/pipe-noop-c8"] = "P13 pipe c8";  goal["P13 pipe c8"] = ">= 2.5";  cmd["P13 pipe c8"] = "the same, concurrency 8"
	id["BullMQ_Ratio/pipe-10ms-c8"] = "P13 10 ms c8";  goal["P13 10 ms c8"] = ">= 1";  cmd["P13 10 ms c8"] = "the same, a 10 ms Node handler on both sides, concurrency 8"
	# the raw floor of P13 pipe: the same Node handler fed by a plain Go loop, no Redis (bench/peers/pipefloor_test.go)
	split("pipe-noop-c1 pipe-noop-c8 pipe-10ms-c8", pc, " "); split("P13 pipe c1|P13 pipe c8|P13 10 ms c8", pn, "|")
	for (i = 1; i <= 3; i++) {
		k = pn[i] " reachable (raw pipe loop ÷ BullMQ)"; id["BullMQ_Ratio/" pc[i] " reachable"] = k; goal[k] = "none"; cmd[k] = "the same (the Node handler fed by a Go loop, no Redis, the same lines in flight)"
		k = pn[i] " ÷ raw pipe loop"; id["BullMQ_Ratio/" pc[i] " of-floor"] = k; goal[k] = "none"; cmd[k] = "the same"
	}
	print "| id | median | min | max | goal | met | rounds | command (`go test -run ^$ -benchtime Nx ...`) |"
	print "|---|---|---|---|---|---|---|---|"
}
/^Benchmark.*(Ratio|Archive_Steps)/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	delete m
	for (i = 2; i < NF; i++) m[$(i+1)] = $i
	if ("ratio" in m) row(id[name], m["ratio"], m["ratio-min"], m["ratio-max"], $2)
	if ("cpu-ratio" in m) row(id[name " cpu"], m["cpu-ratio"], m["cpu-ratio-min"], m["cpu-ratio-max"], $2)
	if ("ratio-both" in m) row(id[name " both"], m["ratio-both"], "", "", $2)
	if ("both-floor" in m) row(id[name " floor"], m["both-floor"], "", "", $2)
	if ("ratio-staged" in m) row(id[name " staged"], m["ratio-staged"], "", "", $2)
	if ("staged-floor" in m) row(id[name " staged-floor"], m["staged-floor"], "", "", $2)
	if ("ratio-proven" in m) row(id[name " proven"], m["ratio-proven"], "", "", $2)
	if ("proven-reach" in m) row(id[name " proven-reach"], m["proven-reach"], "", "", $2)
	if ("fold-ratio" in m) row(id[name " fold"], m["fold-ratio"], m["fold-ratio-min"], m["fold-ratio-max"], $2)
	if ("commit-ratio" in m) row(id[name " commit"], m["commit-ratio"], m["commit-ratio-min"], m["commit-ratio-max"], $2)
	if ("create-ratio" in m) row(id[name " create"], m["create-ratio"], m["create-ratio-min"], m["create-ratio-max"], $2)
	if ("create-floor-ratio" in m) row(id[name " create-floor"], m["create-floor-ratio"], m["create-floor-ratio-min"], m["create-floor-ratio-max"], $2)
	if ("proof-floor-ratio" in m) row(id[name " proof-floor"], m["proof-floor-ratio"], m["proof-floor-ratio-min"], m["proof-floor-ratio-max"], $2)
	if ("commit-proven-ratio" in m) row(id[name " commit-proven"], m["commit-proven-ratio"], m["commit-proven-ratio-min"], m["commit-proven-ratio-max"], $2)
	if ("reachable" in m) row(id[name " reachable"], m["reachable"], "", "", $2)
	if ("of-floor" in m) row(id[name " of-floor"], m["of-floor"], "", "", $2)
}
function row(k, r, lo, hi, rounds,   g, gp, met) {
	if (k == "") return # a benchmark without a row here
	g = goal[k]; split(g, gp, " ")
	met = (gp[1] == ">=") ? (r >= gp[2] ? "yes" : "no") : (gp[1] == "<=" ? (r <= gp[2] ? "yes" : "no") : "")
	printf "| %s | %.3g | %s | %s | %s | %s | %s | %s |\n", k, r, num(lo), num(hi), g, met, rounds, cmd[k]
}
function num(x) { return x == "" ? "" : sprintf("%.3g", x) }
/requests per commit/ {
	sub(/.*requests per commit: /, "")
	per = $1 + 0; lists = $0; sub(/.*lists /, "", lists); sub(/[^0-9].*/, "", lists)
	met = (per <= 3 && lists == "0") ? "yes" : "no"
	print "| P7 | " $0 " | | | <= 3; 0 LIST | " met " | 20 commits | -run TestVolume_RequestsPerCommit -v ./pkg/graft |"
}
' "$out")
if [ -n "$rss" ]; then # "P6 ratio (large / small, medians): R (goal <= 1.15)"
	p6=$(echo "$rss" | sed -E 's/.*medians\): ([0-9.]+).*/\1/')
	met=$(awk -v r="$p6" 'BEGIN { print (r <= 1.15) ? "yes" : "no" }')
	table="$table
| P6 | $p6 | | | <= 1.15 | $met | 3 each | scripts/bench-rss.sh |"
fi
echo
echo "machine: $machine"
echo "$table"

block="<!-- bench.sh: begin -->
\`scripts/bench.sh $rounds\` on $machine:

$table
<!-- bench.sh: end -->"
BLOCK=$block awk 'BEGIN { b = ENVIRON["BLOCK"] } /<!-- bench.sh: begin -->/ { print b; skip = 1; next } /<!-- bench.sh: end -->/ { skip = 0; next } !skip' BENCHMARKS.md >BENCHMARKS.md.new
mv BENCHMARKS.md.new BENCHMARKS.md
echo "BENCHMARKS.md: current figures rewritten"
