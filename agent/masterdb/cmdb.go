package masterdb

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// The drivers Options.Driver names.
const (
	DriverMySQL    = "mysql"
	DriverPostgres = "postgres"
)

// Sentinel errors; callers test them with errors.Is.
var (
	// ErrJobNotFound is a job_id with no (live) job row.
	ErrJobNotFound = errors.New("job not found in CubeMaster's database")
	// ErrUnavailable is a database that cannot be reached now (refused
	// or dropped connections, timeouts, a server shutting down): worth
	// retrying later, unlike a wrong password or a missing table.
	ErrUnavailable = errors.New("CubeMaster's database is unavailable")
)

// Options locate the database and shape the connection pool.
type Options struct {
	// Driver is DriverMySQL or DriverPostgres.
	Driver string
	// Addr is host:port.
	Addr     string
	User     string
	Password string
	DBName   string
	// ConnTimeout bounds connecting; ReadTimeout and WriteTimeout bound
	// reading an answer and writing a query. Every query is bounded by
	// ConnTimeout+ReadTimeout+WriteTimeout as a whole as well (PostgreSQL's
	// driver has no read or write timeout of its own).
	ConnTimeout, ReadTimeout, WriteTimeout time.Duration
	// MaxIdleConns, MaxOpenConns and MaxConnLifetime size the pool.
	MaxIdleConns, MaxOpenConns int
	MaxConnLifetime            time.Duration
	// SSLMode is PostgreSQL's sslmode; empty is the driver's default.
	// TLS replaces it when set.
	SSLMode string
	// TLS, when not nil, is required on either driver, with no fallback to
	// plain TCP; an empty ServerName means the host of Addr.
	TLS *tls.Config
}

// String shows where the options lead, never the password.
func (o Options) String() string {
	return fmt.Sprintf("%s://%s@%s/%s", o.Driver, o.User, o.Addr, o.DBName)
}

// GoString is String, for %#v.
func (o Options) GoString() string { return o.String() }

// LogValue is String, for slog.
func (o Options) LogValue() slog.Value { return slog.StringValue(o.String()) }

// DB is an open connection pool to CubeMaster's database.
type DB struct {
	db      *sql.DB
	driver  string
	timeout time.Duration
}

// Open builds the pool and checks the database answers. A server that
// cannot be reached is not an error here (TC starts, and answers 503 until
// it can reach it); one that refuses the login or lacks the database is.
func Open(ctx context.Context, o Options) (*DB, error) {
	sdb, err := openPool(o)
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", o.Driver, err)
	}
	sdb.SetMaxOpenConns(o.MaxOpenConns)
	sdb.SetMaxIdleConns(o.MaxIdleConns)
	sdb.SetConnMaxLifetime(o.MaxConnLifetime)
	d := &DB{db: sdb, driver: o.Driver, timeout: o.ConnTimeout + o.ReadTimeout + o.WriteTimeout}
	if d.timeout <= 0 {
		d.timeout = 15 * time.Second
	}
	if err := d.Ping(ctx); err != nil && !errors.Is(err, ErrUnavailable) {
		sdb.Close()
		return nil, err
	}
	return d, nil
}

// openPool opens the pool through a driver connector, so a tls.Config
// reaches the driver without a process-wide registry.
func openPool(o Options) (*sql.DB, error) {
	_, dsn, err := DSN(o)
	if err != nil {
		return nil, err
	}
	switch o.Driver {
	case DriverMySQL:
		c, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, err
		}
		// The driver fills an empty ServerName from Addr's host.
		c.TLS = o.TLS
		conn, err := mysql.NewConnector(c)
		if err != nil {
			return nil, err
		}
		return sql.OpenDB(conn), nil
	default: // DriverPostgres, as DSN checked
		c, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		if o.TLS != nil {
			t := o.TLS.Clone()
			if t.ServerName == "" {
				t.ServerName = c.Host // tls.Client needs it to verify the name
			}
			// No fallback: sslmode's prefer would retry in plain text.
			c.TLSConfig, c.Fallbacks = t, nil
		}
		return stdlib.OpenDB(*c), nil
	}
}

// DSN returns the database/sql driver name and data source name for o.
func DSN(o Options) (driverName, dsn string, err error) {
	switch o.Driver {
	case DriverMySQL:
		c := mysql.NewConfig()
		c.User, c.Passwd, c.Net, c.Addr, c.DBName = o.User, o.Password, "tcp", o.Addr, o.DBName
		c.Timeout, c.ReadTimeout, c.WriteTimeout = o.ConnTimeout, o.ReadTimeout, o.WriteTimeout
		c.ParseTime, c.Loc = true, time.UTC
		// RowsAffected counts matched rows, as on PostgreSQL, so a claim
		// of a row already DELETING is seen.
		c.ClientFoundRows = true
		return "mysql", c.FormatDSN(), nil
	case DriverPostgres:
		q := url.Values{}
		if o.SSLMode != "" {
			q.Set("sslmode", o.SSLMode)
		}
		if o.ConnTimeout > 0 {
			// connect_timeout is whole seconds; round up so 500ms is not "no limit".
			q.Set("connect_timeout", strconv.Itoa(int((o.ConnTimeout+time.Second-1)/time.Second)))
		}
		u := url.URL{Scheme: "postgres", User: url.UserPassword(o.User, o.Password), Host: o.Addr,
			Path: "/" + o.DBName, RawQuery: q.Encode()}
		return "pgx", u.String(), nil
	}
	return "", "", fmt.Errorf("open database: driver %q is not %s or %s", o.Driver, DriverMySQL, DriverPostgres)
}

// Close closes the pool.
func (d *DB) Close() error { return d.db.Close() }

// Ping checks the database answers; an unreachable one is ErrUnavailable.
func (d *DB) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	if err := d.db.PingContext(ctx); err != nil {
		return d.wrap("ping", err)
	}
	return nil
}

// wrap names the operation and marks unreachable-database errors.
func (d *DB) wrap(op string, err error) error {
	if Unavailable(err) {
		return fmt.Errorf("%s %s database: %w: %w", op, d.driver, ErrUnavailable, err)
	}
	return fmt.Errorf("%s %s database: %w", op, d.driver, err)
}
