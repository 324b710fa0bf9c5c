package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// exitCode runs bin with args and returns its exit code and stderr.
func exitCode(t *testing.T, env []string, stdin, bin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, bin), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	transcript.add(out.String(), errOut.String())
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errOut.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errOut.String()
}

func newLog(t *testing.T, srv *testserver.RedisServer) *stream.Log {
	t.Helper()
	ks, _ := stream.NewKeyspace("", "cm")
	l, err := stream.NewLog(srv.Client(t), ks, "events", brand.EVT)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestBadInput_Oversized: the limit is a flag; append refuses a larger entry
// naming the line, the worker dead-letters it unhandled (without its
// payload) and goes on, the archiver stops at it naming its id and trims
// nothing.
func TestBadInput_Oversized(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := append(faultEnv(srv, dir), "SILT_MAX_ENTRY_BYTES=1000")
	big := `{"blob":"` + strings.Repeat("x", 2000) + `"}`
	code, _, errOut := exitCode(t, env, `{"a":"1"}`+"\n"+big+"\n", "worker", "append")
	if code != 1 || !strings.Contains(errOut, "over the limit of 1000") || !strings.Contains(errOut, "line 2") {
		t.Fatalf("append of an oversized line: exit %d, %s", code, errOut)
	}
	// Another writer without a limit puts one in.
	l := newLog(t, srv)
	ids, err := l.AppendBatch(context.Background(), []stream.Fields{{"blob": strings.Repeat("y", 5000)}, {"b": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(dir, "handled")
	out := silt(t, "", env, "worker", workerArgs("w1", rec)...)
	var sum struct{ Oversized, DeadLettered, Acked int }
	json.Unmarshal([]byte(out), &sum)
	h := handled(t, rec)
	dead := srv.Client(t).XRange(context.Background(), deadKey, "-", "+").Val()
	if sum.Oversized != 1 || h[ids[0].String()] != 0 || h[ids[1].String()] != 1 || len(dead) != 1 ||
		!strings.Contains(fmt.Sprint(dead[0].Values["reason"]), "oversized entry: 5004 bytes") || len(fmt.Sprint(dead[0].Values["payload"])) > 10 {
		t.Fatalf("worker: summary %s, handled %v, dead %v", out, h, dead)
	}
	code, _, errOut = exitCode(t, env, "", "archiver", "run", "--stream", "events", "--keep-last", "1", "--max-entry-bytes", "1000")
	if code != 1 || !strings.Contains(errOut, ids[0].StreamID.String()) || !strings.Contains(errOut, "--max-entry-bytes") {
		t.Fatalf("archiver at an oversized entry: exit %d, %s", code, errOut)
	}
	if n := srv.Client(t).XLen(context.Background(), streamKey).Val(); n != 3 {
		t.Fatalf("%d entries live after the refused run, want 3", n)
	}
	// With the default limit the run goes on, and the history is whole.
	first := strings.Split(silt(t, "", env, "archiver", "read"), `"`)[3]
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "1", "--exact")
	hist := newHistory([]string{first, ids[0].String(), ids[1].String()})
	if from := hist.loadRead(t, silt(t, "", env, "archiver", "read")); from != 2 {
		t.Fatalf("%d entries from the archive, want 2", from)
	}
	if c := hist.checkRead(); c.broken(true) {
		t.Fatalf("history after the oversized entry: %s", c)
	}
}

// TestBadInput_ManyFieldsAndBinary: an entry of 5,000 fields and one of
// binary values (every byte value, invalid UTF-8) go through the worker and
// the archive unchanged; JSON carries the binary ones base64-encoded.
func TestBadInput_ManyFieldsAndBinary(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := faultEnv(srv, dir)
	many := stream.Fields{}
	for i := range 5000 {
		many[fmt.Sprintf("f%04d", i)] = fmt.Sprint(i)
	}
	var all []byte
	for b := range 256 {
		all = append(all, byte(b))
	}
	bin := stream.Fields{"raw": string(all), "\xff\xfename": "v", "text": "plain"}
	ids, err := newLog(t, srv).AppendBatch(context.Background(), []stream.Fields{many, bin})
	if err != nil {
		t.Fatal(err)
	}
	out := silt(t, "", env, "worker", "run", "--consumer", "w1", "--block", "200ms", "--stdout")
	var docs []struct {
		ID            string
		Payload       map[string]string
		PayloadBase64 map[string]string `json:"payload_base64"`
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var d struct {
			ID            string
			Payload       map[string]string
			PayloadBase64 map[string]string `json:"payload_base64"`
		}
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatalf("delivery %q: %v", line, err)
		}
		docs = append(docs, d)
	}
	if len(docs) != 2 || len(docs[0].Payload) != 5000 || docs[0].Payload["f4999"] != "4999" {
		t.Fatalf("deliveries: %d, first with %d fields", len(docs), len(docs[0].Payload))
	}
	checkBinary(t, "delivery", docs[1].Payload, docs[1].PayloadBase64, bin)

	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "1", "--exact")
	lines := strings.Split(strings.TrimSpace(silt(t, "", env, "archiver", "read")), "\n")
	var recs []struct {
		ID, Source   string
		Fields       map[string]string
		FieldsBase64 map[string]string `json:"fields_base64"`
	}
	for _, line := range lines {
		var r struct {
			ID, Source   string
			Fields       map[string]string
			FieldsBase64 map[string]string `json:"fields_base64"`
		}
		json.Unmarshal([]byte(line), &r)
		recs = append(recs, r)
	}
	if len(recs) != 2 || recs[0].Source != "archive" || recs[0].ID != ids[0].String() || len(recs[0].Fields) < 5000 {
		t.Fatalf("archived read: %d records, first %s from %s with %d fields", len(recs), recs[0].ID, recs[0].Source, len(recs[0].Fields))
	}
	delete(recs[1].Fields, "id")
	checkBinary(t, "archived read", recs[1].Fields, recs[1].FieldsBase64, bin)
}

func checkBinary(t *testing.T, what string, text, b64 map[string]string, want stream.Fields) {
	t.Helper()
	got := map[string]string{}
	for k, v := range text {
		got[k] = v
	}
	for k, v := range b64 {
		kb, err1 := base64.StdEncoding.DecodeString(k)
		vb, err2 := base64.StdEncoding.DecodeString(v)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: base64 %q=%q: %v %v", what, k, v, err1, err2)
		}
		got[string(kb)] = string(vb)
	}
	if fmt.Sprint(sortedPairs(got)) != fmt.Sprint(sortedPairs(want)) {
		t.Fatalf("%s: fields %q, want %q", what, got, want)
	}
}

func sortedPairs(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// TestBadInput_WrongKindAndMissingID: entries whose id field is of another
// kind or malformed are dead-lettered by the worker with the reason, and
// archived as they are (flagged) by the archiver; an entry without an id
// field (another producer's plain XADD) is handled under the id its stream
// id maps to.
func TestBadInput_WrongKindAndMissingID(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := faultEnv(srv, dir)
	rdb := srv.Client(t)
	ctx := context.Background()
	usr, _ := brand.New(brand.USR, brand.StreamID{MS: 1700000000000, Seq: 1})
	// An EVT stream (its first append recorded the kind) into which another
	// writer put raw entries; without the record, the stream's first entry
	// (the USR one) would make it a USR stream.
	rdb.HSet(ctx, "emq:{cm}:kinds", "events", "EVT")
	for i, vals := range []map[string]any{{"id": usr.String(), "a": "1"}, {"id": "EVT_nonsense", "a": "2"}, {"a": "3"}} {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: streamKey, ID: fmt.Sprintf("1700000000000-%d", i+1), Values: vals})
	}
	good := feed(t, env, 3)
	rec := filepath.Join(dir, "handled")
	out := silt(t, "", env, "worker", workerArgs("w1", rec)...)
	var sum struct{ Malformed, Acked int }
	json.Unmarshal([]byte(out), &sum)
	dead := rdb.XRange(ctx, deadKey, "-", "+").Val()
	foreign, _ := brand.New(brand.EVT, brand.StreamID{MS: 1700000000000, Seq: 3})
	if sum.Malformed != 2 || len(dead) != 2 || len(handled(t, rec)) != 4 || handled(t, rec)[foreign.String()] != 1 {
		t.Fatalf("worker: %s; %d dead letters; handled %v", out, len(dead), handled(t, rec))
	}
	for _, d := range dead {
		if !strings.Contains(fmt.Sprint(d.Values["reason"]), "malformed entry") {
			t.Fatalf("dead letter reason %q", d.Values["reason"])
		}
	}
	for _, id := range good {
		if handled(t, rec)[id] != 1 {
			t.Fatalf("good entry %s not handled", id)
		}
	}
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "1", "--exact")
	st := silt(t, "", env, "archiver", "status", "--json")
	if !strings.Contains(st, `"malformed": 2`) || !strings.Contains(st, `"archived": 5`) {
		t.Fatalf("status after archiving 2 malformed entries: %s", st)
	}
}

// TestBadInput_NamesURLsAndFlags: names with braces, spaces or newlines,
// unknown URL schemes and bad values are usage errors (exit 2) naming the
// flag, and never touch Redis.
func TestBadInput_NamesURLsAndFlags(t *testing.T) {
	env := []string{"SILT_REDIS_URL=redis://127.0.0.1:1/0", "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	for _, tc := range []struct {
		bin  string
		args []string
		flag string
	}{
		{"worker", []string{"append", "--queue", "c{m", "a=1"}, "--queue"},
		{"worker", []string{"append", "--queue", "c}m", "a=1"}, "--queue"},
		{"worker", []string{"append", "--stream", "two words", "a=1"}, "--stream"},
		{"worker", []string{"append", "--stream", "line\nbreak", "a=1"}, "--stream"},
		{"worker", []string{"append", "--prefix", "p re", "a=1"}, "--prefix"},
		{"worker", []string{"run", "--group", "g{1}", "--", "true"}, "group"},
		{"worker", []string{"run", "--consumer", "a\nb", "--", "true"}, "consumer"},
		{"worker", []string{"append", "--redis", "ftp://127.0.0.1:6379", "a=1"}, "--redis"},
		{"worker", []string{"append", "--redis", "redis://127.0.0.1:6379/notanumber", "a=1"}, "--redis"},
		{"worker", []string{"append", "--kind", "evt", "a=1"}, "--kind"},
		{"worker", []string{"append", "--max-entry-bytes", "-1", "a=1"}, "--max-entry-bytes"},
		{"worker", []string{"append", "id=EVT_x"}, "id=EVT_x"},
		{"worker", []string{"run", "--count", "-1", "--", "true"}, "--count"},
		{"worker", []string{"run", "--min-idle", "0s", "--", "true"}, "--min-idle"},
		{"worker", []string{"run", "--max-entry-bytes", "-5", "--", "true"}, "--max-entry-bytes"},
		{"worker", []string{"run", "--log-format", "xml", "--", "true"}, "--log-format"},
		{"archiver", []string{"run", "--remote", "ftp://x/y", "--keep-last", "1"}, "--remote"},
		{"archiver", []string{"run", "--remote", "s3://b/p?endpoint=gopher://x", "--keep-last", "1"}, "--remote"},
		{"archiver", []string{"run", "--remote", "s3://b/p?timeout=soon", "--keep-last", "1"}, "--remote"},
		{"archiver", []string{"run", "--remote", "relative/dir", "--keep-last", "1"}, "--remote"},
		{"archiver", []string{"run", "--keep-last", "-3"}, "--keep-last"},
		{"archiver", []string{"read", "--from", "yesterday"}, "--from"},
		{"archiver", []string{"run", "--no-such-flag"}, "no-such-flag"},
		{"archiver", []string{"read", "--since", "-5m"}, "--since"},
		{"archiver", []string{"export"}, "--to"},
		{"archiver", []string{"export", "--to", "relative/dir"}, "--to"},
		{"archiver", []string{"export", "--to", "file:///tmp/x", "--format", "csv"}, "--format"},
		{"archiver", []string{"export", "--to", "file:///tmp/x", "--since", "1h", "--from", "-"}, "--since"},
		{"archiver", []string{"export", "--to", "file:///tmp/x", "--max-file-rows", "0"}, "--max-file-rows"},
		{"archiver", []string{"run", "--keep-last", "1", "--export-format", "jsonl"}, "--export-format"},
		{"archiver", []string{"run", "--keep-last", "1", "--export-to", "s3://"}, "--export-to"},
	} {
		code, _, errOut := exitCode(t, env, "", tc.bin, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.flag) || strings.Contains(errOut, "panic") {
			t.Errorf("%s %q: exit %d, %q; want 2 naming %s", tc.bin, tc.args, code, errOut, tc.flag)
		}
	}
}

// TestBadInput_ForeignRemoteAndNewerFormat: a data directory pointed at a
// remote holding another history of the same volume is refused, naming
// both; a commit object of a newer format version is refused, not misread.
func TestBadInput_ForeignRemoteAndNewerFormat(t *testing.T) {
	dir := t.TempDir()
	a, b := testserver.Redis(t), testserver.Redis(t)
	envA := archiverEnv(a, filepath.Join(dir, "data"), "file://"+filepath.Join(dir, "remoteA"))
	envB := archiverEnv(b, filepath.Join(dir, "dataB"), "file://"+filepath.Join(dir, "remoteB"))
	feed(t, envA, 50)
	feed(t, envB, 60)
	silt(t, "", envA, "archiver", "run", "--stream", "events", "--keep-last", "10")
	silt(t, "", envB, "archiver", "run", "--stream", "events", "--keep-last", "10")
	// The data dir of A, the remote of B.
	mixed := archiverEnv(a, filepath.Join(dir, "data"), "file://"+filepath.Join(dir, "remoteB"))
	code, _, errOut := exitCode(t, mixed, "", "archiver", "run", "--stream", "events", "--keep-last", "10")
	if code != 4 || !strings.Contains(errOut, "commit") || !strings.Contains(errOut, "in file://") {
		t.Fatalf("data dir of one history, remote of another: exit %d (want 4, not proven), %s", code, errOut)
	}
	t.Logf("foreign remote refused: %s", strings.TrimSpace(errOut))
	if lines := strings.Count(silt(t, "", envA, "archiver", "read"), "\n"); lines != 50 {
		t.Fatalf("after the refusal A reads %d entries, want 50", lines)
	}

	// A commit from a newer version of silt, as the next LSN of A's remote,
	// made from the record of A's last commit (its local copy: the remote
	// object is packed, the segment first).
	commits := filepath.Join(dir, "remoteA", "emq.cm.events", "commits")
	names, _ := os.ReadDir(commits)
	last := names[len(names)-1].Name()
	obj, err := os.ReadFile(filepath.Join(dir, "data", "emq.cm.events", "commits", last))
	if err != nil {
		t.Fatal(err)
	}
	body, _, _ := strings.Cut(string(obj), "\n")
	var c map[string]any
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		t.Fatal(err)
	}
	c["version"], c["lsn"] = 4, c["lsn"].(float64)+1 // 2 is compaction and prune, 3 a packed commit; 4 is from the future
	nb, _ := json.Marshal(c)
	sum := sha256.Sum256(nb)
	next := fmt.Sprintf("%020d", int(c["lsn"].(float64)))
	os.WriteFile(filepath.Join(commits, next), []byte(string(nb)+"\nsha256 "+hex.EncodeToString(sum[:])+"\n"), 0o644)
	for _, args := range [][]string{{"run", "--stream", "events", "--keep-last", "10"}, {"read"}, {"verify"}} {
		code, _, errOut := exitCode(t, envA, "", "archiver", args...)
		if code != 1 || !strings.Contains(errOut, "newer format version") || !strings.Contains(errOut, next) {
			t.Fatalf("archiver %v with a newer commit: exit %d, %s", args, code, errOut)
		}
	}
}

// TestReadOnly_LeavesNoDataDir: archiver read, status, verify and export,
// run in an empty directory with the default --data-dir, leave nothing
// there (they used to create ./silt-data and an empty remote in it).
func TestReadOnly_LeavesNoDataDir(t *testing.T) {
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events"}
	feed(t, env, 20)
	cwd := t.TempDir()
	target := t.TempDir()
	for _, args := range [][]string{{"read"}, {"status"}, {"verify"}, {"export", "--to", "file://" + target}} {
		cmd := exec.Command(filepath.Join(binDir, "archiver"), args...)
		cmd.Dir = cwd
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "SILT_DATA_DIR=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		transcript.add(string(out))
		if err != nil {
			t.Fatalf("archiver %v: %v\n%s", args, err, out)
		}
		if left, _ := os.ReadDir(cwd); len(left) != 0 {
			t.Fatalf("archiver %v left %s in its working directory", args, left[0].Name())
		}
	}
}
