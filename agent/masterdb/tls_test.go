package masterdb

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

// tlsServer is a database server that accepts its user over TLS only.
type tlsServer struct {
	addr, user, password, dbname string
	// sessionSSL asks the server whether this session is encrypted.
	sessionSSL string
}

// tlsDialects start a TLS-only server of each driver with a certificate
// from ca.
var tlsDialects = []struct {
	driver string
	start  func(t *testing.T, opts ...dbserver.Option) tlsServer
}{
	{DriverMySQL, func(t *testing.T, opts ...dbserver.Option) tlsServer {
		srv := dbserver.StartMariaDB(t, opts...)
		return tlsServer{srv.Addr, srv.User, srv.Password, srv.DBName,
			"SELECT VARIABLE_VALUE <> '' FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'SSL_CIPHER'"}
	}},
	{DriverPostgres, func(t *testing.T, opts ...dbserver.Option) tlsServer {
		srv := dbserver.StartPostgres(t, opts...)
		return tlsServer{srv.Addr, srv.User, srv.Password, srv.DBName,
			"SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"}
	}},
}

// openAndPing opens o and pings it, returning the first error.
func openAndPing(t *testing.T, o Options) (*DB, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Open(ctx, o)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { d.Close() })
	return d, d.Ping(ctx)
}

// TestTLSVerified connects over TLS verified against the test CA, and is
// refused by a server whose certificate another CA signed, or that does
// not speak TLS at all: no fallback to plain TCP.
func TestTLSVerified(t *testing.T) {
	for _, dc := range tlsDialects {
		t.Run(dc.driver, func(t *testing.T) {
			ca := dbserver.NewTestCA(t, "tc test CA")
			cert, key := ca.ServerCert(t, "127.0.0.1", "localhost")
			srv := dc.start(t, dbserver.WithTLS(ca.CertFile, cert, key))
			o := options(dc.driver, srv.addr, srv.user, srv.password, srv.dbname)

			t.Run("Verified", func(t *testing.T) {
				o := o
				o.TLS = ca.ClientConfig()
				d, err := openAndPing(t, o)
				if err != nil {
					t.Fatalf("open over TLS with the server's CA: %v", err)
				}
				var ssl bool
				if err := d.db.QueryRowContext(context.Background(), srv.sessionSSL).Scan(&ssl); err != nil || !ssl {
					t.Fatalf("session encrypted = %v, %v; want true", ssl, err)
				}
			})
			t.Run("ServerNameFromAddr", func(t *testing.T) {
				// localhost is in the certificate, 127.0.0.1 is not
				// what is checked: the name follows the address.
				o := o
				o.Addr = strings.Replace(o.Addr, "127.0.0.1", "localhost", 1)
				o.TLS = ca.ClientConfig()
				if _, err := openAndPing(t, o); err != nil {
					t.Fatalf("open over TLS by name: %v", err)
				}
			})
			t.Run("WrongName", func(t *testing.T) {
				o := o
				o.TLS = ca.ClientConfig()
				o.TLS.ServerName = "db.elsewhere.example"
				if _, err := openAndPing(t, o); err == nil {
					t.Fatal("open with a server name not in the certificate succeeded")
				}
			})
			t.Run("OtherCA", func(t *testing.T) {
				o := o
				o.TLS = dbserver.NewTestCA(t, "another CA").ClientConfig()
				_, err := openAndPing(t, o)
				if err == nil || !strings.Contains(err.Error(), "certificate") {
					t.Fatalf("open with another CA = %v, want a certificate error", err)
				}
			})
			t.Run("PlainRefused", func(t *testing.T) {
				// The server really requires TLS, so Verified proves
				// something.
				o := o
				o.SSLMode = ""
				if dc.driver == DriverPostgres {
					o.SSLMode = "disable"
				}
				if _, err := openAndPing(t, o); err == nil {
					t.Fatal("open without TLS succeeded on a TLS-only server")
				}
			})
		})
	}
}

// TestTLSNoPlainFallback refuses a server without TLS when TLS is asked
// for, where PostgreSQL's default sslmode would have fallen back to plain
// text.
func TestTLSNoPlainFallback(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, _, _ := dl.open(t)
			o.SSLMode = ""
			o.TLS = &tls.Config{InsecureSkipVerify: true} // even unverified TLS is TLS
			if _, err := openAndPing(t, o); err == nil {
				t.Fatal("open with TLS required succeeded on a server without TLS")
			}
		})
	}
}
