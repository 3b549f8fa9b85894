package config

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// Database drivers, as instance_db_config.driver spells them.
const (
	DriverMySQL    = "mysql"
	DriverPostgres = "postgres"
)

// InstanceDB locates CubeMaster's database (instance_db_config:, upstream's
// key names). With Driver empty no database is used and TC works alone, as
// without the section. Timeouts are whole seconds, as upstream writes them.
type InstanceDB struct {
	// Driver is mysql or postgres; empty turns the database off.
	Driver string `yaml:"driver"`
	// Addr is host:port.
	Addr string `yaml:"addr"`
	User string `yaml:"user"`
	// Pwd never prints (see Secret).
	Pwd    Secret `yaml:"pwd"`
	DBName string `yaml:"db_name"`
	// ConnTimeout, ReadTimeout and WriteTimeout bound connecting, reading
	// an answer and writing a query, in seconds.
	ConnTimeout  int `yaml:"conn_timeout"`
	ReadTimeout  int `yaml:"read_timeout"`
	WriteTimeout int `yaml:"write_timeout"`
	// MaxIdleConns and MaxOpenConns size the connection pool.
	MaxIdleConns int `yaml:"max_idle_conns"`
	MaxOpenConns int `yaml:"max_open_conns"`
	// MaxConnLifeTimeSeconds retires a pooled connection after this long.
	MaxConnLifeTimeSeconds int `yaml:"max_conn_life_time_seconds"`
	// SSLMode is PostgreSQL's sslmode (disable, allow, prefer, require,
	// verify-ca, verify-full, verified against the system's roots); empty
	// means the driver's default, prefer, which encrypts when the server
	// offers it but verifies nothing: it keeps existing installs working.
	// MySQL takes only "" or disable. Set TLS instead for verified TLS with
	// a CA file of its own.
	SSLMode string `yaml:"sslmode"`
	// TLS, when enabled, requires TLS with the server's certificate
	// verified, on either driver; sslmode must then be empty.
	TLS TLS `yaml:"tls"`
}

// verified reports whether the connection authenticates the server: TLS
// enabled and verifying, or PostgreSQL's verify-ca or verify-full.
func (d *InstanceDB) verified() bool {
	if d.TLS.Enabled {
		return !d.TLS.InsecureSkipVerify
	}
	return d.Driver == DriverPostgres && (d.SSLMode == "verify-ca" || d.SSLMode == "verify-full")
}

// defaultInstanceDB is upstream's defaults for everything but where the
// database is and who logs in: those must be configured.
func defaultInstanceDB() InstanceDB {
	return InstanceDB{ConnTimeout: 5, ReadTimeout: 5, WriteTimeout: 5, MaxIdleConns: 5, MaxOpenConns: 20,
		MaxConnLifeTimeSeconds: 300}
}

// Enabled reports whether a database is configured.
func (d *InstanceDB) Enabled() bool { return strings.TrimSpace(d.Driver) != "" }

// pgSSLModes are the sslmode values PostgreSQL's clients know.
var pgSSLModes = []string{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

// validate returns the database settings' problems, each naming its key;
// nothing is checked when no database is configured.
func (d *InstanceDB) validate() []error {
	if !d.Enabled() {
		return nil
	}
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("instance_db_config.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	switch d.Driver {
	case DriverMySQL:
		if d.SSLMode != "" && d.SSLMode != "disable" {
			bad("sslmode", "%q applies to postgres only; mysql takes \"\" or disable", d.SSLMode)
		}
	case DriverPostgres:
		if d.SSLMode != "" && !slices.Contains(pgSSLModes, d.SSLMode) {
			bad("sslmode", "%q is not one of %s", d.SSLMode, strings.Join(pgSSLModes, ", "))
		}
	default:
		bad("driver", "%q is not mysql or postgres", d.Driver)
	}
	if d.TLS.Enabled && d.SSLMode != "" {
		bad("sslmode", "%q with tls.enabled: leave sslmode empty, tls decides", d.SSLMode)
	}
	errs = append(errs, d.TLS.validate("instance_db_config.tls")...)
	if host, port, err := net.SplitHostPort(d.Addr); err != nil || host == "" || !validPort(port) {
		bad("addr", "%q is not host:port", d.Addr)
	}
	if strings.TrimSpace(d.User) == "" {
		bad("user", "required")
	}
	if strings.TrimSpace(d.DBName) == "" {
		bad("db_name", "required")
	}
	for _, r := range []struct {
		key       string
		v, lo, hi int
	}{
		{"conn_timeout", d.ConnTimeout, 1, 3600},
		{"read_timeout", d.ReadTimeout, 1, 3600},
		{"write_timeout", d.WriteTimeout, 1, 3600},
		{"max_idle_conns", d.MaxIdleConns, 0, 1000},
		{"max_open_conns", d.MaxOpenConns, 1, 1000},
		{"max_conn_life_time_seconds", d.MaxConnLifeTimeSeconds, 1, 86400},
	} {
		if r.v < r.lo || r.v > r.hi {
			bad(r.key, "%d is outside %d..%d", r.v, r.lo, r.hi)
		}
	}
	if d.MaxIdleConns > d.MaxOpenConns {
		bad("max_idle_conns", "%d is above max_open_conns %d", d.MaxIdleConns, d.MaxOpenConns)
	}
	return errs
}

func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535
}
