//go:build !race

package archive_test

// raceEnabled: the race detector slows this package's soaks by 10 to 30
// times, so they run fewer rounds under it.
const raceEnabled = false
