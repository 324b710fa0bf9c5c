// Package peers compares silt with peer libraries on the same entries. It is
// in its own module (bench/go.mod), so that the peers' dependencies stay out of silt's.
//
//	cd bench && go test -run '^$' -bench . -benchtime 5x ./peers
package peers
