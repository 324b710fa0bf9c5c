package testserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// MinIOServer is a MinIO process owned by one test (for tests that stop and
// restart the store; others share the one scripts/servers.sh starts).
type MinIOServer struct {
	S3Server
	Dir    string
	port   int
	cmd    *exec.Cmd
	bin    string
	certs  string       // --certs-dir of a TLS server
	client *http.Client // for the readiness probe
}

// MinIO starts a private MinIO on a free port with its data in a temp dir.
// The binary comes from SILT_MINIO_BIN, PATH, or $(go env GOPATH)/bin.
func MinIO(tb testing.TB) *MinIOServer { return startMinIO(tb, nil) }

// MinIOTLS starts a private MinIO that speaks only HTTPS, with f's server
// certificate; its Endpoint is https://.
func MinIOTLS(tb testing.TB, f TLSFiles) *MinIOServer { return startMinIO(tb, &f) }

func startMinIO(tb testing.TB, f *TLSFiles) *MinIOServer {
	tb.Helper()
	bin := os.Getenv("SILT_MINIO_BIN")
	if bin == "" {
		bin, _ = exec.LookPath("minio")
	}
	if bin == "" {
		if gp, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			if p := filepath.Join(string(trimNL(gp)), "bin", "minio"); fileExists(p) {
				bin = p
			}
		}
	}
	if bin == "" {
		Absent(tb, "minio", "scripts/servers.sh install minio")
	}
	port, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	s := &MinIOServer{Dir: tb.TempDir(), port: port, bin: bin, client: http.DefaultClient}
	s.Name, s.Endpoint = "minio", "http://127.0.0.1:"+strconv.Itoa(port)
	if f != nil {
		s.certs = tb.TempDir()
		copyFile(tb, f.Cert, filepath.Join(s.certs, "public.crt"))
		copyFile(tb, f.Key, filepath.Join(s.certs, "private.key"))
		pool := x509.NewCertPool()
		ca, _ := os.ReadFile(f.CA)
		pool.AppendCertsFromPEM(ca)
		s.HTTPClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		// The readiness probe only asks whether the server is up; what the
		// certificate is worth is for the test to find out.
		s.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		s.Endpoint = "https://127.0.0.1:" + strconv.Itoa(port)
	}
	s.AccessKey, s.SecretKey = "silttest", Canary(fmt.Sprintf("canary-secret-%d", Unique()))
	s.Start(tb)
	tb.Cleanup(s.Stop)
	return s
}

// Start starts (or restarts) the server and waits until it is ready.
func (s *MinIOServer) Start(tb testing.TB) {
	tb.Helper()
	console, _ := FreePort()
	args := []string{"server", "--quiet", "--address", "127.0.0.1:" + strconv.Itoa(s.port),
		"--console-address", "127.0.0.1:" + strconv.Itoa(console)}
	if s.certs != "" {
		args = append(args, "--certs-dir", s.certs)
	}
	s.cmd = exec.Command(s.bin, append(args, s.Dir)...)
	s.cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+s.AccessKey, "MINIO_ROOT_PASSWORD="+s.SecretKey, "MINIO_BROWSER=off")
	s.cmd.SysProcAttr = childAttr()
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("start minio: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		resp, err := s.client.Get(s.Endpoint + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("minio on %s not ready: %v", s.Endpoint, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop kills the server; it is safe to call twice.
func (s *MinIOServer) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

func copyFile(tb testing.TB, from, to string) {
	b, err := os.ReadFile(from)
	if err == nil {
		err = os.WriteFile(to, b, 0o600)
	}
	if err != nil {
		tb.Fatal(err)
	}
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
