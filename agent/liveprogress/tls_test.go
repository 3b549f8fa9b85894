package liveprogress

import (
	"context"
	"crypto/tls"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

// TestTLS publishes to a Redis that listens on a TLS port only, verified
// against the test CA, and cannot reach it with a certificate from another
// CA or without TLS.
func TestTLS(t *testing.T) {
	ca := dbserver.NewTestCA(t, "tc test CA")
	cert, key := ca.ServerCert(t, "127.0.0.1", "localhost")
	srv := dbserver.StartRedis(t, dbserver.WithTLS(ca.CertFile, cert, key))

	t.Run("Verified", func(t *testing.T) {
		p := newWriter(t, srv, Options{TLS: ca.ClientConfig(), MinInterval: time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
		defer cancel()
		if err := p.Ping(ctx); err != nil {
			t.Fatalf("Ping over TLS: %v", err)
		}
		p.Update("job-tls", pullOf(1))
		c := srv.Client() // TLS with the CA
		defer c.Close()
		wait.For(t, "the job's hash over TLS", func() bool {
			n, err := c.Exists(ctx, Key("job-tls")).Result()
			return err == nil && n == 1
		})
	})
	for _, tc := range []struct {
		name string
		tls  *tls.Config
		want string
	}{
		{"OtherCA", dbserver.NewTestCA(t, "another CA").ClientConfig(), "certificate"},
		{"Plain", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(Options{Nodes: []string{srv.Addr}, Password: srv.Password, TLS: tc.tls, Timeout: 2 * time.Second},
				slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			err = p.Ping(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Ping = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
