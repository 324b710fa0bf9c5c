// Package benchratio measures silt against a raw baseline in the same run:
// rounds interleave the two (A B, B A, ...), and the median of the per-round
// throughput ratios is reported, so a noisy shared machine moves both sides.
package benchratio

import (
	"cmp"
	"context"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
	b.ReportMetric(Median(siltRates), "silt-items/s")
	b.ReportMetric(Median(rawRates), "raw-items/s")
	b.ReportMetric(Median(ratios), "ratio")
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

// WithCPU wraps round to append, after each run, the process's own CPU
// time per item (user and system, in ns; the CPU of child processes such
// as a co-process handler is not the process's own) to into.
func WithCPU(round Round, into *[]float64) Round {
	return Per(round, func(testing.TB) float64 { return float64(ProcessCPU()) }, into)
}

// Per wraps round to append, after each run, how far counter moved per
// item to into: CPU time, bytes allocated, a server's CPU.
func Per(round Round, counter func(testing.TB) float64, into *[]float64) Round {
	return func(tb testing.TB) int {
		start := counter(tb)
		n := round(tb)
		*into = append(*into, (counter(tb)-start)/float64(max(n, 1)))
		return n
	}
}

// ReportMedians reports the medians of two Per series as "silt-<unit>"
// and "raw-<unit>".
func ReportMedians(b *testing.B, unit string, silt, raw []float64) {
	b.Helper()
	if len(silt) > 0 && len(raw) > 0 {
		b.ReportMetric(Median(silt), "silt-"+unit)
		b.ReportMetric(Median(raw), "raw-"+unit)
	}
}

// AllocBytes is a Per counter: the bytes the process has allocated so far
// (runtime.MemStats.TotalAlloc).
func AllocBytes(testing.TB) float64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.TotalAlloc)
}

// RedisCPU returns redis-server's CPU time so far (user and system, INFO
// cpu), in ns: a Per counter with RedisCPU(rdb).
func RedisCPU(rdb *redis.Client) func(testing.TB) float64 {
	return func(tb testing.TB) float64 {
		info, err := rdb.Info(context.Background(), "cpu").Result()
		if err != nil {
			tb.Fatal(err)
		}
		var total float64
		for _, line := range strings.Split(info, "\r\n") {
			k, v, _ := strings.Cut(line, ":")
			if k == "used_cpu_user" || k == "used_cpu_sys" {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					tb.Fatalf("INFO cpu %s: %v", line, err)
				}
				total += f
			}
		}
		return total * float64(time.Second)
	}
}

// ReportCPURatio reports the median and spread of the per-round ratios
// silt/raw of two WithCPU series as "<name>", "<name>-min", "<name>-max",
// with both sides' median ns per item.
func ReportCPURatio(b *testing.B, name string, silt, raw []float64) {
	b.Helper()
	var ratios []float64
	for i := range min(len(silt), len(raw)) {
		ratios = append(ratios, silt[i]/raw[i])
	}
	if len(ratios) == 0 {
		return
	}
	b.ReportMetric(Median(silt), "silt-cpu-ns/item")
	b.ReportMetric(Median(raw), "raw-cpu-ns/item")
	b.ReportMetric(Median(ratios), name)
	b.ReportMetric(slices.Min(ratios), name+"-min")
	b.ReportMetric(slices.Max(ratios), name+"-max")
	b.Logf("%s=%.3f", name, ratios)
}

// ProcessCPU is the CPU time the process itself has used so far
// (RUSAGE_SELF: children excluded), for a benchmark that times a step's
// CPU as well as its wall clock.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Median is the median of xs (0 for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Longest runs parts one after another and counts only the longest of them
// in the round's time: a floor that is the slower of two steps a pipeline
// overlaps (a scan and the uploads of what it read). It returns each
// part's duration.
func Longest(parts ...func()) []time.Duration {
	took := make([]time.Duration, len(parts))
	for i, p := range parts {
		start := time.Now()
		p()
		took[i] = time.Since(start)
	}
	untimed += sum(took) - slices.Max(took)
	return took
}

func sum(ds []time.Duration) (t time.Duration) {
	for _, d := range ds {
		t += d
	}
	return t
}

// ReportMS reports the median of ds in milliseconds as "<name>-ms".
func ReportMS(b *testing.B, name string, ds []time.Duration) {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d.Microseconds()) / 1000
	}
	b.ReportMetric(Median(ms), name+"-ms")
}

// ReportTimeRatio reports, as "<name>", the median over rounds of raw[i] ÷
// silt[i], the durations of round i's two sides: a throughput ratio, like
// Compare's, against another raw side timed in the same rounds.
func ReportTimeRatio(b *testing.B, name string, silt, raw []time.Duration) {
	n := min(len(silt), len(raw))
	ratios := make([]float64, n)
	for i := range n {
		ratios[i] = raw[i].Seconds() / silt[i].Seconds()
	}
	b.ReportMetric(Median(ratios), name)
}

// Exclude leaves d out of the current round's time: a part the round
// timed itself and does not count (a child process's start and setup,
// which it reports).
func Exclude(d time.Duration) { untimed += d }

// WriteSynced writes body to a new file in dir, fsyncs and removes it: the
// local durable copy a create keeps, for a raw floor that keeps one too.
func WriteSynced(dir string, body []byte) error {
	f, err := os.CreateTemp(dir, "staged-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(body)
	return cmp.Or(err, f.Sync(), f.Close())
}
