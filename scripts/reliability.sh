#!/usr/bin/env bash
# The reliability battery: every fault scenario, negative control and
# security check, with its figures, into RELIABILITY.md.
#
#   scripts/reliability.sh [fast|long]
#
# fast (default, about 5 minutes; scripts/test.sh runs the same tests in CI)
# long (more kills, bigger streams, longer fault windows; about 30 minutes)
#
# It starts its own servers (scripts/servers.sh), runs the end-to-end tests
# with SILT_RELIABILITY_REPORT set, and rewrites the table of the tier in
# RELIABILITY.md between its markers.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=${1:-fast}
case $tier in fast | long) ;; *) echo "usage: scripts/reliability.sh [fast|long]" >&2; exit 2 ;; esac

scripts/servers.sh install all
SILT_SERVERS_DIR=$(mktemp -d)
export SILT_SERVERS_DIR
report=$(mktemp)
trap 'scripts/servers.sh stop; rm -f "$report"' EXIT
server_env=$(scripts/servers.sh start all)
eval "$server_env"
client_env=$(scripts/clients.sh) # the producer tests' Python and Node clients
eval "$client_env"

export SILT_RELIABILITY_REPORT=$report SILT_RELIABILITY_TIER=$tier
timeout=20m
[ "$tier" = long ] && timeout=120m
log=$(mktemp)
set +e
go test -count=1 -timeout "$timeout" ./e2e/ >"$log" 2>&1
status=$?
set -e
grep -E '^(--- |ok|FAIL|panic)|history ' "$log" || true
if [ "$status" != 0 ]; then
	tail -40 "$log"
	echo "reliability: some scenario failed (full log: $log)" >&2
	exit 1
fi
machine="$(date -u +%Y-%m-%d), $(nproc) cores, $(go version | cut -d' ' -f3), redis-server $(redis-server --version | grep -oE 'v=[0-9.]+' | cut -c3-)"
go run ./internal/testing/reltable "$report" "$tier" RELIABILITY.md "$machine"
echo "reliability: RELIABILITY.md ($tier tier) rewritten"
