package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// TLS is a client's transport security towards a server
// (instance_db_config.tls, redis.tls). Off by default, so a server on
// loopback needs nothing; on, the server's certificate is verified (chain
// and name) unless InsecureSkipVerify says otherwise.
type TLS struct {
	// Enabled requires TLS: there is no fallback to plain TCP.
	Enabled bool `yaml:"enabled"`
	// CAFile holds the PEM certificates the server's chain must end in;
	// empty means the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are an optional client certificate (PEM).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the certificate must hold; empty means the
	// host of the address connected to.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any certificate: encryption without
	// authentication, for tests and emergencies only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// validate returns the TLS settings' problems, each naming its key under
// prefix (e.g. "redis.tls").
func (t TLS) validate(prefix string) []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", prefix, key, fmt.Sprintf(format, args...)))
	}
	if !t.Enabled {
		if t != (TLS{}) {
			bad("enabled", "false, but other %s settings are set: set enabled: true to use them", prefix)
		}
		return errs
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		bad("cert_file", "a client certificate needs both cert_file and key_file")
	}
	for key, path := range map[string]string{"ca_file": t.CAFile, "cert_file": t.CertFile, "key_file": t.KeyFile} {
		if path != "" && !strings.HasPrefix(path, "/") {
			bad(key, "%q is not an absolute path", path)
		}
	}
	return errs
}

// ClientConfig returns the tls.Config to dial with, or nil when TLS is off.
// It reads the CA and client certificate files, so it runs when a
// connection pool is opened. ServerName stays empty unless configured: the
// dialers fill in the host of each address.
func (t TLS) ClientConfig() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca_file %s: no PEM certificate in it", t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load tls.cert_file and tls.key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// IsLoopback reports whether host (a name or an address, as in host:port)
// is this machine: localhost or a loopback address. Traffic to it never
// crosses a network, so it needs no TLS.
func IsLoopback(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	addr, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && addr.Unmap().IsLoopback()
}

// plainTransportWarnings names the servers a password travels to in clear
// (or without verifying who receives it) across a network: the database
// and Redis, when not on loopback and without verified TLS.
func (c *Config) plainTransportWarnings() []string {
	var warnings []string
	remote := func(addr string) bool {
		host, _, err := net.SplitHostPort(addr)
		return err == nil && !IsLoopback(host)
	}
	if d := c.InstanceDB; d.Enabled() && remote(d.Addr) && !d.verified() {
		warnings = append(warnings, fmt.Sprintf("instance_db_config: %s is not on loopback and its TLS is not verified "+
			"(sslmode %q): set instance_db_config.tls.enabled: true", d.Addr, d.SSLMode))
	}
	if r := c.Redis; r.Enabled() && (!r.TLS.Enabled || r.TLS.InsecureSkipVerify) {
		for _, node := range r.Nodes {
			if remote(node) {
				warnings = append(warnings, fmt.Sprintf("redis: %s is not on loopback and is reached without verified TLS: "+
					"set redis.tls.enabled: true", node))
				break
			}
		}
	}
	return warnings
}
