package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// history is what one scenario did, recorded so that a checker can compare
// it with the promises (the Jepsen way: record, then check, and show with a
// negative control that the checker can fail).
//
//   - appended: every id Redis acknowledged, in append order;
//   - unacked: appends whose outcome is unknown (the call failed), which may
//     or may not be in the stream;
//   - handled: every handler call, per id (the recorder file);
//   - dead: ids that landed in the group's dead-letter stream;
//   - read: the final merged read, in the order it came.
type history struct {
	mu       sync.Mutex
	appended []string
	unacked  int
	handled  map[string]int
	dead     map[string]bool
	read     []string
}

// counts is the checker's verdict on a history.
type counts struct {
	Entries    int // acknowledged appends
	Handled    int // distinct ids handled (worker scenarios)
	Lost       int // acknowledged, but never handled nor dead-lettered / missing from the read
	Duplicates int // handler calls beyond the first (worker) / ids read twice (read)
	Reordered  int // reads that came before their predecessor in mint order
	Gaps       int // runs of consecutive lost ids with a present id after them
	Phantoms   int // handled or read ids that were never appended (beyond the unknown outcomes)
}

func (c counts) String() string {
	return fmt.Sprintf("entries %d, handled %d, lost %d, duplicates %d, reordered %d, gaps %d, phantoms %d",
		c.Entries, c.Handled, c.Lost, c.Duplicates, c.Reordered, c.Gaps, c.Phantoms)
}

func newHistory(appended []string) *history {
	return &history{appended: slices.Clone(appended), handled: map[string]int{}, dead: map[string]bool{}}
}

// appendAcked records ids that an append returned.
func (h *history) appendAcked(ids ...string) {
	h.mu.Lock()
	h.appended = append(h.appended, ids...)
	h.mu.Unlock()
}

// appendUnknown records n appends whose outcome is unknown.
func (h *history) appendUnknown(n int) {
	h.mu.Lock()
	h.unacked += n
	h.mu.Unlock()
}

// loadHandled reads a recorder file written by recordingHandler.
func (h *history) loadHandled(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	// Only whole lines: a test that polls the file while handlers run may
	// read one a handler is still writing.
	b = b[:bytes.LastIndexByte(b, '\n')+1]
	for line := range bytes.Lines(b) {
		line = bytes.TrimSuffix(line, []byte("\n"))
		if len(line) == 0 {
			continue // a handler whose worker died before it wrote the delivery
		}
		var d struct{ ID string }
		if err := json.Unmarshal(line, &d); err != nil {
			t.Fatalf("recorder line %q: %v", line, err)
		}
		h.handled[d.ID]++
	}
}

// loadDead reads the ids of a group's dead-letter stream.
func (h *history) loadDead(t *testing.T, rdb redis.UniversalClient, key string) {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), key, "-", "+").Result()
	if err != nil {
		t.Fatalf("read dead letters %s: %v", key, err)
	}
	for _, m := range msgs {
		h.dead[fmt.Sprint(m.Values["entry_id"])] = true
	}
}

// loadRead parses the JSON lines of `archiver read`; it returns how many came
// from the archive.
func (h *history) loadRead(t *testing.T, out string) (fromArchive int) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var r struct{ ID, Source string }
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("read line %q: %v", line, err)
		}
		h.read = append(h.read, r.ID)
		if r.Source == "archive" {
			fromArchive++
		}
	}
	return fromArchive
}

// checkHandled is the at-least-once check: every acknowledged append was
// handled or dead-lettered.
func (h *history) checkHandled() counts {
	c := counts{Entries: len(h.appended), Handled: len(h.handled)}
	known := make(map[string]bool, len(h.appended))
	for _, id := range h.appended {
		known[id] = true
		if h.handled[id] == 0 && !h.dead[id] {
			c.Lost++
		}
	}
	for id, n := range h.handled {
		c.Duplicates += n - 1
		if !known[id] {
			c.Phantoms++
		}
	}
	c.Gaps = gaps(h.appended, func(id string) bool { return h.handled[id] > 0 || h.dead[id] })
	c.Phantoms = max(c.Phantoms-h.unacked, 0)
	return c
}

// checkRead is the one-history check on the final merged read: every
// acknowledged append exactly once, in mint order, nothing else.
func (h *history) checkRead() counts {
	c := counts{Entries: len(h.appended)}
	seen := make(map[string]int, len(h.read))
	for i, id := range h.read {
		if seen[id]++; seen[id] > 1 {
			c.Duplicates++
		}
		if i > 0 && id < h.read[i-1] {
			c.Reordered++
		}
	}
	known := make(map[string]bool, len(h.appended))
	for _, id := range h.appended {
		known[id] = true
		if seen[id] == 0 {
			c.Lost++
		}
	}
	for id := range seen {
		if !known[id] {
			c.Phantoms++
		}
	}
	sorted := slices.Clone(h.appended)
	slices.Sort(sorted) // branded ids: string order is mint order
	c.Gaps = gaps(sorted, func(id string) bool { return seen[id] > 0 })
	c.Phantoms = max(c.Phantoms-h.unacked, 0)
	return c
}

// gaps counts the runs of absent ids in ids that have a present id after them.
func gaps(ids []string, present func(string) bool) int {
	n, inRun := 0, false
	for _, id := range ids {
		switch {
		case !present(id):
			inRun = true
		case inRun:
			n++
			inRun = false
		}
	}
	return n
}

// broken reports whether c breaks a promise; for handler counts, duplicates
// are allowed (at least once), for reads they are not (one history).
func (c counts) broken(read bool) bool {
	return c.Lost+c.Reordered+c.Gaps+c.Phantoms != 0 || (read && c.Duplicates != 0)
}

// scenario is one row of RELIABILITY.md: what was injected and what the
// checker found.
type scenario struct {
	Name     string `json:"name"`
	Test     string `json:"test"`     // the test that runs it (set by report)
	Runs     int    `json:"runs"`     // program runs in the scenario
	Faults   int    `json:"faults"`   // faults injected (kills, cuts, error answers, ...)
	Detected int    `json:"detected"` // faults the system or the checker noticed (corruption, negative controls)
	// Promised: detecting every fault is the promise (a refusal, an error
	// naming the cause, a handler killed with its worker): report fails
	// the test when Detected is below Faults.
	Promised bool `json:"-"`
	counts
}

// detector counts the faults a test injects and those the program
// reported (by its exit status, its output, or the effect promised), for a
// Promised scenario: the figures in RELIABILITY.md are what was observed.
type detector struct{ injected, detected int }

// fault counts one injected fault; one not reported is an error naming it.
func (d *detector) fault(t *testing.T, reported bool, format string, args ...any) {
	t.Helper()
	d.injected++
	if reported {
		d.detected++
		return
	}
	t.Errorf("fault not reported: "+format, args...)
}

// report logs a scenario's figures and, when SILT_RELIABILITY_REPORT names a
// file, appends them to it as one JSON line (scripts/reliability.sh reads it).
func report(t *testing.T, s scenario) {
	t.Helper()
	if s.Name == "" {
		s.Name = t.Name()
	}
	s.Test = t.Name()
	t.Logf("history %s: runs %d, faults %d, detected %d; %s", s.Name, s.Runs, s.Faults, s.Detected, s.counts)
	if s.Promised && (s.Faults == 0 || s.Detected < s.Faults) {
		t.Errorf("%s: %d of %d faults detected; detecting every one is the promise", s.Name, s.Detected, s.Faults)
	}
	path := os.Getenv("SILT_RELIABILITY_REPORT")
	if path == "" {
		return
	}
	b, _ := json.Marshal(s)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	defer f.Close()
	f.Write(append(b, '\n'))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// long reports whether the long tier runs (SILT_RELIABILITY_TIER=long):
// more kills, bigger streams, longer fault windows.
func long() bool { return os.Getenv("SILT_RELIABILITY_TIER") == "long" }

// tier returns fast, or long in the long tier.
func tier[T any](fast, long_ T) T {
	if long() {
		return long_
	}
	return fast
}
