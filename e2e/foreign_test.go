package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// TestForeign_PlainXAddEntriesAreFirstClass: a stream written by silt and
// by a producer that knows nothing of it (plain `XADD key * field value`,
// no "id" field) goes through worker, archiver, merged read and Parquet
// export, every entry delivered once under the branded id its stream id
// maps to, archived, and read back with that id and its fields; nothing is
// malformed or dead-lettered.
func TestForeign_PlainXAddEntriesAreFirstClass(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := faultEnv(srv, dir)
	rdb := srv.Client(t)
	ctx := context.Background()
	want := map[string]map[string]string{} // branded id -> fields
	for round := range 5 {
		for _, id := range feed(t, env, 20) {
			want[id] = nil // silt's own: fields checked by the read below
		}
		for i := range 30 {
			fields := map[string]string{"order": fmt.Sprintf("o-%d-%d", round, i), "amount": fmt.Sprint(i * 7)}
			sid, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: streamKey, ID: "*", Values: fields}).Result()
			if err != nil {
				t.Fatal(err)
			}
			id, err := brand.FromStreamID(brand.EVT, sid)
			if err != nil {
				t.Fatal(err)
			}
			want[id.String()] = fields
		}
	}
	rec := filepath.Join(dir, "handled")
	out := silt(t, "", env, "worker", workerArgs("w1", rec)...)
	var sum struct{ Malformed, DeadLettered, Acked int }
	json.Unmarshal([]byte(out), &sum)
	got := handled(t, rec)
	if sum.Malformed != 0 || sum.DeadLettered != 0 || sum.Acked != len(want) || len(got) != len(want) {
		t.Fatalf("worker over %d entries: %s; %d handled", len(want), out, len(got))
	}
	for id := range want {
		if got[id] != 1 {
			t.Fatalf("%s handled %d times", id, got[id])
		}
	}
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "25", "--exact", "--slice-entries", "40")
	lines := strings.Split(strings.TrimSpace(silt(t, "", env, "archiver", "read")), "\n")
	archived := 0
	for _, line := range lines {
		var r struct {
			ID, Source, Error string
			Fields            map[string]string
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Error != "" {
			t.Fatalf("read line %s: %v", line, err)
		}
		f, ok := want[r.ID]
		if !ok {
			t.Fatalf("read an id never appended: %s", line)
		}
		if f != nil && fmt.Sprint(sortedPairs(r.Fields)) != fmt.Sprint(sortedPairs(f)) {
			t.Fatalf("%s read back with fields %v, appended %v", r.ID, r.Fields, f)
		}
		if r.Source == "archive" {
			archived++
		}
	}
	if len(lines) != len(want) || archived != len(want)-25 {
		t.Fatalf("merged read: %d lines, %d from the archive; want %d, %d", len(lines), archived, len(want), len(want)-25)
	}
	target := t.TempDir()
	silt(t, "", env, "archiver", "export", "--to", "file://"+target)
	rows := duckRows(t, target, "")
	if len(rows) != len(want) {
		t.Fatalf("DuckDB reads %d rows of %d", len(rows), len(want))
	}
	for _, r := range rows {
		if f, ok := want[r.ID]; !ok || r.Error != "" || (f != nil && fmt.Sprint(sortedPairs(r.Fields)) != fmt.Sprint(sortedPairs(f))) {
			t.Fatalf("exported row %+v", r)
		}
	}
	report(t, scenario{Name: "a stream half written by plain XADD * (no id field): worker, archive, read, export", Runs: 4, counts: counts{Entries: len(want)}})
}

// TestForeign_StreamUnderItsOwnKey: streams that another language's client
// writes with plain XADD * (ioredis; a Cluster client on the cluster) under
// their own key names (`app:events`, `orders`, `app:{tenant}:events`) are adopted
// with --key: worker, archiver, merged read and both statuses work on them,
// and the Parquet export holds every entry once under its derived id, read
// by DuckDB, on one Redis and on a Redis Cluster (silt's keys share the stream key's
// hash tag, so its scripts and MULTIs stay in one slot), and a policy
// declared for one is applied by archiver run --all.
func TestForeign_StreamUnderItsOwnKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		srv  func(*testing.T) redisUnderTest
	}{
		{"single", func(t *testing.T) redisUnderTest { return testserver.Redis(t) }},
		{"cluster", func(t *testing.T) redisUnderTest { return testserver.Cluster(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := tc.srv(t)
			rdb := srv.Universal(t)
			ctx := context.Background()
			if tc.name == "single" { // silt's ACL user gets the adopted keys, as docs/security.md says
				if err := rdb.Do(ctx, "ACL", "SETUSER", testserver.SiltUser, "~orders", "~app:*").Err(); err != nil {
					t.Fatal(err)
				}
			}
			for _, key := range []string{"app:events", "orders", "app:{tenant}:events"} {
				dir := t.TempDir()
				env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_KEY=" + key, "SILT_GROUP=g",
					"SILT_DATA_DIR=" + filepath.Join(dir, "data"), "SILT_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote")}
				// The producer is another language's client: ioredis,
				// plain XADD key * (a Cluster client on the cluster).
				var want []string
				for _, sid := range nodeXAdd(t, srv.URL(), key, 60) {
					id, err := brand.FromStreamID(brand.EVT, sid)
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, id.String())
				}
				rec := filepath.Join(dir, "handled")
				out := silt(t, "", env, "worker", append([]string{"run", "--block", "100ms"}, recordingHandler(rec)...)...)
				got := handled(t, rec)
				if len(got) != len(want) || !strings.Contains(out, `"acked":60`) {
					t.Fatalf("%s: worker %s; handled %d of %d", key, out, len(got), len(want))
				}
				silt(t, "", env, "archiver", "run", "--keep-last", "10", "--exact")
				if n := rdb.XLen(ctx, key).Val(); n != 10 {
					t.Fatalf("%s holds %d entries after archiving all but 10", key, n)
				}
				lines := strings.Split(strings.TrimSpace(silt(t, "", env, "archiver", "read")), "\n")
				if len(lines) != len(want) {
					t.Fatalf("%s: read %d of %d", key, len(lines), len(want))
				}
				for i, line := range lines {
					var r struct{ ID, Source string }
					json.Unmarshal([]byte(line), &r)
					if r.ID != want[i] || (i < 50) != (r.Source == "archive") {
						t.Fatalf("%s line %d: %s, want %s", key, i, line, want[i])
					}
				}
				// The Parquet export holds every entry once, under its derived id.
				audit := filepath.Join(dir, "audit")
				silt(t, "", env, "archiver", "export", "--to", "file://"+audit)
				rows := duckRows(t, audit, "")
				if len(rows) != len(want) {
					t.Fatalf("%s: the export holds %d rows, want %d", key, len(rows), len(want))
				}
				for i, r := range rows {
					if r.ID != want[i] || r.Fields["n"] != fmt.Sprint(i) {
						t.Fatalf("%s: export row %d: %+v, want %s", key, i, r, want[i])
					}
				}
				silt(t, "", env, "archiver", "status")
				if st := silt(t, "", env, "worker", "status"); !strings.Contains(st, key) {
					t.Fatalf("worker status of %s: %s", key, st)
				}
				// A declared policy reaches it through archiver run --all,
				// which finds adopted streams as it finds silt's own.
				for i := range 20 {
					if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: "*", Values: map[string]any{"m": fmt.Sprint(i)}}).Err(); err != nil {
						t.Fatal(err)
					}
				}
				silt(t, "", env, "archiver", "policy", "set", "--keep-last", "5", "--exact")
				// (--queue: the key's hash tag, when it can name a queue; each
				// key of this test has a remote of its own, and app:events,
				// whose tag is the whole key, comes first, alone in Redis)
				all := slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "SILT_KEY=") })
				if tag := stream.HashTag(key); stream.ValidateName("queue", tag) == nil {
					all = append(all, "SILT_QUEUE="+tag)
				}
				if out := silt(t, "", all, "archiver", "run", "--all"); !strings.Contains(out, `"policy":"declared"`) || rdb.XLen(ctx, key).Val() != 5 {
					t.Fatalf("archiver run --all over the policy declared for %s: %s; %d entries live, want 5", key, out, rdb.XLen(ctx, key).Val())
				}
				// silt's own keys for it are in the key's slot.
				for _, k := range rdb.Keys(ctx, "emq:{"+stream.HashTag(key)+"}:*").Val() {
					if stream.HashTag(k) != stream.HashTag(key) {
						t.Fatalf("key %s is not in %s's slot", k, key)
					}
				}
			}
		})
	}
}

// TestForeign_KeyThatIsNotAStream: --key naming a key of another type is a
// clear error from every command, and nothing is written.
func TestForeign_KeyThatIsNotAStream(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	if err := rdb.Do(ctx, "ACL", "SETUSER", testserver.SiltUser, "~orders").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "orders", "a string", 0).Err(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_KEY=orders", "SILT_GROUP=g",
		"SILT_DATA_DIR=" + filepath.Join(dir, "data"), "SILT_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote")}
	before := rdb.Keys(ctx, "*").Val()
	for _, args := range [][]string{
		{"worker", "run", "--block", "100ms", "--", "true"},
		{"worker", "append", "a=1"},
		{"archiver", "run", "--keep-last", "1"},
		{"archiver", "read"},
	} {
		code, _, errOut := exitCode(t, env, "", args[0], args[1:]...)
		if code != 1 || !strings.Contains(errOut, "orders holds a string, not a stream") {
			t.Errorf("%v on a string key: exit %d, %s", args, code, errOut)
		}
	}
	if after := rdb.Keys(ctx, "*").Val(); len(after) != len(before) || rdb.Get(ctx, "orders").Val() != "a string" {
		t.Fatalf("keys before %v, after %v", before, after)
	}
}

// TestForeign_DeclaredKind: worker kind set declares the kind of a stream
// other producers write with plain XADD, whose entries then take ids of
// that kind; a stream's kind never changes.
func TestForeign_DeclaredKind(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	if err := rdb.Do(ctx, "ACL", "SETUSER", testserver.SiltUser, "~orders").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: map[string]any{"n": fmt.Sprint(i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_KEY=orders", "SILT_GROUP=g"}
	if out := silt(t, "", env, "worker", "kind", "show"); !strings.Contains(out, `"kind":"EVT"`) || !strings.Contains(out, `"recorded":false`) {
		t.Fatalf("kind show before a declaration: %s", out)
	}
	silt(t, "", env, "worker", "kind", "set", "--kind", "JOB")
	out := silt(t, "", env, "worker", "run", "--block", "100ms", "--stdout")
	if n := strings.Count(out, `"id":"JOB_`); n != 3 {
		t.Fatalf("deliveries after declaring JOB: %d JOB ids in %s", n, out)
	}
	if code, _, errOut := exitCode(t, env, "", "worker", "kind", "set", "--kind", "USR"); code != 1 || !strings.Contains(errOut, "holds JOB ids, not USR") {
		t.Fatalf("redeclaring another kind: exit %d, %s", code, errOut)
	}
	silt(t, "", env, "worker", "kind", "set", "--kind", "JOB") // the same kind again: fine
}

// nodeXAddScript appends N entries {n: i} to KEY with ioredis's plain
// XADD KEY * (a Cluster client when REDIS_URLS names several nodes) and
// prints each stream id.
const nodeXAddScript = `
const Redis = require('ioredis');
const urls = process.env.REDIS_URLS.split(',');
const r = urls.length > 1
  ? new Redis.Cluster(urls.map(u => { const x = new URL(u); return { host: x.hostname, port: Number(x.port) }; }))
  : new Redis(urls[0]);
(async () => {
  for (let i = 0; i < Number(process.env.N); i++) console.log(await r.xadd(process.env.KEY, '*', 'n', String(i)));
  r.disconnect();
})().catch(e => { console.error(e.message); process.exit(1); });
`

// nodeXAdd runs nodeXAddScript and returns the stream ids it printed.
func nodeXAdd(t *testing.T, urls, key string, n int) []string {
	t.Helper()
	nodePath := os.Getenv("SILT_NODE_PATH")
	if nodePath == "" {
		testserver.Absent(t, "the producer clients (ioredis)", `eval "$(scripts/clients.sh)"`)
	}
	cmd := exec.Command("node", "-e", nodeXAddScript)
	cmd.Env = append(os.Environ(), "NODE_PATH="+nodePath, "REDIS_URLS="+urls, "KEY="+key, "N="+fmt.Sprint(n))
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("ioredis XADD: %v %s", err, stderr)
	}
	ids := strings.Fields(string(out))
	if len(ids) != n {
		t.Fatalf("ioredis appended %d of %d entries: %s", len(ids), n, out)
	}
	return ids
}
