package archive

import "time"

// SetFreshOpen sets how soon after its open a run takes the open's look at
// the remote for its own, and returns what puts it back: a test that
// counts a run's reads must not depend on how loaded the machine is.
func SetFreshOpen(d time.Duration) (restore func()) {
	was := freshOpen
	freshOpen = d
	return func() { freshOpen = was }
}
