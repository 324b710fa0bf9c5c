#!/usr/bin/env bash
# Installs the Redis clients no one here wrote that the end-to-end tests use
# as witnesses (docs/producers/): Debian's python3-redis for the system
# python3, and npm's ioredis in a cache directory; with --bench also npm's
# BullMQ, the peer bench/peers measures (P13). Cached: nothing is fetched
# when they are there. Prints the variables the tests read:
#   eval "$(scripts/clients.sh)"
set -euo pipefail

python=/usr/bin/python3
if ! "$python" -c 'import redis' 2>/dev/null; then
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get install -y --no-install-recommends python3-redis >&2 ||
		{ $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends python3-redis >&2; }
fi

node_dir=${XDG_CACHE_HOME:-$HOME/.cache}/silt/node-clients
# version NAME: the version of npm package NAME in the cache, if any.
version() { sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$node_dir/node_modules/$1/package.json" 2>/dev/null | head -1; }
want=("ioredis@5.6.1")
[ "${1:-}" = --bench ] && want+=("bullmq@6.7.6")
for pkg in "${want[@]}"; do
	if [ "$(version "${pkg%@*}")" != "${pkg#*@}" ]; then
		mkdir -p "$node_dir"
		(cd "$node_dir" && npm install --no-audit --no-fund --silent "${want[@]}" >&2)
		break
	fi
done

echo "export SILT_PYTHON=$python"
echo "export SILT_NODE_PATH=$node_dir/node_modules"
