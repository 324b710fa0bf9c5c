#!/usr/bin/env bash
# Deep history (BENCHMARKS.md D1-D4): builds archives of each size through
# the library, opens each cold in child processes that count their object
# requests and report their peak RSS, compacts and collects it, and draws
# docs/bench-deep-open.png and docs/bench-deep-window.png.
#
#   scripts/bench-deep.sh [SIZES]     (default 1000,10000,100000,1000000)
#
# The archives are built on $TMPDIR (use a tmpfs: TMPDIR=/dev/shm); 1M
# commits take about 20 minutes and 10 GB there, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-1000,10000,100000,1000000}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

SILT_DEEP_SIZES=$sizes go test -run '^$' -bench DeepHistory -benchtime 1x -timeout 120m ./pkg/graft | tee "$out"

# | commits | process | open requests | open ms | window requests | 2*log2(segments) | peak RSS MiB | RSS / first |
points() { # points PROCESS COLUMN -> [[commits,value],...]
	awk -F'|' -v p="$1" -v c="$2" '$3 ~ " "p" " { gsub(/ /, "", $2); gsub(/ /, "", $(c)); printf "%s[%s,%s]", sep, $2, $(c); sep="," }' "$out"
}
cat >"$out.json" <<JSON
[
 {"file": "bench-deep-open.png", "title": "cold open by archive length (local store)", "xlabel": "commits (log)", "ylabel": "object requests", "logx": true,
  "series": [{"name": "reader: requests", "points": [$(points reader 4)]},
             {"name": "goal: 8", "points": [[1000,8],[1000000,8]]}]},
 {"file": "bench-deep-window.png", "title": "cold window read by archive length", "xlabel": "commits (log)", "ylabel": "object requests", "logx": true,
  "series": [{"name": "window after the open", "points": [$(points reader 6)]},
             {"name": "goal: 2 log2(segments)", "points": [$(points reader 7)]}]}
]
JSON
(cd bench && go run ./curves -out ../docs "$out.json")
rm -f "$out.json"
echo "charts: docs/bench-deep-open.png docs/bench-deep-window.png"
