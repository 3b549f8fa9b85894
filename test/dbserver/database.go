package dbserver

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	// The drivers the DSNs are for: "mysql" and "pgx" in database/sql.
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// Dialect names a SQL server family.
type Dialect string

// The dialects of CubeMaster's database.
const (
	MySQLDialect    Dialect = "mysql"
	PostgresDialect Dialect = "postgres"
)

// Driver returns the database/sql driver name the package's DSNs are for:
// github.com/go-sql-driver/mysql ("mysql") or github.com/jackc/pgx/v5/stdlib
// ("pgx").
func (d Dialect) Driver() string {
	if d == PostgresDialect {
		return "pgx"
	}
	return "mysql"
}

// Database is one database on a running server, reachable by the server's
// password user.
type Database struct {
	// Dialect is the server's.
	Dialect Dialect
	// Name is the database's name.
	Name string
	// DSN connects to it with Dialect.Driver().
	DSN string
}

// Open opens the database with database/sql, checks that it answers and
// closes it at the test's cleanup.
func (d Database) Open(tb testing.TB) *sql.DB {
	tb.Helper()
	db, err := sql.Open(d.Dialect.Driver(), d.DSN)
	if err != nil {
		tb.Fatalf("open database %s: %v", d.Name, err)
	}
	tb.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		tb.Fatalf("connect to database %s: %v", d.Name, err)
	}
	return db
}

// unsafeName matches what may not appear in a generated database name.
var unsafeName = regexp.MustCompile(`[^a-z0-9_]+`)

// databaseName makes a unique, valid database name for a test: n numbers it
// on its server, the test's name makes it readable in the server's list.
func databaseName(n int64, testName string) string {
	name := fmt.Sprintf("t%d_%s", n, strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(testName), "_"), "_"))
	if len(name) > 48 { // both servers take 63 or 64 bytes
		name = name[:48]
	}
	return strings.TrimRight(name, "_")
}

// withAdmin opens driver/dsn, runs f on it and closes it.
func withAdmin(driver, dsn string, f func(*sql.DB) error) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return f(db)
}

// execAll runs each statement in order, stopping at the first error.
func execAll(ctx context.Context, db *sql.DB, stmts ...string) error {
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", firstLine(s), err)
		}
	}
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
