#!/usr/bin/env bash
# Runs the archive protocol's seeded fault schedules (e2e/faultschedule_test.go)
# for any seeds: ./scripts/faultschedule.sh 1-500, or 7,9,12 to replay.
# A failure prints its seed and the schedule up to the broken step; the same
# seed replays the same schedule. Starts its own servers (scripts/servers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-1-200}
scripts/servers.sh install redis >/dev/null
SILT_FAULT_SEEDS=$seeds exec go test -count=1 -timeout 2h -run '^TestFaultSchedule$' ./e2e "${@:2}"
