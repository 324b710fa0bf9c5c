// Package peers compares silt with peer libraries on the same entries:
// watermill-redisstream (Go, P1b) and BullMQ (Node, P13; its scripts are
// in node/, BullMQ itself comes from `scripts/clients.sh --bench`). It is
// in its own module (bench/go.mod), so that the peers' dependencies stay
// out of silt's.
//
//	cd bench && go test -run '^$' -bench . -benchtime 5x ./peers
package peers
