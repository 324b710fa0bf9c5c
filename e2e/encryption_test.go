package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/fence"
	fences3 "github.com/silt-dev/silt/pkg/fence/s3"
)

// TestEncryption_AtRest archives with a key to MinIO and to a local
// directory: no object holds a plaintext byte of the payloads or a commit
// (every one starts with the encrypted header), reads with the key return
// the whole history, and a read without the key or with another one fails
// naming the cause.
func TestEncryption_AtRest(t *testing.T) {
	minio := testserver.S3(t, "minio")
	bucket := minio.CreateBucket(t)
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5a}, 32))
	other := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x33}, 32))
	for _, remote := range []string{"s3", "file"} {
		t.Run(remote, func(t *testing.T) {
			srv := testserver.Redis(t)
			dir := t.TempDir()
			url := "file://" + filepath.Join(dir, "remote")
			if remote == "s3" {
				url = minio.URL(bucket, fmt.Sprint("enc", testserver.Unique()))
			}
			env := append(append(archiverEnv(srv, filepath.Join(dir, "data"), url), minio.Env()...), "SILT_ENCRYPTION_KEY="+key)
			var in strings.Builder
			for i := range 300 {
				fmt.Fprintf(&in, `{"note":"PLAINTEXT-MARK-%d"}`+"\n", i)
			}
			silt(t, in.String(), env, "worker", "append")
			// The local data directory stays plain text, and the run says so.
			if code, _, errOut := exitCode(t, env, "", "archiver", "run", "--stream", "events", "--keep-last", "50", "--slice-entries", "100"); code != 0 ||
				!strings.Contains(errOut, "plain text") || !strings.Contains(errOut, filepath.Join(dir, "data")) {
				t.Fatalf("archiver run with a key: exit %d, and it does not say the data directory is plain text: %s", code, errOut)
			}
			objects := rawObjects(t, remote, url, minio, dir)
			if len(objects) < 4 {
				t.Fatalf("%d objects on the remote", len(objects))
			}
			for name, b := range objects {
				if bytes.Contains(b, []byte("PLAINTEXT-MARK")) || bytes.Contains(b, []byte(`"segment"`)) || !bytes.HasPrefix(b, []byte("SLTE")) {
					t.Fatalf("object %s is not wholly encrypted: %q...", name, b[:min(len(b), 40)])
				}
			}
			lines := strings.Split(strings.TrimSpace(silt(t, "", env, "archiver", "read")), "\n")
			if len(lines) != 300 || !strings.Contains(lines[0], "PLAINTEXT-MARK-0") || !strings.Contains(lines[0], `"source":"archive"`) {
				t.Fatalf("read with the key: %d lines, first %s", len(lines), lines[0])
			}
			noKey := slices.Clone(env[:len(env)-1])
			var d detector
			for _, tc := range []struct {
				env  []string
				want string
			}{{noKey, "is encrypted"}, {append(slices.Clone(noKey), "SILT_ENCRYPTION_KEY="+other), "written with key"}} {
				code, _, errOut := exitCode(t, append(slices.Clone(tc.env), "SILT_ARCHIVE_CACHE="+t.TempDir(), "SILT_DATA_DIR="+t.TempDir()), "", "archiver", "read")
				d.fault(t, code == 1 && strings.Contains(errOut, tc.want), "read %s: exit %d, %s", tc.want, code, errOut)
			}
			report(t, scenario{Name: "encryption at rest, " + remote + " (raw objects checked)", Runs: 5, Faults: d.injected, Detected: d.detected,
				Promised: true, counts: counts{Entries: 300}})
		})
	}
}

// rawObjects returns every object of the remote as stored, read without a key.
func rawObjects(t *testing.T, kind, url string, minio testserver.S3Server, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	if kind == "file" {
		filepath.WalkDir(filepath.Join(dir, "remote"), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				out[p], _ = os.ReadFile(p)
			}
			return nil
		})
		return out
	}
	for _, kv := range minio.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	st, err := fences3.OpenURL(context.Background(), url, fence.ReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := st.List(context.Background(), "", "", 10000)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if out[k], err = st.Get(context.Background(), k, fence.Range{}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
