package dbserver

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
)

// PostgresBinDir is where Debian's postgresql-15 keeps initdb and postgres;
// it is not on PATH.
const PostgresBinDir = "/usr/lib/postgresql/15/bin"

// postgresSystemUser runs the server when the tests run as root: postgres
// refuses root, and Debian's package creates this account.
const postgresSystemUser = "postgres"

// postgresTuning makes a throwaway server quick and small.
var postgresTuning = [][2]string{
	{"fsync", "off"}, {"synchronous_commit", "off"}, {"full_page_writes", "off"},
	{"shared_buffers", "32MB"}, {"max_connections", "50"},
}

// Postgres is a running (or stopped) PostgreSQL server.
type Postgres struct {
	// Addr is "127.0.0.1:PORT", fixed for the server's life.
	Addr string
	// User and Password log in over TCP (scram-sha-256); User owns DBName and
	// the databases NewDatabase creates.
	User, Password string
	// DBName is the database created at start.
	DBName string
	// Dir holds the data directory (data/) and the socket directory (run/);
	// Close removes it.
	Dir string

	postgres      string
	superPassword string
	args          []string
	as            *serverUser
	dbs           atomic.Int64
	running
}

// NewPostgres runs initdb into a new temporary directory, starts postgres on
// a free loopback port and creates DBName and User. As root, both run as the
// postgres system user, which owns the directory. Close stops the server and
// removes the directory.
func NewPostgres(ctx context.Context, opts ...Option) (*Postgres, error) {
	o := makeOptions(opts)
	dirs := []string{PostgresBinDir}
	postgres, err := findBinary([]string{"postgres"}, dirs)
	if err != nil {
		return nil, err
	}
	initdb, err := findBinary([]string{"initdb"}, dirs)
	if err != nil {
		return nil, err
	}
	as, err := dropTo(postgresSystemUser)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tc-postgres-")
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pg := &Postgres{User: "tc", Password: randomHex(12), DBName: "tc", Dir: dir,
		postgres: postgres, superPassword: randomHex(12), as: as,
		// A fast shutdown: SIGTERM would wait for every client to disconnect.
		running: running{stopSig: syscall.SIGINT, dir: dir}}
	if err := pg.initialize(ctx, initdb, o); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return pg, nil
}

func (pg *Postgres) initialize(ctx context.Context, initdb string, o options) error {
	pwfile := filepath.Join(pg.Dir, "superuser-password")
	if err := os.WriteFile(pwfile, []byte(pg.superPassword+"\n"), 0o600); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if err := os.Mkdir(filepath.Join(pg.Dir, "run"), 0o700); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	var serverTLS *serverTLS
	if o.tls != nil {
		// postgres runs as its own user and refuses a key others can read.
		var err error
		if serverTLS, err = o.tls.copyTo(filepath.Join(pg.Dir, "tls")); err != nil {
			return fmt.Errorf("postgres: copy TLS files: %w", err)
		}
	}
	if err := pg.as.chownAll(pg.Dir); err != nil {
		return fmt.Errorf("postgres: hand the directory to %s: %w", postgresSystemUser, err)
	}
	data := filepath.Join(pg.Dir, "data")
	cmd := exec.CommandContext(ctx, initdb, "-D", data, "-U", "tcadmin", "--pwfile="+pwfile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
		"--no-sync", "--no-instructions")
	cmd.Dir, cmd.Env = pg.Dir, cleanEnv(pg.Dir)
	pg.as.apply(cmd)
	if err := run(cmd); err != nil {
		return fmt.Errorf("initialize postgres data directory: %w", err)
	}
	os.Remove(pwfile)
	pg.args = []string{"-D", data, "-k", filepath.Join(pg.Dir, "run")}
	if t := serverTLS; t != nil {
		if err := pg.requireTLS(data); err != nil {
			return err
		}
		pg.args = append(pg.args, "-c", "ssl=on", "-c", "ssl_cert_file="+t.certFile, "-c", "ssl_key_file="+t.keyFile,
			"-c", "ssl_ca_file="+t.caFile)
	}
	for _, vars := range [][][2]string{postgresTuning, o.vars} { // later -c wins
		for _, v := range vars {
			pg.args = append(pg.args, "-c", v[0]+"="+v[1])
		}
	}
	var err error
	for range startAttempts { // the port may be taken between picking and binding
		if pg.Addr, err = childproc.FreeLoopbackAddr(); err != nil {
			return err
		}
		if err = pg.Start(ctx); err == nil {
			break
		}
	}
	if err != nil {
		return err
	}
	err = withAdmin("pgx", pg.adminDSN(), func(db *sql.DB) error {
		return execAll(ctx, db,
			fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", pg.User, pg.Password),
			fmt.Sprintf("CREATE DATABASE %s OWNER %s", pg.DBName, pg.User))
	})
	if err != nil {
		pg.Stop()
		return fmt.Errorf("create postgres database and user: %w", err)
	}
	return nil
}

// postgresTLSOnlyHBA lets User and any other role in over TLS only; the
// superuser keeps a plain line, for the package's administration.
const postgresTLSOnlyHBA = `local all all trust
host all tcadmin 127.0.0.1/32 scram-sha-256
hostssl all all 127.0.0.1/32 scram-sha-256
`

// requireTLS replaces initdb's pg_hba.conf with postgresTLSOnlyHBA.
func (pg *Postgres) requireTLS(data string) error {
	hba := filepath.Join(data, "pg_hba.conf")
	if err := os.WriteFile(hba, []byte(postgresTLSOnlyHBA), 0o600); err != nil {
		return fmt.Errorf("postgres: write pg_hba.conf: %w", err)
	}
	if err := pg.as.chownAll(hba); err != nil {
		return fmt.Errorf("postgres: hand pg_hba.conf to %s: %w", postgresSystemUser, err)
	}
	return nil
}

// StartPostgres is NewPostgres for one test: it fails the test when the
// server cannot start and closes it at the test's cleanup.
func StartPostgres(tb testing.TB, opts ...Option) *Postgres {
	tb.Helper()
	return startForTest(tb, "postgres", NewPostgres, opts)
}

// adminDSN reaches the superuser over TCP.
func (pg *Postgres) adminDSN() string { return pg.dsn("tcadmin", pg.superPassword, "postgres") }

func (pg *Postgres) dsn(user, password, dbname string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: pg.Addr,
		Path: "/" + dbname, RawQuery: "sslmode=disable"}
	return u.String()
}

// Start runs the server on its address and data directory and waits until
// it accepts connections; it does nothing when the server runs already.
func (pg *Postgres) Start(ctx context.Context) error {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.p != nil {
		return nil
	}
	host, port, err := net.SplitHostPort(pg.Addr)
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	cmd := exec.Command(pg.postgres, append([]string{"-h", host, "-p", port}, pg.args...)...)
	cmd.Dir, cmd.Env = pg.Dir, cleanEnv(pg.Dir)
	pg.as.apply(cmd)
	return pg.launchLocked(ctx, "postgres", pg.Addr, cmd, func(ctx context.Context) error {
		return withAdmin("pgx", pg.adminDSN(), func(db *sql.DB) error { return db.PingContext(ctx) })
	})
}

// DSN connects to DBName as User with github.com/jackc/pgx/v5/stdlib.
func (pg *Postgres) DSN() string { return pg.DSNFor(pg.DBName) }

// DSNFor connects to database name as User.
func (pg *Postgres) DSNFor(name string) string { return pg.dsn(pg.User, pg.Password, name) }

// NewDatabase creates a fresh database owned by User for one test; it lives
// until the server is closed.
func (pg *Postgres) NewDatabase(tb testing.TB) Database {
	tb.Helper()
	name := databaseName(pg.dbs.Add(1), tb.Name())
	ctx := context.Background()
	err := withAdmin("pgx", pg.adminDSN(), func(db *sql.DB) error {
		return execAll(ctx, db, fmt.Sprintf("CREATE DATABASE %s OWNER %s", name, pg.User))
	})
	if err != nil {
		tb.Fatalf("postgres: create database %s: %v", name, err)
	}
	return Database{Dialect: PostgresDialect, Name: name, DSN: pg.DSNFor(name)}
}
