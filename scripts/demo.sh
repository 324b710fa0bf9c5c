#!/usr/bin/env bash
# silt's main job on the embedded default, end to end: a local redis-server
# (installed and started here unless SILT_REDIS_URL is set), a feed appended
# with `worker append`, a worker run over a consumer group, the old part of
# the stream archived to a local-directory remote and trimmed, and the whole
# history read back merged, showing what came from the archive and what is live.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${SILT_REDIS_URL:-}" ]; then
	scripts/servers.sh install redis
	SILT_SERVERS_DIR=$(mktemp -d)
	export SILT_SERVERS_DIR
	trap 'scripts/servers.sh stop' EXIT
	eval "$(scripts/servers.sh start redis)"
fi
data=$(mktemp -d)
export SILT_QUEUE=${SILT_QUEUE:-demo} SILT_STREAM=${SILT_STREAM:-events} SILT_GROUP=${SILT_GROUP:-audit}
export SILT_DATA_DIR=$data/silt-data SILT_ARCHIVE_CACHE=$data/silt-cache

echo "== build bin/worker bin/archiver"
go build -o bin/ ./cmd/worker ./cmd/archiver

echo "== worker append: 12 entries from JSON lines (one branded id per line) and one from arguments"
for i in $(seq 1 12); do
	printf '{"user":"u%d","action":"login","amount":"%d"}\n' "$i" "$((i * 10))"
done | bin/worker append
bin/worker append user=u13 action=logout

echo "== worker run: group '$SILT_GROUP' handles every entry (exec handler refuses logouts: exit 65)"
bin/worker run --consumer demo-1 --block 500ms \
	--exec 'doc=$(cat); case "$doc" in *logout*) echo "cannot handle logout" >&2; exit 65;; esac'

echo "== worker dead ls: the refused entry is a dead letter"
bin/worker dead ls

echo "== archiver run: keep the newest 4 live, fold the rest into the local-directory remote, then trim"
bin/archiver run --stream "$SILT_STREAM" --keep-last 4 --slice-entries 5 --exact

echo "== archiver status"
bin/archiver status

echo "== archiver read: the whole history, archive and live merged (source column)"
bin/archiver read --format text

echo "== archiver verify: hash chain and checksums, remote and local"
bin/archiver verify

echo "== worker status: the stream is short now; the group's pending list is empty"
bin/worker status
