package dbserver

import (
	"context"
	"sync"
	"testing"
)

// Shared starts each server once for a whole test package, on first use.
// Declare it as a package variable of the test package, set the option
// fields before the first use, and call Close from TestMain.
type Shared struct {
	// MariaDBOptions, PostgresOptions and RedisOptions are the options each
	// server starts with.
	MariaDBOptions, PostgresOptions, RedisOptions []Option

	mariadb  lazy[*MySQL]
	postgres lazy[*Postgres]
	redis    lazy[*Redis]
}

// lazy holds a server started at most once.
type lazy[T any] struct {
	once    sync.Once
	v       T
	err     error
	started bool
}

func (l *lazy[T]) get(start func() (T, error)) (T, error) {
	l.once.Do(func() {
		l.v, l.err = start()
		l.started = l.err == nil
	})
	return l.v, l.err
}

// MariaDB returns the package's MariaDB server, starting it on the first
// call; it fails the test (never skips it) when the server cannot start.
func (sh *Shared) MariaDB(tb testing.TB) *MySQL {
	tb.Helper()
	m, err := sh.mariadb.get(func() (*MySQL, error) { return NewMariaDB(context.Background(), sh.MariaDBOptions...) })
	if err != nil {
		tb.Fatalf("mariadb test server: %v", err)
	}
	return m
}

// Postgres returns the package's PostgreSQL server, starting it on
// the first call; it fails the test when the server cannot start.
func (sh *Shared) Postgres(tb testing.TB) *Postgres {
	tb.Helper()
	pg, err := sh.postgres.get(func() (*Postgres, error) { return NewPostgres(context.Background(), sh.PostgresOptions...) })
	if err != nil {
		tb.Fatalf("postgres test server: %v", err)
	}
	return pg
}

// Redis returns the package's Redis server, starting it on the first
// call; it fails the test when the server cannot start.
func (sh *Shared) Redis(tb testing.TB) *Redis {
	tb.Helper()
	r, err := sh.redis.get(func() (*Redis, error) { return NewRedis(context.Background(), sh.RedisOptions...) })
	if err != nil {
		tb.Fatalf("redis test server: %v", err)
	}
	return r
}

// Close stops every server Shared started and removes their directories.
func (sh *Shared) Close() {
	if sh.mariadb.started {
		sh.mariadb.v.Close()
	}
	if sh.postgres.started {
		sh.postgres.v.Close()
	}
	if sh.redis.started {
		sh.redis.v.Close()
	}
}
