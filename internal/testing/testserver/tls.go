package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a test certificate authority and a server
// certificate it signed.
type TLSFiles struct {
	CA, Cert, Key string
}

// NewTLS writes a fresh CA and a server certificate for names (DNS names or
// IP addresses) into a temp dir.
func NewTLS(tb testing.TB, names ...string) TLSFiles {
	tb.Helper()
	dir := tb.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "silt test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			srvTmpl.IPAddresses = append(srvTmpl.IPAddresses, ip)
		} else {
			srvTmpl.DNSNames = append(srvTmpl.DNSNames, n)
		}
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	f := TLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server.key")}
	writePEM(tb, f.CA, "CERTIFICATE", caDER)
	writePEM(tb, f.Cert, "CERTIFICATE", srvDER)
	writePEM(tb, f.Key, "EC PRIVATE KEY", keyDER)
	return f
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// RedisTLS starts a redis-server that speaks only TLS, with the certificate
// in f, and returns it (Addr is the TLS port).
func RedisTLS(tb testing.TB, f TLSFiles) *RedisServer {
	tb.Helper()
	bin := redisBinary(tb)
	port, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	s := &RedisServer{Dir: tb.TempDir(), Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Password: newPassword()}
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(f.CA)
	pool.AppendCertsFromPEM(ca)
	s.tls = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	s.Args = []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--tls-cert-file", f.Cert, "--tls-key-file", f.Key, "--tls-ca-cert-file", f.CA, "--tls-auth-clients", "no",
		"--dir", s.Dir, "--logfile", filepath.Join(s.Dir, "redis.log")}
	s.Args = append(s.Args, userArgs(s.Password)...)
	if err := s.startArgs(bin); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}
