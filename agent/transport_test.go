package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

// TestTLSSettingsReachConnections: instance_db_config.tls and redis.tls,
// with a ca_file, make the database pool and the Redis publisher verify
// the server against that CA, and fail against another.
func TestTLSSettingsReachConnections(t *testing.T) {
	ca := dbserver.NewTestCA(t, "tc test CA")
	cert, key := ca.ServerCert(t, "127.0.0.1")
	other := dbserver.NewTestCA(t, "another CA")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("Database", func(t *testing.T) {
		srv := dbserver.StartMariaDB(t, dbserver.WithTLS(ca.CertFile, cert, key))
		for _, tc := range []struct {
			name, caFile string
			ok           bool
		}{{"OwnCA", ca.CertFile, true}, {"OtherCA", other.CertFile, false}} {
			t.Run(tc.name, func(t *testing.T) {
				cfg := config.Default()
				cfg.InstanceDB = config.InstanceDB{Driver: config.DriverMySQL, Addr: srv.Addr, User: srv.User,
					Pwd: config.Secret(srv.Password), DBName: srv.DBName, ConnTimeout: 2, ReadTimeout: 2, WriteTimeout: 2,
					MaxIdleConns: 1, MaxOpenConns: 2, MaxConnLifeTimeSeconds: 60,
					TLS: config.TLS{Enabled: true, CAFile: tc.caFile}}
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				db, err := OpenDatabase(ctx, cfg)
				if err == nil {
					defer db.Close()
					err = db.Ping(ctx)
				}
				if (err == nil) != tc.ok {
					t.Fatalf("OpenDatabase and Ping with ca_file %s = %v, want success %v", tc.name, err, tc.ok)
				}
			})
		}
	})
	t.Run("Redis", func(t *testing.T) {
		srv := dbserver.StartRedis(t, dbserver.WithTLS(ca.CertFile, cert, key))
		for _, tc := range []struct {
			name, caFile string
			ok           bool
		}{{"OwnCA", ca.CertFile, true}, {"OtherCA", other.CertFile, false}} {
			t.Run(tc.name, func(t *testing.T) {
				cfg := config.Default()
				cfg.Redis = config.Redis{Nodes: config.Nodes{srv.Addr}, Password: config.Secret(srv.Password),
					TLS: config.TLS{Enabled: true, CAFile: tc.caFile}}
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				pub, err := OpenLiveProgress(cfg, slog.New(slog.DiscardHandler))
				if err != nil {
					t.Fatal(err)
				}
				defer pub.Close(ctx)
				if err := pub.Ping(ctx); (err == nil) != tc.ok {
					t.Fatalf("Ping with ca_file %s = %v, want success %v", tc.name, err, tc.ok)
				}
			})
		}
	})
}

// TestPlainHTTPTokenWarning: the reporter warns once when a reload moves
// CubeMaster to a plain-http address off loopback while a token is set,
// naming the host and never the token; a loopback address is quiet.
func TestPlainHTTPTokenWarning(t *testing.T) {
	const warning = "shared token goes to CubeMaster over plain http"
	h := newHarness(t, nil)
	path := filepath.Join(h.dir, "conf.yaml")
	h.env[config.PathEnv] = path
	h.env["CUBE_TEMPLATE_CALLBACK_TOKEN"] = testToken
	conf := func(addr string) {
		doc := "store:\n  dir: " + h.cfg.Store.Dir + "\n  work_dir: " + h.cfg.Store.WorkDir +
			"\nspool:\n  path: " + h.cfg.Spool.Path + "\nmaster:\n  addr: " + addr + "\n"
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf(h.master.URL())
	h.start()
	if strings.Contains(h.logs.String(), warning) {
		t.Fatalf("warning for the loopback address %s:\n%s", h.master.URL(), h.logs)
	}
	conf("http://cubemaster.example:8089")
	for range 2 {
		if err := h.agent.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	logs := h.logs.String()
	if n := strings.Count(logs, warning); n != 1 {
		t.Fatalf("%d warnings after two reloads to a plain-http remote address, want 1:\n%s", n, logs)
	}
	if line, _ := findLogLine(logs, warning); !strings.Contains(line, "host=cubemaster.example") {
		t.Errorf("warning does not name the host: %s", line)
	}
	if strings.Contains(logs, testToken) {
		t.Errorf("the log holds the token:\n%s", logs)
	}
	conf("https://cubemaster.example:8089")
	if err := h.agent.Reload(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(h.logs.String(), warning); n != 1 {
		t.Errorf("%d warnings after moving to https, want still 1", n)
	}
}

// TestPlainHTTPTokenWarningAtStart: an agent started with a plain-http
// CubeMaster off loopback and a token warns as it starts.
func TestPlainHTTPTokenWarningAtStart(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Master.Addr, c.Master.Token = "http://192.0.2.7:8089", testToken
	})
	h.start()
	waitFor(t, "the plain-http warning", func() bool {
		line, ok := findLogLine(h.logs.String(), "shared token goes to CubeMaster over plain http")
		return ok && strings.Contains(line, "host=192.0.2.7")
	})
}
