#!/usr/bin/env bash
# silt's main job on the embedded default: a local redis-server (installed and
# started here unless EMQ_REDIS_URL is set), a small feed appended with
# `worker append`, the history read back with `archiver read`, a worker run
# over a consumer group with one entry dead-lettered, and the group's status.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${EMQ_REDIS_URL:-}" ]; then
	scripts/servers.sh install redis
	SILT_SERVERS_DIR=$(mktemp -d)
	export SILT_SERVERS_DIR
	trap 'scripts/servers.sh stop' EXIT
	eval "$(scripts/servers.sh start redis)"
	export EMQ_REDIS_URL=$SILT_REDIS_URL
fi
export EMQ_QUEUE=${EMQ_QUEUE:-demo} EMQ_STREAM=${EMQ_STREAM:-events}

echo "== build bin/worker bin/archiver"
go build -o bin/ ./cmd/worker ./cmd/archiver

echo "== worker append: 5 entries from JSON lines, one branded id per line"
for i in 1 2 3 4 5; do
	printf '{"user":"u%d","action":"login","amount":"%d"}\n' "$i" "$((i * 10))"
done | bin/worker append

echo "== worker append: one entry from field=value arguments"
bin/worker append user=u6 action=logout

echo "== archiver read --format text: the whole history, oldest first"
bin/archiver read --format text

echo "== archiver read (jsonl), the last two entries"
last=$(bin/archiver read --format text | tail -n 2 | head -n 1 | cut -d' ' -f1)
bin/archiver read --from "$last"

echo "== worker run: group 'audit' handles every entry (exec handler), exits when done"
bin/worker run --group audit --consumer demo-1 --block 500ms \
	--exec 'doc=$(cat); case "$doc" in *logout*) echo "cannot handle logout" >&2; exit 65;; esac'

echo "== worker dead ls: the entry the handler refused (exit 65) is a dead letter"
bin/worker dead ls --group audit

echo "== worker status: stream length, pending list, lag, dead letters"
bin/worker status --group audit
