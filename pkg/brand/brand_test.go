package brand_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
)

func randomStreamID(r *rand.Rand) brand.StreamID {
	// Mix small values (the common case) with values at the edges of the range.
	pick := func(max uint64) uint64 {
		switch r.IntN(4) {
		case 0:
			return 0
		case 1:
			return max
		case 2:
			return r.Uint64N(1000)
		}
		return r.Uint64() & max
	}
	return brand.StreamID{MS: pick(brand.MaxMS), Seq: pick(brand.MaxSeq)}
}

func TestID_RoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		sid := randomStreamID(r)
		id, err := brand.New(brand.EVT, sid)
		if err != nil {
			t.Fatalf("New(%v): %v", sid, err)
		}
		s := id.String()
		if len(s) != brand.Len {
			t.Fatalf("len(%q) = %d, want %d", s, len(s), brand.Len)
		}
		got, err := brand.Parse(s)
		if err != nil {
			t.Fatalf("Parse(%q): %v", s, err)
		}
		if got != id {
			t.Fatalf("Parse(%q) = %+v, want %+v", s, got, id)
		}
		back, err := brand.FromStreamID(brand.EVT, sid.String())
		if err != nil || back != id {
			t.Fatalf("FromStreamID(%q) = %+v, %v; want %+v", sid.String(), back, err, id)
		}
	}
}

func TestID_StringOrderIsMintOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		a, b := randomStreamID(r), randomStreamID(r)
		ia, _ := brand.New(brand.JOB, a)
		ib, _ := brand.New(brand.JOB, b)
		if got, want := strings.Compare(ia.String(), ib.String()), a.Compare(b); got != want {
			t.Fatalf("compare(%s, %s) = %d, stream ids %s %s compare %d", ia, ib, got, a, b, want)
		}
	}
}

func TestParse_Errors(t *testing.T) {
	good := brand.ID{Kind: brand.EVT, StreamID: brand.StreamID{MS: 1731000000000, Seq: 10}}.String()
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "length 0"},
		{"short", good[:len(good)-1], "length"},
		{"long", good + "0", "length"},
		{"lower-case kind", "evt" + good[3:], "upper-case letters"},
		{"digit in kind", "EV1" + good[3:], "upper-case letters"},
		{"no underscore", "EVT-" + good[4:], "'_'"},
		{"lower-case body", strings.ToLower(good[:4]) + strings.ToLower(good[4:]), "upper-case"},
		{"letter I", good[:10] + "I" + good[11:], "Crockford"},
		{"letter U", good[:len(good)-1] + "U", "Crockford"},
		{"sequence out of range", good[:14] + "G" + good[15:], "sequence exceeds"},
		{"space", good[:5] + " " + good[6:], "Crockford"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := brand.Parse(tc.in)
			if err == nil {
				t.Fatalf("Parse(%q) succeeded", tc.in)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.in) {
				t.Fatalf("Parse(%q) error %q, want it to contain %q and the input", tc.in, err, tc.want)
			}
			var pe *brand.ParseError
			if !errors.As(err, &pe) || pe.Input != tc.in {
				t.Fatalf("error %v is not a *ParseError for the input", err)
			}
		})
	}
}

// Any three upper-case letters are a kind: no process-wide list decides
// (a stream records its own kind, package stream).
func TestParse_AnyWellFormedKind(t *testing.T) {
	id, err := brand.Parse("QZQ_00000000000000000000001")
	if err != nil || id.Kind != "QZQ" || id.Kind.BuiltIn() {
		t.Fatalf("Parse of a kind not built in = %+v, %v", id, err)
	}
	if !brand.EVT.BuiltIn() {
		t.Fatal("EVT is not built in")
	}
	for _, bad := range []string{"Qq1", "QQ", "QQQQ", "qqq"} {
		if _, err := brand.ParseKind(bad); !errors.Is(err, brand.ErrInvalid) {
			t.Errorf("ParseKind(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestParseStreamID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want brand.StreamID
		ok   bool
	}{
		{"0-1", brand.StreamID{0, 1}, true},
		{"1731000000000-18446744073709551615", brand.StreamID{1731000000000, math.MaxUint64}, true},
		{"1-18446744073709551616", brand.StreamID{}, false},
		{"1", brand.StreamID{}, false},
		{"-1", brand.StreamID{}, false},
		{"+1-2", brand.StreamID{}, false},
		{"1-2-3", brand.StreamID{}, false},
		{" 1-2", brand.StreamID{}, false},
	} {
		got, err := brand.ParseStreamID(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseStreamID(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok && got.String() != tc.in {
			t.Errorf("String() = %q, want %q", got.String(), tc.in)
		}
	}
}

func TestNew_RejectsMillisecondsOutOfRange(t *testing.T) {
	if _, err := brand.New(brand.EVT, brand.StreamID{MS: brand.MaxMS + 1}); err == nil {
		t.Fatal("New accepted milliseconds above MaxMS")
	}
}

func TestID_Time(t *testing.T) {
	at := time.Date(2026, 12, 1, 5, 23, 4, 567_000_000, time.UTC)
	id, _ := brand.New(brand.EVT, brand.StreamID{MS: uint64(at.UnixMilli()), Seq: 3})
	if got := id.Time(); !got.Equal(at) {
		t.Fatalf("Time() = %v, want %v", got, at)
	}
}

func TestWindowBounds(t *testing.T) {
	at := time.UnixMilli(1731000000123)
	lo, hi := brand.WindowStart(at), brand.WindowEnd(at.Add(999*time.Microsecond))
	if lo.String() != "1731000000123-0" || hi.String() != "1731000000123-18446744073709551615" {
		t.Fatalf("window = %s .. %s", lo, hi)
	}
}

type steppingClock struct {
	mu sync.Mutex
	ms []int64
	i  int
}

func (c *steppingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ms := c.ms[c.i%len(c.ms)]
	c.i++
	return time.UnixMilli(ms)
}

func TestMinter_ClockStepsBack(t *testing.T) {
	m, _ := brand.NewMinter(brand.EVT)
	clock := &steppingClock{ms: []int64{1000, 1000, 2000, 1500, 500, 2000, 2001, 10, 2001}}
	m.Now = clock.Now
	var prev brand.ID
	for i := range len(clock.ms) {
		id := m.Mint()
		if i > 0 && id.Compare(prev) <= 0 {
			t.Fatalf("mint %d: %s (%s) not after %s (%s)", i, id, id.StreamID, prev, prev.StreamID)
		}
		prev = id
	}
	if got, want := prev.StreamID, (brand.StreamID{MS: 2001, Seq: 2}); got != want {
		t.Fatalf("last = %s, want %s", got, want)
	}
}

func TestMinter_Concurrent(t *testing.T) {
	m, _ := brand.NewMinter(brand.EVT)
	const goroutines, each = 16, 2000
	out := make([][]string, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				out[g] = append(out[g], m.Mint().String())
			}
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, ids := range out {
		if !sort.StringsAreSorted(ids) {
			t.Fatal("one goroutine saw ids out of order")
		}
		for _, s := range ids {
			if seen[s] {
				t.Fatalf("duplicate id %s", s)
			}
			seen[s] = true
		}
	}
}

func TestMinter_AdvancePast(t *testing.T) {
	m, _ := brand.NewMinter(brand.EVT)
	m.Now = func() time.Time { return time.UnixMilli(100) }
	m.AdvancePast(brand.StreamID{MS: 5000, Seq: 7})
	if got := m.Mint().StreamID; got != (brand.StreamID{MS: 5000, Seq: 8}) {
		t.Fatalf("after AdvancePast: %s", got)
	}
	m.AdvancePast(brand.StreamID{MS: 1, Seq: 1}) // behind: no effect
	if got := m.Mint().StreamID; got != (brand.StreamID{MS: 5000, Seq: 9}) {
		t.Fatalf("after AdvancePast behind: %s", got)
	}
}

func TestNewMinter_UnknownKind(t *testing.T) {
	if _, err := brand.NewMinter("NOPE"); err == nil {
		t.Fatal("NewMinter accepted a malformed kind")
	}
}

func FuzzParse(f *testing.F) {
	f.Add("EVT_01JC3T7QG0000000000000A")
	f.Add("USR_ZZZZZZZZZZFZZZZZZZZZZZZ")
	f.Add("EVT_01JC3X9Q8RG00000000000A")
	f.Add("evt_")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := brand.Parse(s)
		if err != nil {
			if !errors.Is(err, brand.ErrInvalid) {
				t.Fatalf("Parse(%q) error %v has no sentinel", s, err)
			}
			return
		}
		if got := id.String(); got != s {
			t.Fatalf("Parse(%q).String() = %q", s, got)
		}
		back, err := brand.FromStreamID(id.Kind, id.StreamID.String())
		if err != nil || back != id {
			t.Fatalf("stream id round trip of %q: %v, %v", s, back, err)
		}
	})
}

func ExampleFromStreamID() {
	id, err := brand.FromStreamID(brand.EVT, "1731000000000-10")
	if err != nil {
		panic(err)
	}
	back, _ := brand.Parse(id.String())
	fmt.Println(id)
	fmt.Println(back.StreamID, back.Time().Format(time.RFC3339Nano))
	// Output:
	// EVT_01JC3T7QG0000000000000A
	// 1731000000000-10 2024-11-07T17:20:00Z
}
