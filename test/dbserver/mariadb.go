package dbserver

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
)

// mariadbDirs are where Debian's mariadb-server puts its programs.
var mariadbDirs = []string{"/usr/sbin", "/usr/bin"}

// mariadbTuning makes a throwaway server quick and small: no fsync, no
// doublewrite, a small redo log and buffer pool, no binary log. Debian's
// character set defaults (50-server.cnf) apply although --no-defaults skips
// that file.
var mariadbTuning = []string{
	"--innodb-flush-method=nosync", "--innodb-doublewrite=0", "--innodb-log-file-size=8M",
	"--innodb-buffer-pool-size=64M", "--skip-log-bin", "--skip-name-resolve",
	"--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
}

// MySQL is a running (or stopped) MariaDB server, CubeMaster's MySQL.
type MySQL struct {
	// Addr is "127.0.0.1:PORT", fixed for the server's life.
	Addr string
	// User and Password log in over TCP; User has every privilege on DBName
	// and on the databases NewDatabase creates.
	User, Password string
	// DBName is the database created at start.
	DBName string
	// Dir holds the data directory (data/), the socket and pid file (run/)
	// and tmp/; Close removes it.
	Dir string

	mariadbd string
	args     []string
	dbs      atomic.Int64
	running
}

// NewMariaDB initializes a data directory in a new temporary directory,
// starts mariadbd on a free loopback port and creates DBName and User. Close
// stops it and removes the directory.
func NewMariaDB(ctx context.Context, opts ...Option) (*MySQL, error) {
	o := makeOptions(opts)
	mariadbd, err := findBinary([]string{"mariadbd", "mysqld"}, mariadbDirs)
	if err != nil {
		return nil, err
	}
	installDB, err := findBinary([]string{"mariadb-install-db", "mysql_install_db"}, mariadbDirs)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tc-mariadb-")
	if err != nil {
		return nil, fmt.Errorf("mariadb: %w", err)
	}
	m := &MySQL{User: "tc", Password: randomHex(12), DBName: "tc", Dir: dir, mariadbd: mariadbd,
		running: running{stopSig: syscall.SIGTERM, dir: dir}}
	if err := m.initialize(ctx, installDB, o); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return m, nil
}

func (m *MySQL) initialize(ctx context.Context, installDB string, o options) error {
	for _, sub := range []string{"run", "tmp"} {
		if err := os.Mkdir(filepath.Join(m.Dir, sub), 0o700); err != nil {
			return fmt.Errorf("mariadb: %w", err)
		}
	}
	// mariadbd refuses to run as root unless told to; as anyone else it
	// runs as the current user and --user would fail.
	var asRoot []string
	if os.Geteuid() == 0 {
		asRoot = []string{"--user=root"}
	}
	data := filepath.Join(m.Dir, "data")
	install := exec.CommandContext(ctx, installDB, append(append([]string{"--no-defaults",
		"--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"},
		asRoot...), mariadbTuning...)...)
	install.Dir, install.Env = m.Dir, cleanEnv(m.Dir)
	if err := run(install); err != nil {
		return fmt.Errorf("initialize mariadb data directory: %w", err)
	}
	m.args = append([]string{"--datadir=" + data, "--bind-address=127.0.0.1",
		"--socket=" + m.socket(), "--pid-file=" + filepath.Join(m.Dir, "run", "mariadbd.pid"),
		"--tmpdir=" + filepath.Join(m.Dir, "tmp")}, asRoot...)
	m.args = append(m.args, mariadbTuning...)
	if t := o.tls; t != nil {
		// The socket counts as secure: the package's root connections
		// stay plain, every TCP client needs TLS.
		m.args = append(m.args, "--ssl-ca="+t.caFile, "--ssl-cert="+t.certFile, "--ssl-key="+t.keyFile,
			"--require-secure-transport=ON")
	}
	for _, v := range o.vars {
		m.args = append(m.args, "--"+v[0]+"="+v[1])
	}
	var err error
	for range startAttempts { // the port may be taken between picking and binding
		if m.Addr, err = childproc.FreeLoopbackAddr(); err != nil {
			return err
		}
		if err = m.Start(ctx); err == nil {
			break
		}
	}
	if err != nil {
		return err
	}
	err = withAdmin("mysql", m.rootDSN(), func(db *sql.DB) error {
		return execAll(ctx, db,
			"CREATE DATABASE "+m.DBName,
			fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", m.User, m.Password),
			fmt.Sprintf("GRANT ALL PRIVILEGES ON %s.* TO '%s'@'%%'", m.DBName, m.User))
	})
	if err != nil {
		m.Stop()
		return fmt.Errorf("create mariadb database and user: %w", err)
	}
	return nil
}

// StartMariaDB is NewMariaDB for one test: it fails the test when the server
// cannot start and closes it at the test's cleanup.
func StartMariaDB(tb testing.TB, opts ...Option) *MySQL {
	tb.Helper()
	return startForTest(tb, "mariadb", NewMariaDB, opts)
}

func (m *MySQL) socket() string { return filepath.Join(m.Dir, "run", "mariadbd.sock") }

// rootDSN reaches the server's root account over its socket.
func (m *MySQL) rootDSN() string {
	c := mysql.NewConfig()
	c.User, c.Net, c.Addr = "root", "unix", m.socket()
	return c.FormatDSN()
}

// Start runs the server on its address and data directory and waits until
// it accepts connections; it does nothing when the server runs already.
func (m *MySQL) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.p != nil {
		return nil
	}
	_, port, err := net.SplitHostPort(m.Addr)
	if err != nil {
		return fmt.Errorf("start mariadb: %w", err)
	}
	// --no-defaults first: no /etc/mysql option file reaches the server.
	cmd := exec.Command(m.mariadbd, append([]string{"--no-defaults", "--port=" + port}, m.args...)...)
	cmd.Dir, cmd.Env = m.Dir, cleanEnv(m.Dir)
	return m.launchLocked(ctx, "mariadb", m.Addr, cmd, func(ctx context.Context) error {
		return withAdmin("mysql", m.rootDSN(), func(db *sql.DB) error { return db.PingContext(ctx) })
	})
}

// DSN connects to DBName as User with github.com/go-sql-driver/mysql.
func (m *MySQL) DSN() string { return m.DSNFor(m.DBName) }

// DSNFor connects to database name as User (parseTime on, so DATETIME
// columns scan into time.Time).
func (m *MySQL) DSNFor(name string) string {
	c := mysql.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr, c.DBName, c.ParseTime = m.User, m.Password, "tcp", m.Addr, name, true
	return c.FormatDSN()
}

// NewDatabase creates a fresh database for one test and grants User every
// privilege on it; it lives until the server is closed.
func (m *MySQL) NewDatabase(tb testing.TB) Database {
	tb.Helper()
	name := databaseName(m.dbs.Add(1), tb.Name())
	ctx := context.Background()
	err := withAdmin("mysql", m.rootDSN(), func(db *sql.DB) error {
		return execAll(ctx, db, "CREATE DATABASE "+name,
			fmt.Sprintf("GRANT ALL PRIVILEGES ON %s.* TO '%s'@'%%'", name, m.User))
	})
	if err != nil {
		tb.Fatalf("mariadb: create database %s: %v", name, err)
	}
	return Database{Dialect: MySQLDialect, Name: name, DSN: m.DSNFor(name)}
}
