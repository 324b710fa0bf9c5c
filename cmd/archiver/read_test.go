package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

func runArchiver(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if len(args) > 0 && !slices.Contains(args, "--data-dir") {
		args = append([]string{args[0], "--data-dir", t.TempDir()}, args[1:]...)
	}
	code = run(context.Background(), append([]string{"archiver"}, args...), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// seed writes entries at fixed milliseconds 1_800_000_000_000 + i.
func seed(t *testing.T, rdb *redis.Client, n int) []brand.ID {
	t.Helper()
	ks, _ := stream.NewKeyspace("", "cm")
	l, err := stream.NewLog(rdb, ks, "events", brand.EVT)
	if err != nil {
		t.Fatal(err)
	}
	var ids []brand.ID
	for i := range n {
		id, _ := brand.New(brand.EVT, brand.StreamID{MS: 1_800_000_000_000 + uint64(i)})
		if err := l.AppendID(context.Background(), id, stream.Fields{"n": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func decodeLines(t *testing.T, out string) []record {
	t.Helper()
	var recs []record
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var r record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	return recs
}

func TestRead_Ranges(t *testing.T) {
	srv := testserver.Redis(t)
	ids := seed(t, srv.Client(t), 20)
	base := []string{"read", "--redis", srv.URL(), "--queue", "cm", "--stream", "events"}
	t0 := time.UnixMilli(1_800_000_000_005).UTC()
	for _, tc := range []struct {
		name        string
		args        []string
		first, last int
	}{
		{"all", nil, 0, 19},
		{"branded from/to", []string{"--from", ids[3].String(), "--to", ids[7].String()}, 3, 7},
		{"stream id from", []string{"--from", ids[15].StreamID.String()}, 15, 19},
		{"since unix ms", []string{"--since", "1800000000017"}, 17, 19},
		{"window rfc3339", []string{"--window", t0.Format(time.RFC3339Nano) + "," + t0.Add(2*time.Millisecond).Format(time.RFC3339Nano)}, 5, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runArchiver(t, append(base, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			recs := decodeLines(t, out)
			if len(recs) != tc.last-tc.first+1 {
				t.Fatalf("%d records, want %d", len(recs), tc.last-tc.first+1)
			}
			for i, r := range recs {
				want := ids[tc.first+i]
				if r.ID != want.String() || r.StreamID != want.StreamID.String() || r.Source != "live" || r.Fields["n"] != fmt.Sprint(tc.first+i) {
					t.Fatalf("record %d = %+v, want %s", i, r, want)
				}
			}
		})
	}
}

func TestRead_MalformedIsPrintedNotSkipped(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	seed(t, rdb, 2)
	rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: "emq:{cm}:stream:events", ID: "1800000000009-0", Values: []string{"id", "bogus", "x", "y"}})
	code, out, errOut := runArchiver(t, "read", "--redis", srv.URL(), "--queue", "cm", "--stream", "events")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	recs := decodeLines(t, out)
	if len(recs) != 3 || recs[2].ID != "bogus" || recs[2].Error == "" || recs[2].StreamID != "1800000000009-0" {
		t.Fatalf("records %+v; want the malformed one last with its error", recs)
	}
	if !strings.Contains(errOut, "malformed entry") {
		t.Fatalf("stderr %q has no warning", errOut)
	}
}

func TestRead_Text(t *testing.T) {
	srv := testserver.Redis(t)
	ids := seed(t, srv.Client(t), 1)
	code, out, _ := runArchiver(t, "read", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--format", "text")
	if want := ids[0].String() + " " + ids[0].StreamID.String() + " live n=0\n"; code != 0 || out != want {
		t.Fatalf("exit %d, output %q, want %q", code, out, want)
	}
}

func TestRead_UsageErrors(t *testing.T) {
	base := []string{"read", "--queue", "cm", "--stream", "events"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--window", "1,2", "--since", "1"}, "--window"},
		{[]string{"--since", "1", "--from", "-"}, "--since"},
		{[]string{"--since", "yesterday"}, "--since"},
		{[]string{"--window", "5,1"}, "--window"},
		{[]string{"--window", "5"}, "--window"},
		{[]string{"--to", "12"}, "--to"},
		{[]string{"--format", "xml"}, "--format"},
	} {
		code, _, errOut := runArchiver(t, append(base, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", tc.args, code, errOut, tc.want)
		}
	}
}

// A branded bound of another kind than the stream's (read from Redis) is a
// usage error, as is a --kind that contradicts the stream's.
func TestRead_KindIsTheStreams(t *testing.T) {
	srv := testserver.Redis(t)
	seed(t, srv.Client(t), 1) // an EVT stream
	base := []string{"read", "--redis", srv.URL(), "--queue", "cm", "--stream", "events"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--from", "USR_00000000000000000000001"}, "the stream holds EVT"},
		{[]string{"--kind", "USR"}, "holds EVT ids"},
		{[]string{"--kind", "XYZ"}, "holds EVT ids"},
	} {
		code, _, errOut := runArchiver(t, append(base, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 saying %q", tc.args, code, errOut, tc.want)
		}
	}
	if code, out, errOut := runArchiver(t, append(base, "--kind", "EVT")...); code != 0 || !strings.Contains(out, "EVT_") {
		t.Errorf("--kind matching the stream: exit %d, %s %s", code, out, errOut)
	}
}

// A read pointed at a remote that does not hold the stream's archive fails,
// naming the remote Redis recorded, instead of returning the live tail
// alone: exit 4, the archive unproven.
func TestRead_WrongRemoteIsNamed(t *testing.T) {
	srv := testserver.Redis(t)
	seed(t, srv.Client(t), 10)
	right := "file://" + t.TempDir()
	base := []string{"--redis", srv.URL(), "--queue", "cm", "--stream", "events"}
	if code, out, errOut := runArchiver(t, append(append([]string{"run"}, base...), "--remote", right, "--keep-last", "2")...); code != 0 {
		t.Fatalf("archive: exit %d %s %s", code, out, errOut)
	}
	for _, remote := range [][]string{{"--remote", "file://" + t.TempDir()}} {
		code, out, errOut := runArchiver(t, append(append([]string{"read", "--consistency-wait", "0s"}, base...), remote...)...)
		if code != 4 || !strings.Contains(errOut, right) || out != "" {
			t.Errorf("read with %v: exit %d, stdout %q, stderr %q; want exit 4 naming %s", remote, code, out, errOut, right)
		}
	}
	// Without --remote, a reader goes where Redis recorded the archive, from
	// any directory, and says so.
	if code, out, errOut := runArchiver(t, append([]string{"read"}, base...)...); code != 0 || strings.Count(out, "\n") != 10 || !strings.Contains(errOut, right) {
		t.Fatalf("read without --remote: exit %d, %s %s", code, out, errOut)
	}
	if code, out, errOut := runArchiver(t, append(append([]string{"read"}, base...), "--remote", right)...); code != 0 || strings.Count(out, "\n") != 10 {
		t.Fatalf("read with the right remote: exit %d, %s %s", code, out, errOut)
	}
}

// `export SILT_STREAM=events`, as the README's quick tour does, must not
// make `archiver run --all` a usage error: --all wins over the stream the
// environment gave. Both on the command line stay a usage error.
func TestRun_AllWinsOverTheEnvironmentsStream(t *testing.T) {
	srv := testserver.Redis(t)
	seed(t, srv.Client(t), 10)
	t.Setenv("SILT_STREAM", "events")
	base := []string{"--redis", srv.URL(), "--queue", "cm", "--remote", "file://" + t.TempDir(), "--keep-last", "2"}
	if code, out, errOut := runArchiver(t, append([]string{"run", "--all"}, base...)...); code != 0 || !strings.Contains(out, `"archived":8`) {
		t.Fatalf("run --all with SILT_STREAM set: exit %d %s %s", code, out, errOut)
	}
	if code, _, errOut := runArchiver(t, append([]string{"run", "--all", "--stream", "other"}, base...)...); code != 2 {
		t.Fatalf("run --all --stream other: exit %d %s, want a usage error", code, errOut)
	}
}

// archiver trim on an archived stream refuses to remove entries its archive
// does not hold, naming how many, unless --force; what a forced trim
// removed is recorded, and status attributes it to the trim, not to
// something outside silt.
func TestTrim_ArchivedStreamKeepsUnarchivedEntries(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	seed(t, rdb, 10)
	base := []string{"--redis", srv.URL(), "--queue", "cm", "--stream", "events"}
	if code, out, errOut := runArchiver(t, append(append([]string{"run"}, base...), "--remote", "file://"+t.TempDir(), "--keep-last", "5", "--exact")...); code != 0 {
		t.Fatalf("archive: exit %d %s %s", code, out, errOut)
	}
	trim := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append(append([]string{"archiver", "trim"}, base...), args...), strings.NewReader(""), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, _, errOut := trim("--keep-last", "1", "--exact")
	if code != 1 || !strings.Contains(errOut, "remove 4 entries") || !strings.Contains(errOut, "--force") {
		t.Fatalf("trim of unarchived entries: exit %d %s", code, errOut)
	}
	if n := rdb.XLen(context.Background(), "emq:{cm}:stream:events").Val(); n != 5 {
		t.Fatalf("the refused trim left %d of 5 entries", n)
	}
	if code, out, errOut := trim("--keep-last", "1", "--exact", "--force"); code != 0 || !strings.Contains(out, `"removed_for_good":4`) {
		t.Fatalf("trim --force: exit %d %s %s", code, out, errOut)
	}
	var st struct {
		Trimmed  int64 `json:"trimmed_unarchived"`
		Lost     int64 `json:"lost_outside"`
		Complete bool  `json:"complete"`
	}
	code, out, errOut := runArchiver(t, append([]string{"status", "--json"}, base...)...)
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.Trimmed != 4 || st.Lost != 0 || st.Complete {
		t.Fatalf("status after trim --force: exit %d %s %s (%v); want trimmed_unarchived 4, lost_outside 0, not complete", code, out, errOut, err)
	}
	if code, out, _ := runArchiver(t, append([]string{"status"}, base...)...); code != 0 || !strings.Contains(out, "4 entries removed unarchived by archiver trim") {
		t.Fatalf("status text after trim --force: %s", out)
	}
}

// On a small stream the default approximate trim removes nothing (whole
// nodes only): the run says why and how to trim exactly.
func TestRun_ApproximateTrimSaysWhyNothingWent(t *testing.T) {
	srv := testserver.Redis(t)
	seed(t, srv.Client(t), 10)
	code, out, errOut := runArchiver(t, "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--remote", "file://"+t.TempDir(), "--keep-last", "3")
	if code != 0 || !strings.Contains(out, `"archived":7`) || !strings.Contains(out, `"trimmed":0`) {
		t.Fatalf("exit %d %s %s", code, out, errOut)
	}
	if !strings.Contains(errOut, "trimmed none yet") || !strings.Contains(errOut, "--exact") {
		t.Fatalf("the run does not say why it trimmed nothing: %s", errOut)
	}
}

// archiver run --all reaches streams adopted with --key and their
// dead-letter streams, whatever the key's hash tag holds: app:events, whose
// tag is the whole key, is no queue name.
func TestRun_AllReachesAdoptedStreamsAndTheirDeadLetters(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	// silt's ACL user gets the adopted keys, as docs/security.md says
	if err := rdb.Do(ctx, "ACL", "SETUSER", testserver.SiltUser, "~app:*").Err(); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"app:events", "app:{tenant}:events"} {
		for i := range 10 {
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: map[string]any{"n": fmt.Sprint(i)}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		ks, name, err := stream.KeyspaceFor("", key)
		if err != nil {
			t.Fatal(err)
		}
		l, err := stream.NewLog(rdb, ks, name, brand.EVT)
		if err != nil {
			t.Fatal(err)
		}
		c, err := stream.NewConsumer(l, "g", "w1")
		if err != nil {
			t.Fatal(err)
		}
		c.Block = time.Millisecond
		refuse := func(context.Context, stream.Delivery) error { return stream.Permanent(fmt.Errorf("refused")) }
		if sum, err := c.Run(ctx, refuse); err != nil || sum.DeadLettered != 10 {
			t.Fatalf("%s: %+v %v", key, sum, err)
		}
		if err := stream.RecordAdopted(ctx, rdb, ks); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := runArchiver(t, "run", "--all", "--redis", srv.URL(), "--remote", "file://"+t.TempDir(), "--keep-last", "2")
	var res struct {
		Streams []struct {
			Queue, Stream string
			Group         string `json:"dead_letters_of"`
			Archived      int64
		}
	}
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil {
		t.Fatalf("run --all: exit %d %v\n%s%s", code, err, out, errOut)
	}
	type found struct{ queue, group string }
	got := map[found]int64{}
	for _, s := range res.Streams {
		got[found{s.Queue, s.Group}] = s.Archived
	}
	for _, want := range []found{{"app:events", ""}, {"app:events", "g"}, {"tenant", ""}, {"tenant", "g"}} {
		if got[want] != 8 {
			t.Errorf("run --all archived %d of the 10 entries of queue %q (dead letters of %q), want 8\n%s", got[want], want.queue, want.group, out)
		}
	}
}
