#!/usr/bin/env bash
# Install, start and stop the real servers silt's tests use, on loopback only,
# on free ports, with their data in a temp dir.
#
#   scripts/servers.sh install [redis|minio|versitygw|prometheus|all]...  idempotent
#   scripts/servers.sh start   [redis|cluster|minio|versitygw|prometheus|all]...  prints export lines
#   scripts/servers.sh env                                      the export lines again
#   scripts/servers.sh stop [--all]                             stops what start started (SILT_SERVERS_DIR, which start exports)
#
# Use it as:  eval "$(scripts/servers.sh start all)"
# Tests read SILT_REDIS_URL, SILT_MINIO_*, SILT_VERSITYGW_*, SILT_PROMETHEUS_URL and
# SILT_PROMTOOL from the environment. Prometheus (with its OTLP receiver) is the
# receiver of the metrics tests; building it takes about 8 minutes, once.
set -euo pipefail

MINIO_MOD=github.com/minio/minio
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
VERSITYGW_MOD=github.com/versity/versitygw
VERSITYGW_PKG=github.com/versity/versitygw/cmd/versitygw
VERSITYGW_VERSION=v1.8.0
PROMETHEUS_MOD=github.com/prometheus/prometheus
PROMETHEUS_VERSION=v0.316.0

STATE=${SILT_SERVERS_DIR:-${TMPDIR:-/tmp}/silt-servers}
GOBIN_DIR=$(go env GOBIN)
[ -n "$GOBIN_DIR" ] || GOBIN_DIR="$(go env GOPATH)/bin"

log() { echo "servers.sh: $*" >&2; }
die() { log "$*"; exit 1; }

expand() {
	local out=()
	for s in "$@"; do
		case $s in
		all) out+=(redis minio versitygw prometheus) ;;
		redis | cluster | minio | versitygw | prometheus) out+=("$s") ;;
		*) die "unknown server '$s' (want redis, cluster, minio, versitygw, prometheus or all)" ;;
		esac
	done
	[ ${#out[@]} -gt 0 ] || out=(redis)
	echo "${out[@]}"
}

# go_installed MOD VERSION BIN: is BIN built from MOD at VERSION already?
go_installed() {
	local bin=$GOBIN_DIR/$3
	[ -x "$bin" ] && go version -m "$bin" 2>/dev/null | grep -qE "^[[:space:]]+mod[[:space:]]+$1[[:space:]]+$2([[:space:]]|$)"
}

install_redis() {
	command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return
	log "installing redis-server with apt-get"
	command -v apt-get >/dev/null || die "redis-server is missing and apt-get is not available: install redis-server 7 yourself"
	local sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >&2
	# Debian's package may start a system service on 6379; we do not use it.
}

install_minio() {
	go_installed $MINIO_MOD $MINIO_VERSION minio && return
	log "building MinIO $MINIO_VERSION (a few minutes; AGPL, run as a test server only)"
	GOFLAGS=-mod=mod go install "$MINIO_MOD@$MINIO_VERSION" >&2
}

install_versitygw() {
	go_installed $VERSITYGW_MOD $VERSITYGW_VERSION versitygw && return
	log "building versitygw $VERSITYGW_VERSION"
	GOFLAGS=-mod=mod go install "$VERSITYGW_PKG@$VERSITYGW_VERSION" >&2
}

install_prometheus() {
	go_installed $PROMETHEUS_MOD $PROMETHEUS_VERSION prometheus && go_installed $PROMETHEUS_MOD $PROMETHEUS_VERSION promtool && return
	log "building prometheus and promtool $PROMETHEUS_VERSION with go install (about 8 minutes, once)"
	GOFLAGS=-mod=mod go install "$PROMETHEUS_MOD/cmd/prometheus@$PROMETHEUS_VERSION" "$PROMETHEUS_MOD/cmd/promtool@$PROMETHEUS_VERSION" >&2
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
	local p
	for _ in $(seq 200); do
		p=$((20000 + RANDOM % 40000))
		port_free "$p" && { echo "$p"; return; }
	done
	die "no free port found"
}

wait_port() { # wait_port PORT NAME PIDFILE: 0 listening, 1 exited, dies after 30s
	for _ in $(seq 300); do
		port_free "$1" || return 0
		kill -0 "$(cat "$3")" 2>/dev/null || return 1
		sleep 0.1
	done
	die "$2 did not listen on 127.0.0.1:$1 within 30s; see $STATE/$2/log"
}

# exited NAME: after a server exited at start, log why (its log's tail).
exited() {
	log "$1 exited at start; the end of its log:"
	tail -n 20 "$STATE/$1/log" >&2 || true
}

random_key() { head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c "$1"; }

start_redis() {
	local dir=$STATE/redis port
	port=$(free_port)
	mkdir -p "$dir/data"
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir/data" \
		--logfile "$dir/log" --daemonize no >/dev/null 2>&1 &
	echo $! >"$dir/pid"
	wait_port "$port" redis "$dir/pid" || { exited redis; return 1; }
	echo "export SILT_REDIS_URL=redis://127.0.0.1:$port/0" >"$dir/env"
}

# start_cluster: 3 masters and 3 replicas on free ports, joined with
# redis-cli --cluster create; SILT_REDIS_CLUSTER_URL lists every node.
start_cluster() {
	local dir=$STATE/cluster ports=() urls=() p
	mkdir -p "$dir"
	for i in 1 2 3 4 5 6; do
		p=$(free_port)
		mkdir -p "$dir/$i"
		redis-server --port "$p" --bind 127.0.0.1 --dir "$dir/$i" --save "" --appendonly yes \
			--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
			--logfile "$dir/$i/log" --daemonize no >/dev/null 2>&1 &
		echo $! >"$dir/$i/pid"
		wait_port "$p" "cluster/$i" "$dir/$i/pid" || { exited "cluster/$i"; return 1; }
		ports+=("127.0.0.1:$p")
		urls+=("redis://127.0.0.1:$p")
	done
	redis-cli --cluster create "${ports[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
		die "redis-cli --cluster create failed; see $dir/create.log"
	for _ in $(seq 100); do
		redis-cli -u "${urls[0]}" cluster info 2>/dev/null | grep -q cluster_state:ok && break
		sleep 0.2
	done
	cp "$dir/1/pid" "$dir/pid"
	local IFS=,
	echo "export SILT_REDIS_CLUSTER_URL=${urls[*]}" >"$dir/env"
}

start_s3() { # start_s3 NAME ENVPREFIX COMMAND...
	local name=$1 prefix=$2 dir=$STATE/$1 port access secret
	shift 2
	port=$(free_port)
	access=silt$(random_key 12)
	secret=$(random_key 32)
	mkdir -p "$dir/data"
	case $name in
	minio)
		MINIO_ROOT_USER=$access MINIO_ROOT_PASSWORD=$secret MINIO_BROWSER=off \
			"$GOBIN_DIR/minio" server --quiet --address "127.0.0.1:$port" \
			--console-address "127.0.0.1:$(free_port)" "$dir/data" >"$dir/log" 2>&1 &
		;;
	versitygw)
		ROOT_ACCESS_KEY=$access ROOT_SECRET_KEY=$secret \
			"$GOBIN_DIR/versitygw" --port "127.0.0.1:$port" posix "$dir/data" >"$dir/log" 2>&1 &
		;;
	esac
	echo $! >"$dir/pid"
	wait_port "$port" "$name" "$dir/pid" || { exited "$name"; return 1; }
	{
		echo "export ${prefix}_ENDPOINT=http://127.0.0.1:$port"
		echo "export ${prefix}_ACCESS_KEY=$access"
		echo "export ${prefix}_SECRET_KEY=$secret"
	} >"$dir/env"
}

# start_prometheus: a TSDB that takes OTLP metrics at /api/v1/otlp/v1/metrics
# and answers PromQL; it scrapes nothing.
start_prometheus() {
	local dir=$STATE/prometheus port
	port=$(free_port)
	mkdir -p "$dir/data"
	printf 'global:\n  scrape_interval: 1m\n' >"$dir/prometheus.yml"
	"$GOBIN_DIR/prometheus" --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
		--web.listen-address="127.0.0.1:$port" --web.enable-otlp-receiver >"$dir/log" 2>&1 &
	echo $! >"$dir/pid"
	wait_port "$port" prometheus "$dir/pid" || { exited prometheus; return 1; }
	{
		echo "export SILT_PROMETHEUS_URL=http://127.0.0.1:$port"
		echo "export SILT_PROMTOOL=$GOBIN_DIR/promtool"
	} >"$dir/env"
}

start_one() {
	local pidfile=$STATE/$1/pid
	if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
		return # already running
	fi
	# A free port can be taken between choosing and binding it: try again
	# on other ports before giving up.
	for attempt in 1 2 3; do
		case $1 in
		redis) start_redis ;;
		cluster) start_cluster ;;
		minio) start_s3 minio SILT_MINIO ;;
		versitygw) start_s3 versitygw SILT_VERSITYGW ;;
		prometheus) start_prometheus ;;
		esac && { log "$1 started (pid $(cat "$pidfile"))"; return; }
		log "$1: start attempt $attempt failed"
	done
	die "$1 did not start; see above"
}

# The export lines of the started servers, and of SILT_SERVERS_DIR itself,
# so that a later `stop` in the same shell stops these and no others.
print_env() {
	cat "$STATE"/*/env 2>/dev/null || true
	echo "export SILT_SERVERS_DIR=$STATE"
}

stop_all() {
	for pidfile in "$STATE"/*/pid "$STATE"/cluster/*/pid; do
		[ -f "$pidfile" ] || continue
		local pid
		pid=$(cat "$pidfile")
		if kill "$pid" 2>/dev/null; then
			for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -9 "$pid" 2>/dev/null || true
		fi
	done
	rm -rf "$STATE"
}

cmd=${1:-}
shift || true
case $cmd in
install)
	for s in $(expand "$@"); do [ "$s" = cluster ] && s=redis; "install_$s"; done
	;;
start)
	mkdir -p "$STATE"
	for s in $(expand "$@"); do
		if [ "$s" = cluster ]; then install_redis; else "install_$s"; fi
		start_one "$s"
	done
	print_env
	;;
env) print_env ;;
stop)
	# The shared default directory may hold another run's servers: stop
	# only what SILT_SERVERS_DIR names, unless told to stop them all.
	if [ -z "${SILT_SERVERS_DIR:-}" ] && [ "${1:-}" != "--all" ]; then
		die "stop: set SILT_SERVERS_DIR to the directory of the servers to stop (the one start used), or give --all to stop every server under $STATE"
	fi
	stop_all
	;;
*)
	sed -n '2,11p' "$0" >&2
	exit 2
	;;
esac
