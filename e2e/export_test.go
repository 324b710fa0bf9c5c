package e2e

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/duckdb/duckdb-go/v2" // the SQL engine auditors use, reading the files as they would
	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/export"
	"github.com/silt-dev/silt/pkg/fence"
	fences3 "github.com/silt-dev/silt/pkg/fence/s3"
	"github.com/silt-dev/silt/pkg/stream"
)

// exportStreams are the streams of the export feed, one kind each.
var exportStreams = []struct {
	name string
	kind brand.Kind
}{{"orders", brand.EVT}, {"jobs", brand.JOB}, {"users", brand.USR}}

// exportFeedStart is the first entry's mint time: the feed spans a day and
// a half of hour partitions, as a month of history would span many more.
var exportFeedStart = time.Date(2026, 11, 27, 22, 30, 0, 0, time.UTC)

// feedExport appends n entries to each export stream, minted step apart
// from start, with a binary field now and then and one malformed entry per
// stream. It returns the next mint time.
func feedExport(t *testing.T, rdb *redis.Client, start time.Time, n int, step time.Duration) time.Time {
	t.Helper()
	ks, _ := stream.NewKeyspace("", "cm")
	var wg sync.WaitGroup
	errs := make([]error, len(exportStreams))
	for i, s := range exportStreams {
		wg.Go(func() {
			l, err := stream.NewLog(rdb, ks, s.name, s.kind)
			if err != nil {
				errs[i] = err
				return
			}
			ctx := context.Background()
			at := start
			for j := range n {
				id, _ := brand.New(s.kind, brand.StreamID{MS: uint64(at.UnixMilli()), Seq: uint64(i)})
				f := stream.Fields{"n": fmt.Sprint(j), "type": []string{"created", "paid", "shipped", "refunded"}[j%4],
					"payload": `{"amount":` + fmt.Sprint(j%997) + `,"note":"naïve café"}`}
				if j%1009 == 0 {
					f["blob"] = "\x00\xff\xfe raw"
				}
				if j == n/3 { // a producer that wrote its own id field
					errs[i] = rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.Key(), ID: id.StreamID.String(),
						Values: []string{"id", "ORD-" + fmt.Sprint(j), "n", fmt.Sprint(j)}}).Err()
				} else {
					errs[i] = l.AppendID(ctx, id, f)
				}
				if errs[i] != nil {
					return
				}
				at = at.Add(step)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return start.Add(time.Duration(n) * step)
}

// auditRow is one entry as an auditor compares it: a line of archiver read
// or a row DuckDB returns from the exported files.
type auditRow struct {
	Stream       string
	ID           string
	StreamID     string
	Fields       map[string]string
	FieldsBase64 map[string]string
	Error        string
}

func (r auditRow) String() string {
	return fmt.Sprintf("%s %s %s %v %v %q", r.Stream, r.ID, r.StreamID, r.Fields, r.FieldsBase64, r.Error)
}

// archiverRead returns what archiver read prints for each export stream
// (args select the range), streams in name order as the SQL orders them.
func archiverRead(t *testing.T, env []string, args ...string) []auditRow {
	t.Helper()
	names := make([]string, 0, len(exportStreams))
	for _, s := range exportStreams {
		names = append(names, s.name)
	}
	slices.Sort(names)
	var rows []auditRow
	for _, name := range names {
		out := silt(t, "", env, "archiver", append([]string{"read", "--stream", name}, args...)...)
		sc := bufio.NewScanner(strings.NewReader(out))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var rec struct {
				ID           string            `json:"id"`
				StreamID     string            `json:"stream_id"`
				Fields       map[string]string `json:"fields"`
				FieldsBase64 map[string]string `json:"fields_base64"`
				Error        string            `json:"error"`
			}
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				t.Fatalf("archiver read line %q: %v", sc.Text(), err)
			}
			rows = append(rows, auditRow{name, rec.ID, rec.StreamID, rec.Fields, rec.FieldsBase64, rec.Error})
		}
	}
	return rows
}

// duckRows queries the Parquet files under dir with DuckDB, Hive
// partitions on, rows in stream then stream id order.
func duckRows(t *testing.T, dir, where string) []auditRow {
	t.Helper()
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if where == "" {
		where = "true"
	}
	q := `SELECT stream, id, stream_id, CAST(to_json(fields) AS VARCHAR), CAST(to_json(fields_base64) AS VARCHAR), coalesce(error, ''), fields_json
		FROM read_parquet('` + dir + `/stream=*/*/*/*.parquet', hive_partitioning = true)
		WHERE ` + where + `
		ORDER BY stream, CAST(split_part(stream_id, '-', 1) AS UBIGINT), CAST(split_part(stream_id, '-', 2) AS UBIGINT)`
	rs, err := db.Query(q)
	if err != nil {
		t.Fatalf("duckdb: %v", err)
	}
	defer rs.Close()
	var rows []auditRow
	for rs.Next() {
		var r auditRow
		var fields, b64, fieldsJSON string
		if err := rs.Scan(&r.Stream, &r.ID, &r.StreamID, &fields, &b64, &r.Error, &fieldsJSON); err != nil {
			t.Fatal(err)
		}
		if json.Unmarshal([]byte(fields), &r.Fields) != nil || json.Unmarshal([]byte(b64), &r.FieldsBase64) != nil {
			t.Fatalf("row %s: fields %s %s", r.StreamID, fields, b64)
		}
		var again map[string]string
		if err := json.Unmarshal([]byte(fieldsJSON), &again); err != nil || fmt.Sprint(again) != fmt.Sprint(r.Fields) {
			t.Fatalf("row %s: fields_json %s does not match the map column %v", r.StreamID, fieldsJSON, r.Fields)
		}
		rows = append(rows, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// duckCount returns count(*) and count(DISTINCT (stream, stream_id)).
func duckCount(t *testing.T, dir string) (rows, distinct int) {
	t.Helper()
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.QueryRow(`SELECT count(*), count(DISTINCT (stream, stream_id)) FROM read_parquet('`+dir+
		`/stream=*/*/*/*.parquet', hive_partitioning = true)`).Scan(&rows, &distinct)
	if err != nil {
		t.Fatalf("duckdb: %v", err)
	}
	return rows, distinct
}

// sameRows fails the test at the first row where got and want differ.
func sameRows(t *testing.T, what string, got, want []auditRow) {
	t.Helper()
	for i := range min(len(got), len(want)) {
		g, w := got[i], want[i]
		if g.Stream != w.Stream || g.ID != w.ID || g.StreamID != w.StreamID || g.Error != w.Error ||
			len(g.Fields)+len(w.Fields) > 0 && fmt.Sprint(g.Fields) != fmt.Sprint(w.Fields) ||
			len(g.FieldsBase64)+len(w.FieldsBase64) > 0 && fmt.Sprint(g.FieldsBase64) != fmt.Sprint(w.FieldsBase64) {
			t.Fatalf("%s: row %d is %s; archiver read gives %s", what, i, g, w)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d rows; archiver read gives %d", what, len(got), len(want))
	}
}

// exportAll runs archiver export of every export stream to url and returns
// the rows each run reports.
func exportAll(t *testing.T, env []string, url string, args ...string) int64 {
	t.Helper()
	var total int64
	for _, s := range exportStreams {
		out := silt(t, "", env, "archiver", append([]string{"export", "--stream", s.name, "--to", url}, args...)...)
		var sum struct{ Rows, Malformed int64 }
		if err := json.Unmarshal([]byte(out), &sum); err != nil {
			t.Fatalf("export summary %q: %v", out, err)
		}
		total += sum.Rows
	}
	return total
}

// fileHashes maps every file under dir to its bytes.
func fileHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		rel, _ := filepath.Rel(dir, path)
		files[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestExport_DuckDBReadsTheMergedHistory exports 100,000 entries of three
// kinds, half archived and trimmed, to MinIO and to a local directory, and
// has DuckDB read them back as an auditor would: every row of archiver
// read, in order, field for field; a window in SQL equals archiver read
// --window; a rerun after more appends exports only what is new.
func TestExport_DuckDBReadsTheMergedHistory(t *testing.T) {
	srv := testserver.Redis(t)
	minio := testserver.S3(t, "minio")
	dir := t.TempDir()
	env := append(minio.Env(), "SILT_REDIS_URL="+srv.URL(), "SILT_QUEUE=cm", "SILT_DATA_DIR="+filepath.Join(dir, "data"),
		"SILT_ARCHIVE_REMOTE=file://"+filepath.Join(dir, "remote"))
	const perStream = 33334
	next := feedExport(t, srv.Client(t), exportFeedStart, perStream, 3*time.Second) // 28 hours of history
	silt(t, "", env, "archiver", "run", "--stream", "orders", "--stream", "jobs", "--stream", "users", "--keep-last", "16000")
	want := archiverRead(t, env)
	if len(want) != perStream*len(exportStreams) {
		t.Fatalf("archiver read returned %d entries, want %d", len(want), perStream*len(exportStreams))
	}

	local := filepath.Join(dir, "export")
	if n := exportAll(t, env, "file://"+local); n != int64(len(want)) {
		t.Fatalf("export reported %d rows, want %d", n, len(want))
	}
	sameRows(t, "DuckDB over the local export", duckRows(t, local, ""), want)

	bucket := minio.CreateBucket(t)
	s3url := minio.URL(bucket, "audit/silt")
	if n := exportAll(t, env, s3url); n != int64(len(want)) {
		t.Fatalf("export to MinIO reported %d rows, want %d", n, len(want))
	}
	// DuckDB's S3 reader is an extension it downloads, and this machine has
	// no route to it: the test copies the objects down, as an auditor's
	// sync would, and checks they are the local export byte for byte.
	copied := filepath.Join(dir, "from-minio")
	for _, k := range copyDown(t, minio, s3url, copied) {
		if !strings.HasPrefix(k, "stream=") && !strings.HasPrefix(k, "_silt/export/") {
			t.Fatalf("unexpected object %s in the export", k)
		}
	}
	localFiles, minioFiles := fileHashes(t, local), fileHashes(t, copied)
	for k, v := range localFiles {
		if strings.HasPrefix(k, "stream=") && minioFiles[k] != v {
			t.Fatalf("%s differs between the local and the MinIO export", k)
		}
	}
	sameRows(t, "DuckDB over the MinIO export", duckRows(t, copied, ""), want)

	// A window in SQL is archiver read --window.
	t0, t1 := exportFeedStart.Add(5*time.Hour+17*time.Minute), exportFeedStart.Add(7*time.Hour+3*time.Minute+500*time.Millisecond)
	window := archiverRead(t, env, "--window", t0.Format(time.RFC3339Nano)+","+t1.Format(time.RFC3339Nano))
	if len(window) < 1000 {
		t.Fatalf("window holds %d entries: the test picked an empty window", len(window))
	}
	sameRows(t, "a window in SQL", duckRows(t, local, fmt.Sprintf("epoch_ms(time) BETWEEN %d AND %d", t0.UnixMilli(), t1.UnixMilli())), window)

	// docs/usage.md's query, as written there.
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	readme := map[string]int{}
	rs, err := db.Query(`SELECT stream, count(*), min(time), max(time)
		FROM read_parquet('` + local + `/stream=*/*/*/*.parquet', hive_partitioning = true)
		WHERE date >= DATE '2026-11-01' AND fields['type'] = 'refunded'
		GROUP BY stream`)
	if err != nil {
		t.Fatalf("docs/usage.md's query: %v", err)
	}
	for rs.Next() {
		var name string
		var n int
		var lo, hi time.Time
		if err := rs.Scan(&name, &n, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		readme[name] = n
	}
	rs.Close()
	refunded := map[string]int{}
	for _, r := range want {
		if r.Fields["type"] == "refunded" {
			refunded[r.Stream]++
		}
	}
	if fmt.Sprint(readme) != fmt.Sprint(refunded) || len(refunded) != len(exportStreams) {
		t.Fatalf("docs/usage.md's query counts %v refunded; archiver read has %v", readme, refunded)
	}

	// More history: a rerun exports only it, and no old file changes.
	feedExport(t, srv.Client(t), next, 2000, 3*time.Second)
	if n := exportAll(t, env, "file://"+local); n != int64(2000*len(exportStreams)) {
		t.Fatalf("the incremental export reported %d rows, want %d", n, 2000*len(exportStreams))
	}
	after := fileHashes(t, local)
	for k, v := range localFiles {
		if strings.HasPrefix(k, "stream=") && after[k] != v {
			t.Fatalf("%s was rewritten by the incremental export", k)
		}
	}
	sameRows(t, "DuckDB after the incremental export", duckRows(t, local, ""), archiverRead(t, env))
	for _, s := range exportStreams {
		silt(t, "", env, "archiver", "export", "--stream", s.name, "--to", "file://"+local, "--verify")
	}
}

// copyDown copies every object under url to dir and returns their keys.
func copyDown(t *testing.T, s3 testserver.S3Server, url, dir string) []string {
	t.Helper()
	for _, kv := range s3.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	ctx := context.Background()
	st, err := fences3.OpenURL(ctx, url, fence.ReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for after := ""; ; {
		page, err := st.List(ctx, "", after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, page...)
		if len(page) < 1000 {
			break
		}
		after = page[len(page)-1]
	}
	for _, k := range keys {
		b, err := st.Get(ctx, k, fence.Range{})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, filepath.FromSlash(k))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestExport_KilledAtRandomPoints kills archiver export with SIGKILL at
// random moments until a run completes: DuckDB then sees every entry of the
// merged history exactly once, and the manifest chain verifies.
func TestExport_KilledAtRandomPoints(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_DATA_DIR=" + filepath.Join(dir, "data"),
		"SILT_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote")}
	feedExport(t, srv.Client(t), exportFeedStart, tier(12000, 40000), 2*time.Second)
	silt(t, "", env, "archiver", "run", "--stream", "orders", "--stream", "jobs", "--stream", "users", "--keep-last", "5000")
	want := archiverRead(t, env)
	target := filepath.Join(dir, "export")
	// How long a whole export of each stream takes on this machine now (into
	// a scratch target): the kills land inside that span. A fixed window
	// once missed every run (CI: 4 runs, none killed, each export done
	// before its kill).
	took := map[string]time.Duration{}
	for _, s := range exportStreams {
		start := time.Now()
		silt(t, "", env, "archiver", "export", "--stream", s.name, "--to", "file://"+filepath.Join(dir, "probe"), "--max-file-rows", "700")
		took[s.name] = time.Since(start)
	}
	kills, runs, resumed := 0, 0, 0
	for _, s := range exportStreams {
		for attempt := 0; ; attempt++ {
			if attempt == 60 {
				t.Fatalf("export of %s never completed in 60 runs", s.name)
			}
			cmd := exec.Command(filepath.Join(binDir, "archiver"), "export", "--stream", s.name, "--to", "file://"+target, "--max-file-rows", "700")
			cmd.Env = append(os.Environ(), env...)
			var out, errOut strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			runs++
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("export of %s: %v\n%s", s.name, err, errOut.String())
				}
				var sum struct{ Resumed int }
				json.Unmarshal([]byte(out.String()), &sum)
				resumed += sum.Resumed
			// A kill at a random point in the first 5-60% of a whole run, later with
			// each attempt: a loaded machine (a start alone can take 300 ms
			// there) still gets a run through to the end.
			case <-time.After(time.Duration(float64(took[s.name])*(0.05+0.55*rand.Float64())) + time.Duration(40*attempt)*time.Millisecond):
				cmd.Process.Signal(syscall.SIGKILL)
				if err := <-done; err == nil {
					break // it finished before the signal
				}
				kills++
				continue
			}
			break
		}
	}
	// The narrowest window, between a manifest and its file, is rarely hit
	// by a random kill: make its state by hand (the newest file gone) and
	// rerun.
	st, err := fence.OpenLocal(target)
	if err != nil {
		t.Fatal(err)
	}
	head, ok, err := export.Head(context.Background(), st, "orders")
	if err != nil || !ok {
		t.Fatalf("head of the orders export: %v %v", ok, err)
	}
	if err := os.Remove(filepath.Join(target, filepath.FromSlash(head.File))); err != nil {
		t.Fatal(err)
	}
	out := silt(t, "", env, "archiver", "export", "--stream", "orders", "--to", "file://"+target, "--max-file-rows", "700")
	var sum struct{ Resumed, Rows int }
	json.Unmarshal([]byte(out), &sum)
	if sum.Resumed != 1 || sum.Rows != int(head.Rows) {
		t.Fatalf("rerun after the newest file was lost: %s (manifest %d holds %d rows)", out, head.Seq, head.Rows)
	}
	resumed += sum.Resumed
	runs++
	t.Logf("%d runs, %d killed, %d resumed a file a killed run had announced", runs, kills, resumed)
	rows, distinct := duckCount(t, target)
	c := counts{Entries: len(want), Duplicates: rows - distinct, Lost: len(want) - distinct}
	report(t, scenario{Name: "export killed at random points, then rerun; DuckDB reads the files", Runs: runs, Faults: kills + 1, counts: c}) // the kills and the file removed by hand
	if kills == 0 {
		t.Fatal("no export run was killed: the scenario tested nothing")
	}
	sameRows(t, "DuckDB after killed exports", duckRows(t, target, ""), want)
	for _, s := range exportStreams {
		silt(t, "", env, "archiver", "export", "--stream", s.name, "--to", "file://"+target, "--verify")
	}
}

// TestExport_InsideArchiverRun: archiver run --export-to exports each
// stream's archived history after its commits, and only that (up to W).
func TestExport_InsideArchiverRun(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_DATA_DIR=" + filepath.Join(dir, "data"),
		"SILT_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote")}
	next := feedExport(t, srv.Client(t), exportFeedStart, 3000, time.Second)
	target := filepath.Join(dir, "export")
	run := func() {
		out := silt(t, "", env, "archiver", "run", "--stream", "orders", "--stream", "jobs", "--stream", "users", "--keep-last", "1000", "--export-to", "file://"+target)
		var sum struct {
			Streams []struct {
				Stream   string
				Archived int64
				W        string
				Export   *struct{ Rows int64 }
			}
		}
		if err := json.Unmarshal([]byte(out), &sum); err != nil {
			t.Fatal(err)
		}
		for _, s := range sum.Streams {
			if s.Export == nil || s.Export.Rows != s.Archived {
				t.Fatalf("archiver run --export-to: %s", out)
			}
		}
	}
	run()
	feedExport(t, srv.Client(t), next, 1500, time.Second)
	run()
	archived := archiverRead(t, env)
	// Each stream's live tail is its newest 1,000 entries: the export holds the rest.
	var want []auditRow
	for i := 0; i < len(archived); {
		j := i
		for j < len(archived) && archived[j].Stream == archived[i].Stream {
			j++
		}
		want = append(want, archived[i:j-1000]...)
		i = j
	}
	sameRows(t, "DuckDB after archiver run --export-to", duckRows(t, target, ""), want)
	// --verify of a target that holds no export says so instead of "verified".
	code, _, errOut := exitCode(t, env, "", "archiver", "export", "--stream", "orders", "--to", "file://"+t.TempDir(), "--verify")
	if code != 1 || !strings.Contains(errOut, "no export of this stream") {
		t.Fatalf("verify of an empty target: exit %d, %s", code, errOut)
	}
}
