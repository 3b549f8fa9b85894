package dbserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCA is a certificate authority made for one test: its certificate and
// the server certificates it issues are PEM files in a test directory.
type TestCA struct {
	// CertFile is the CA's certificate, the ca_file clients verify with.
	CertFile string

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// NewTestCA makes a CA whose files live in a temporary directory of tb.
func NewTestCA(tb testing.TB, name string) *TestCA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("test CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(tb), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("test CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("test CA certificate: %v", err)
	}
	ca := &TestCA{cert: cert, key: key, dir: tb.TempDir()}
	ca.CertFile = writePEM(tb, filepath.Join(ca.dir, "ca.crt"), "CERTIFICATE", der)
	return ca
}

// ServerCert issues a server certificate for hosts (names or IP addresses)
// and returns its certificate and key files.
func (ca *TestCA) ServerCert(tb testing.TB, hosts ...string) (certFile, keyFile string) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("server key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(tb), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("server certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("server key: %v", err)
	}
	base := filepath.Join(ca.dir, fmt.Sprintf("server-%s", tmpl.SerialNumber.Text(16)))
	return writePEM(tb, base+".crt", "CERTIFICATE", der), writePEM(tb, base+".key", "PRIVATE KEY", keyDER)
}

// ClientConfig returns a tls.Config that trusts only this CA.
func (ca *TestCA) ClientConfig() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

func serial(tb testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatalf("certificate serial: %v", err)
	}
	return n
}

func writePEM(tb testing.TB, path, blockType string, der []byte) string {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("write %s: %v", path, err)
	}
	return path
}

// serverTLS is a server's TLS files, given by WithTLS.
type serverTLS struct {
	caFile, certFile, keyFile string
}

// WithTLS makes the server require TLS on its TCP port with this
// certificate and key (PEM files; TestCA.ServerCert makes them), and trust
// caFile for client certificates: MariaDB with require_secure_transport,
// PostgreSQL with hostssl lines only for User (the superuser keeps a plain
// line, for the package's own administration), Redis on a TLS port only.
// The package's own connections (readiness checks, Client) use the CA.
func WithTLS(caFile, certFile, keyFile string) Option {
	return func(o *options) { o.tls = &serverTLS{caFile: caFile, certFile: certFile, keyFile: keyFile} }
}

// copyTo copies the server's files into dir (mode 0600), for a server that
// runs as another user and must own its key.
func (s *serverTLS) copyTo(dir string) (*serverTLS, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	out := &serverTLS{}
	for _, f := range []struct {
		src, name string
		dst       *string
	}{
		{s.caFile, "ca.crt", &out.caFile}, {s.certFile, "server.crt", &out.certFile}, {s.keyFile, "server.key", &out.keyFile},
	} {
		data, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		*f.dst = filepath.Join(dir, f.name)
		if err := os.WriteFile(*f.dst, data, 0o600); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// clientConfig trusts the CA the server was given, for the package's own
// connections.
func (s *serverTLS) clientConfig() (*tls.Config, error) {
	pem, err := os.ReadFile(s.caFile)
	if err != nil {
		return nil, fmt.Errorf("read test CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("test CA %s: no certificate", s.caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
