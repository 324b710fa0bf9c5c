#!/usr/bin/env bash
# The test command (README, .ci/run): vet and format checks, unit tests with
# -race, a short fuzz pass, then the end-to-end tests against real servers this
# script installs (when missing) and starts on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "install servers (cached when present)"
scripts/servers.sh install all

step "go vet"
go vet ./...
# The benchmark peers are their own module (bench/): vetting it keeps its
# go.mod in step with this one (scripts/bench.sh stopped on a stale one).
(cd bench && go vet ./...)

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

step "terraform fmt"
if command -v terraform >/dev/null; then
	terraform fmt -check -recursive infra/terraform 2>/dev/null || { echo "terraform fmt would change infra/terraform"; exit 1; }
else
	echo "terraform not installed: skipped (go test ./infra/terraform still parses the module)"
fi

step "start servers"
SILT_SERVERS_DIR=$(mktemp -d)
export SILT_SERVERS_DIR
trap 'scripts/servers.sh stop' EXIT
server_env=$(scripts/servers.sh start all) # a server that does not start stops the run here
eval "$server_env"

step "unit tests (-race)"
# pkg/archive's soak of merged reads beside a running archiver
# (TestRead_WhileArchiving) reads 10,000 ranges plain and 1,500 under -race,
# where its cost per read grows with the run (10,000 took 20-30 minutes).
go test -race -count=1 -timeout 30m $(go list ./... | grep -v /e2e)

step "fuzz targets (short)"
# A count, not a duration: with -fuzztime 5s, Go 1.26's fuzz coordinator can
# report its own deadline as a failure ("context deadline exceeded", no
# crasher written; golang/go#75804, fixed in Go 1.27). A clean-clone CI run
# of FuzzParseLine failed so.
for target in $(grep -rhoE '^func (Fuzz[A-Za-z0-9_]+)' --include='*_test.go' pkg cmd internal | sed 's/^func //' | sort -u); do
	pkg=$(dirname "$(grep -rlE "^func $target\(" --include='*_test.go' pkg cmd internal | head -1)")
	go test -run '^$' -fuzz "^$target\$" -fuzztime "${SILT_FUZZTIME:-5000x}" "./$pkg"
done

step "producer clients (cached when present)"
client_env=$(scripts/clients.sh)
eval "$client_env"

step "end-to-end tests (-race): the fast reliability tier"
SILT_RELIABILITY_REPORT=$(mktemp)
export SILT_RELIABILITY_REPORT
go test -race -count=1 -timeout 30m ./e2e/...
step "reliability figures (RELIABILITY.md explains them)"
go run ./internal/testing/reltable "$SILT_RELIABILITY_REPORT" fast
