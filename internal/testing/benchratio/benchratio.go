// Package benchratio measures silt against a raw baseline in the same run:
// rounds interleave the two (A B, B A, ...), and the median of the per-round
// throughput ratios is reported, so a noisy shared machine moves both sides.
package benchratio

import (
	"slices"
	"testing"
	"time"
)

// Round runs one side once and returns how many items it handled.
type Round func(tb testing.TB) int

// Compare runs b.N rounds of each side, interleaved with alternating order,
// and reports items/s of both sides and the median ratio silt/raw as the
// metric "ratio". Run it with -benchtime=Nx to choose the number of rounds.
func Compare(b *testing.B, silt, raw Round) {
	b.Helper()
	var ratios, siltRates, rawRates []float64
	b.ResetTimer()
	for i := range b.N {
		var s, r float64
		if i%2 == 0 {
			s, r = rate(b, silt), rate(b, raw)
		} else {
			r, s = rate(b, raw), rate(b, silt)
		}
		siltRates, rawRates, ratios = append(siltRates, s), append(rawRates, r), append(ratios, s/r)
	}
	b.StopTimer()
	b.ReportMetric(median(siltRates), "silt-items/s")
	b.ReportMetric(median(rawRates), "raw-items/s")
	b.ReportMetric(median(ratios), "ratio")
	b.ReportMetric(slices.Min(ratios), "ratio-min")
	b.ReportMetric(slices.Max(ratios), "ratio-max")
	b.Logf("rounds=%d ratios=%.3f", b.N, ratios)
}

func rate(b *testing.B, round Round) float64 {
	untimed = 0
	start := time.Now()
	n := round(b)
	return float64(n) / (time.Since(start) - untimed).Seconds()
}

// untimed is the time the current round spent in Untimed (rounds run one
// at a time).
var untimed time.Duration

// Untimed runs a round's setup (filling a stream, opening a store) outside
// the round's timing. b.StopTimer does not do it: rates are measured around
// the whole round.
func Untimed(setup func()) {
	start := time.Now()
	setup()
	untimed += time.Since(start)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
