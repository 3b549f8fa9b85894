package agent

import (
	"context"
	"log/slog"
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
