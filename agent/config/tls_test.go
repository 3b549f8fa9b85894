package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTLSParse(t *testing.T) {
	doc := `instance_db_config:
  driver: postgres
  addr: db.example:5432
  user: cube
  db_name: cube
  tls:
    enabled: true
    ca_file: /etc/cube/db-ca.pem
    server_name: db.internal
redis:
  nodes: [redis.example:6380]
  tls:
    enabled: true
    ca_file: /etc/cube/redis-ca.pem
    cert_file: /etc/cube/client.pem
    key_file: /etc/cube/client.key
`
	c, warnings, err := Parse(strings.NewReader(doc))
	if err != nil || len(warnings) != 0 {
		t.Fatalf("Parse = %v, warnings %v", err, warnings)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if want := (TLS{Enabled: true, CAFile: "/etc/cube/db-ca.pem", ServerName: "db.internal"}); c.InstanceDB.TLS != want {
		t.Errorf("instance_db_config.tls = %+v, want %+v", c.InstanceDB.TLS, want)
	}
	want := TLS{Enabled: true, CAFile: "/etc/cube/redis-ca.pem", CertFile: "/etc/cube/client.pem", KeyFile: "/etc/cube/client.key"}
	if c.Redis.TLS != want {
		t.Errorf("redis.tls = %+v, want %+v", c.Redis.TLS, want)
	}
	if ws := c.plainTransportWarnings(); len(ws) != 0 {
		t.Errorf("warnings with verified TLS: %q", ws)
	}
	next := *c
	next.Redis.TLS.CAFile = "/etc/cube/other.pem"
	if keys := c.RestartOnly(&next); len(keys) != 1 || keys[0] != "redis" {
		t.Errorf("RestartOnly after a redis.tls change = %q, want [redis]", keys)
	}
}

func TestTLSInvalidNamesKey(t *testing.T) {
	cases := []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"SettingsWithoutEnabled", func(c *Config) { c.Redis.TLS.CAFile = "/ca.pem" }, "redis.tls.enabled"},
		{"SSLModeWithTLS", func(c *Config) { c.InstanceDB.SSLMode = "prefer"; c.InstanceDB.TLS.Enabled = true },
			"instance_db_config.sslmode"},
		{"RelativeCA", func(c *Config) { c.InstanceDB.TLS = TLS{Enabled: true, CAFile: "ca.pem"} }, "instance_db_config.tls.ca_file"},
		{"CertWithoutKey", func(c *Config) { c.Redis.TLS = TLS{Enabled: true, CertFile: "/c.pem"} }, "redis.tls.cert_file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.InstanceDB = InstanceDB{Driver: DriverPostgres, Addr: "db:5432", User: "u", DBName: "d",
				ConnTimeout: 5, ReadTimeout: 5, WriteTimeout: 5, MaxIdleConns: 1, MaxOpenConns: 1, MaxConnLifeTimeSeconds: 1}
			c.Redis.Nodes = Nodes{"redis:6379"}
			tc.edit(c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestTLSClientConfig(t *testing.T) {
	if c, err := (TLS{}).ClientConfig(); c != nil || err != nil {
		t.Errorf("ClientConfig with TLS off = %v, %v; want nil, nil", c, err)
	}
	c, err := TLS{Enabled: true}.ClientConfig()
	if err != nil || c == nil || c.InsecureSkipVerify || c.RootCAs != nil {
		t.Errorf("ClientConfig with no CA = %+v, %v; want verification against the system roots", c, err)
	}
	dir := t.TempDir()
	if _, err := (TLS{Enabled: true, CAFile: filepath.Join(dir, "missing.pem")}).ClientConfig(); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ClientConfig with a missing ca_file = %v, want not exist", err)
	}
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (TLS{Enabled: true, CAFile: junk}).ClientConfig(); err == nil || !strings.Contains(err.Error(), junk) {
		t.Errorf("ClientConfig with a ca_file without PEM = %v, want an error naming it", err)
	}
}

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "LOCALHOST.": true, "db.localhost": true, "127.0.0.1": true, "127.3.2.1": true,
		"::1": true, "[::1]": true, "::ffff:127.0.0.1": true,
		"10.0.0.1": false, "db.example": false, "localhost.example": false, "0.0.0.0": false, "": false,
	} {
		if got := IsLoopback(host); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", host, got, want)
		}
	}
}

// TestPlainTransportWarnings warns when a password crosses a network
// without verified TLS, and stays quiet on loopback.
func TestPlainTransportWarnings(t *testing.T) {
	db := InstanceDB{Driver: DriverPostgres, User: "u", DBName: "d"}
	cases := []struct {
		name string
		edit func(c *Config)
		want []string
	}{
		{"Loopback", func(c *Config) {
			c.InstanceDB, c.InstanceDB.Addr = db, "127.0.0.1:5432"
			c.Redis.Nodes = Nodes{"localhost:6379"}
		}, nil},
		{"RemotePlain", func(c *Config) {
			c.InstanceDB, c.InstanceDB.Addr = db, "db.example:5432"
			c.Redis.Nodes = Nodes{"127.0.0.1:6379", "10.0.0.9:6379"}
		}, []string{"instance_db_config: db.example:5432", "redis: 10.0.0.9:6379"}},
		{"RemoteVerifyFull", func(c *Config) {
			c.InstanceDB, c.InstanceDB.Addr, c.InstanceDB.SSLMode = db, "db.example:5432", "verify-full"
		}, nil},
		{"RemoteSkipVerify", func(c *Config) {
			c.InstanceDB, c.InstanceDB.Addr = db, "db.example:5432"
			c.InstanceDB.TLS = TLS{Enabled: true, InsecureSkipVerify: true}
			c.Redis.Nodes, c.Redis.TLS = Nodes{"10.0.0.9:6379"}, TLS{Enabled: true}
		}, []string{"instance_db_config: db.example:5432"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(c)
			got := c.plainTransportWarnings()
			if len(got) != len(tc.want) {
				t.Fatalf("warnings = %q, want %d starting %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("warning %d = %q, want it to start with %q", i, got[i], w)
				}
			}
		})
	}
}
