package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"

	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// TestSecurity_MinIOOverHTTPS: the archiver talks HTTPS to a MinIO with a
// test CA (AWS_CA_BUNDLE); an unknown CA, a certificate for another name and
// an https:// endpoint that answers plain HTTP are refused, and nothing is
// trimmed by a refused run.
func TestSecurity_MinIOOverHTTPS(t *testing.T) {
	f := testserver.NewTLS(t, "127.0.0.1", "localhost")
	minio := testserver.MinIOTLS(t, f)
	bucket := minio.CreateBucket(t)
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := append(archiverEnv(srv, filepath.Join(dir, "data"), minio.URL(bucket, "silt")), minio.Env()...)
	ids := feed(t, env, 200)
	run := []string{"run", "--stream", "events", "--keep-last", "20"}

	var d detector
	other := testserver.NewTLS(t, "127.0.0.1")
	code, _, errOut := exitCode(t, append(env, "AWS_CA_BUNDLE="+other.CA), "", "archiver", run...)
	d.fault(t, code == 1 && strings.Contains(errOut, "certificate"), "unknown CA: exit %d, %s", code, errOut)
	mismatch := testserver.NewTLS(t, "db.example.org")
	wrongName := testserver.MinIOTLS(t, mismatch)
	wrongEnv := append(archiverEnv(srv, filepath.Join(dir, "data2"), wrongName.URL(bucket, "silt")), minio.Env()...)
	code, _, errOut = exitCode(t, append(wrongEnv, "AWS_CA_BUNDLE="+mismatch.CA), "", "archiver", run...)
	d.fault(t, code == 1 && strings.Contains(errOut, "certificate"), "name mismatch: exit %d, %s", code, errOut)
	plain := testserver.S3(t, "minio")
	plainEnv := append(archiverEnv(srv, filepath.Join(dir, "data3"),
		strings.Replace(plain.URL(bucket, "silt"), "http://", "https://", 1)), plain.Env()...)
	code, _, errOut = exitCode(t, append(plainEnv, "AWS_CA_BUNDLE="+f.CA), "", "archiver", run...)
	d.fault(t, code == 1 && strings.Contains(errOut, "HTTP response to HTTPS client"), "https:// to a plain-HTTP server: exit %d, %s", code, errOut)
	if n := srv.Client(t).XLen(t.Context(), streamKey).Val(); n != 200 {
		t.Fatalf("refused runs trimmed: %d entries live", n)
	}
	tlsEnv := append(env, "AWS_CA_BUNDLE="+f.CA)
	silt(t, "", tlsEnv, "archiver", run...)
	c := checkHistory(t, tlsEnv, ids)
	report(t, scenario{Name: "HTTPS to MinIO; wrong CA, wrong name, plain text refused", Runs: 5, Faults: d.injected, Detected: d.detected, Promised: true, counts: c})
}

// TestSecurity_CanariesNeverShow pushes canary secrets (a Redis password,
// S3 keys, a webhook secret) through the failure paths: unreachable host,
// wrong password, TLS failure, 403, a crashing handler, a failing webhook.
// The canaries must not appear in stdout, stderr, logs (debug level
// included) or summaries. (TestMain also checks every secret against
// everything every binary printed in the whole run.)
func TestSecurity_CanariesNeverShow(t *testing.T) {
	pw := testserver.Canary("canary-redis-pw-91f2")
	ak, sk := testserver.Canary("CANARYAKIA7F3B"), testserver.Canary("canary-s3-secret-5d0c")
	hook := testserver.Canary("canary-webhook-secret-77aa")
	srv := testserver.Redis(t)
	f := testserver.NewTLS(t, "127.0.0.1")
	tlsSrv := testserver.RedisTLS(t, f)
	minio := testserver.S3(t, "minio")
	bucket := minio.CreateBucket(t)
	dir := t.TempDir()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) }))
	defer failing.Close()

	base := []string{"SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g", "SILT_REDIS_WAIT=300ms", "SILT_LOG_LEVEL=debug",
		"SILT_DATA_DIR=" + filepath.Join(dir, "data"), "SILT_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote")}
	// Generated passwords hold '/', '?', '%', '#' and spaces; unescaped, the
	// URL does not parse, and the parser quotes the piece it choked on.
	left, right := testserver.Canary("canary-left-3e1"), testserver.Canary("canary-right-8c4")
	redisURLs := map[string]string{
		"unescaped '/' in the password": "redis://silt:" + left + "/" + right + "@127.0.0.1:1/0",
		"unescaped '?' in the password": "redis://silt:" + left + "?" + right + "@127.0.0.1:1/0",
		"unescaped '%' in the password": "redis://silt:" + left + "%zz" + right + "@127.0.0.1:1/0",
		"a space in the password":       "redis://silt:" + left + " " + right + "@127.0.0.1:1/0",
		"unreachable host":              "redis://silt:" + pw + "@127.0.0.1:1/0",
		"wrong password":                "redis://silt:" + pw + "@" + srv.Addr + "/0",
		"TLS, unknown CA":               "rediss://silt:" + pw + "@" + tlsSrv.Addr + "/0",
		"plain to TLS":                  "redis://silt:" + pw + "@" + tlsSrv.Addr + "/0",
	}
	runs := 0
	check := func(what string, wantFail bool, env []string, stdin, bin string, args ...string) (code int, out, errOut string) {
		t.Helper()
		code, out, errOut = exitCode(t, env, stdin, bin, args...)
		runs++
		if wantFail && code == 0 {
			t.Errorf("%s: %s %v succeeded", what, bin, args)
		}
		for _, secret := range []string{pw, ak, sk, hook, srv.Password, tlsSrv.Password, left, right} {
			if strings.Contains(out+errOut, secret) {
				t.Errorf("%s: %s %v printed a secret:\n%s%s", what, bin, args, out, errOut)
			}
		}
		if strings.Contains(out+errOut, "panic:") || strings.Contains(out+errOut, "goroutine ") {
			t.Errorf("%s: %s %v panicked:\n%s", what, bin, args, errOut)
		}
		return code, out, errOut
	}
	for what, u := range redisURLs {
		env := append(base, "SILT_REDIS_URL="+u)
		check(what, true, env, "", "worker", "append", "a=1")
		check(what, true, env, `{"a":"1"}`+"\n", "worker", "append")
		check(what, true, env, "", "worker", "run", "--block", "100ms", "--", "true")
		check(what, true, env, "", "worker", "status")
		check(what, true, env, "", "archiver", "run", "--keep-last", "1")
		check(what, true, env, "", "archiver", "read")
		check(what, true, env, "", "archiver", "status")
	}
	good := append(base, "SILT_REDIS_URL="+srv.URL())
	feed(t, good, 20)
	check("crashing handler", false, good, "", "worker", "run", "--consumer", "c1", "--block", "100ms", "--max-attempts", "1",
		"--", "sh", "-c", "kill -SEGV $$")
	check("failing webhook", false, good, "", "worker", "run", "--consumer", "c2", "--block", "100ms", "--min-idle", "1ms",
		"--webhook", failing.URL, "--webhook-secret", hook, "--webhook-retries", "1")
	check("unreachable webhook", false, good, "", "worker", "run", "--consumer", "c3", "--block", "100ms", "--min-idle", "1ms",
		"--webhook", "http://127.0.0.1:1/hook", "--webhook-secret", hook, "--webhook-retries", "1")
	s3env := func(endpoint string) []string {
		return append(good, "SILT_ARCHIVE_REMOTE=s3://"+bucket+"/silt?endpoint="+endpoint+"&region=us-east-1&path-style=true&timeout=2s",
			"AWS_ACCESS_KEY_ID="+ak, "AWS_SECRET_ACCESS_KEY="+sk)
	}
	check("S3 endpoint with userinfo", true, s3env("http://"+ak+":"+sk+"@127.0.0.1:1"), "", "archiver", "run", "--keep-last", "1")
	check("S3 endpoint with userinfo", true, s3env("http://"+ak+":"+left+"/"+right+"@127.0.0.1:1"), "", "archiver", "read")
	// An exec handler that dumps its environment and the secrets it can
	// find on stderr: it gets a clean environment, and its stderr is masked.
	leaky := append(slices.Clone(good), "AWS_ACCESS_KEY_ID="+ak, "AWS_SECRET_ACCESS_KEY="+sk, "SILT_WEBHOOK_SECRET="+hook)
	leakyGroup := append(slices.Clone(leaky), "SILT_GROUP=leaky")
	feed(t, leaky, 2)
	for i, tc := range []struct {
		what string
		env  []string
		sh   string
	}{
		{"exec handler printing its environment", leakyGroup, `env >&2; echo "secret: $AWS_SECRET_ACCESS_KEY $SILT_WEBHOOK_SECRET $SILT_REDIS_URL" >&2; exit 3`},
		{"exec handler given a secret and printing it", append(slices.Clone(leaky), "SILT_GROUP=leaky2", "SILT_HANDLER_ENV=AWS_SECRET_ACCESS_KEY"),
			`echo "secret: $AWS_SECRET_ACCESS_KEY" >&2; exit 3`},
	} {
		code, out, errOut := check(tc.what, false, tc.env, "", "worker", "run", "--consumer", fmt.Sprint("leak", i), "--block", "100ms",
			"--min-idle", "1ms", "--", "sh", "-c", tc.sh)
		if code != 0 || !strings.Contains(out, `"failed":`) || !strings.Contains(errOut, "handler stderr") {
			t.Fatalf("%s: exit %d, the handler did not run: %s %s", tc.what, code, out, errOut)
		}
	}
	check("S3 403", true, s3env(minio.Endpoint), "", "archiver", "run", "--keep-last", "1")
	check("S3 403", true, s3env(minio.Endpoint), "", "archiver", "read")
	check("S3 unreachable", true, s3env("http://127.0.0.1:1"), "", "archiver", "run", "--keep-last", "1")
	check("S3 TLS failure", true, s3env(strings.Replace(minio.Endpoint, "http://", "https://", 1)), "", "archiver", "run", "--keep-last", "1")
	check("S3 keys, good store", false, append(good, "SILT_ARCHIVE_REMOTE=s3://"+bucket+"/silt2?endpoint="+minio.Endpoint+
		"&region=us-east-1&path-style=true", "AWS_ACCESS_KEY_ID="+minio.AccessKey, "AWS_SECRET_ACCESS_KEY="+minio.SecretKey), "",
		"archiver", "run", "--keep-last", "1")
	t.Logf("history canaries: %d runs through failure paths, 0 showed a secret", runs)
	report(t, scenario{Name: "canary secrets through failure paths", Runs: runs, Faults: runs})

}

// TestWorker_RandomKillsOverTLS is the worker kill scenario against a
// redis-server that speaks only TLS (rediss://, the test CA).
func TestWorker_RandomKillsOverTLS(t *testing.T) {
	f := testserver.NewTLS(t, "127.0.0.1")
	t.Setenv("SILT_REDIS_CA", f.CA)
	entries, kills := tier(5000, 50000), tier(10, 50)
	if testing.Short() {
		entries, kills = 1000, 4
	}
	randomKills(t, testserver.RedisTLS(t, f), entries, kills)
}

// TestArchiver_KillAtEachStepOverTLS is the archiver kill scenario over TLS.
func TestArchiver_KillAtEachStepOverTLS(t *testing.T) {
	f := testserver.NewTLS(t, "127.0.0.1")
	t.Setenv("SILT_REDIS_CA", f.CA)
	killAtEachStep(t, testserver.RedisTLS(t, f))
}

// TestRelease_FailpointsCompiledOut: a binary built as the README and the
// Dockerfile build it ignores SILT_FAILPOINT, so nothing in the environment
// can make a shipped worker kill itself; the test build (silt_failpoints)
// does die there, which shows the variable is the one the crash tests use.
func TestRelease_FailpointsCompiledOut(t *testing.T) {
	release := filepath.Join(t.TempDir(), "worker")
	build := exec.Command("go", "build", "-o", release, "../cmd/worker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g", "SILT_FAILPOINT=after-read:1"}
	silt(t, strings.Repeat(`{"k":"v"}`+"\n", 5), env, "worker", "append")
	if _, errOut, err := runBin(filepath.Join(binDir, "worker"), env, "run", "--block", "100ms", "--stdout"); err == nil {
		t.Fatalf("the test build ran past SILT_FAILPOINT=after-read:1\n%s", errOut)
	}
	out, errOut, err := runBin(release, env, "run", "--block", "100ms", "--stdout")
	if err != nil || strings.Count(out, "\n") != 5 || strings.Contains(errOut, "failpoint") {
		t.Fatalf("the release build under SILT_FAILPOINT: %v\n%s\n%s", err, out, errOut)
	}
}
