#!/usr/bin/env bash
# silt's main job on the embedded default: a local redis-server (installed and
# started here unless EMQ_REDIS_URL is set), a small feed appended with
# `worker append`, and the history read back with `archiver read`.
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
