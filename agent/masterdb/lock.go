package masterdb

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// ReconcileLockName is the session lock the CLEANUP_PENDING sweep runs
// under, so that one replica sweeps at a time.
const ReconcileLockName = "tc_reconcile_v1"

// maxLockName is MySQL's limit on a GET_LOCK name.
const maxLockName = 64

// LockName fits name within MySQL's 64 characters the way CubeMaster does:
// a longer name becomes its first 47 characters, "_", and the first 16 hex
// digits of sha256(name). PostgreSQL uses the same names, hashed.
func LockName(name string) string {
	if len(name) <= maxLockName {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:47] + "_" + hex.EncodeToString(sum[:])[:16]
}

// BuildLockName is the session lock a build of fingerprint runs under on
// every replica.
func BuildLockName(fingerprint string) string { return LockName("tc_build_" + fingerprint) }

// LockOptions shape a held lock's keepalive.
type LockOptions struct {
	// Keepalive is how often the lock's connection is used to check it
	// still holds the lock, so a server's idle timeout (MySQL
	// wait_timeout, PostgreSQL idle_session_timeout) or an idle proxy
	// never drops it. It is shortened to a third of the server's idle
	// timeout when that is shorter. Zero means 10 s.
	Keepalive time.Duration
	// OnLost is called (from the keepalive) when the lock was found lost:
	// its connection broke or another session holds it. OnRegained is
	// called when a later keepalive took it again. Both may be nil.
	OnLost     func(err error)
	OnRegained func()
}

// defaultKeepalive is LockOptions.Keepalive's default.
const defaultKeepalive = 10 * time.Second

// Lock is a session lock held on a connection of its own, pinned out of
// the pool for as long as the lock is held, and kept alive.
type Lock struct {
	d    *DB
	name string
	opts LockOptions

	// checkMu lets one check (keepalive or Check) use the connection at
	// a time, so a loss is seen and the lock retaken once.
	checkMu sync.Mutex
	// released is set by Release, under checkMu: no check takes the lock
	// again after it.
	released bool
	mu       sync.Mutex
	conn     *sql.Conn // nil while lost
	// lost counts the losses seen, for Lost.
	lost int
	// stop ends the keepalive, and any check it has in progress.
	stop  context.CancelFunc
	done  chan struct{}
	every time.Duration
}

// TryLock takes the session lock name without waiting. It returns
// (nil, false, nil) when another session holds it.
func (d *DB) TryLock(ctx context.Context, name string, o LockOptions) (*Lock, bool, error) {
	if o.Keepalive <= 0 {
		o.Keepalive = defaultKeepalive
	}
	conn, ok, err := d.takeLock(ctx, name)
	if err != nil || !ok {
		return nil, false, err
	}
	keepCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l := &Lock{d: d, name: name, opts: o, conn: conn, stop: stop, done: make(chan struct{}), every: o.Keepalive}
	if idle := d.idleTimeout(ctx, conn); idle > 0 && idle/3 < l.every {
		l.every = max(idle/3, 100*time.Millisecond)
	}
	go l.keepalive(keepCtx)
	return l, true, nil
}

// takeLock pins a connection and asks for the lock on it; the connection
// is returned to the pool when the lock is not granted.
func (d *DB) takeLock(ctx context.Context, name string) (*sql.Conn, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, false, d.wrap("take lock "+name+" on", err)
	}
	var granted bool
	if d.driver == DriverPostgres {
		err = conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", name).Scan(&granted)
	} else {
		var got sql.NullInt64
		err = conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got)
		granted = got.Valid && got.Int64 == 1
	}
	if err != nil {
		discard(conn)
		return nil, false, d.wrap("take lock "+name+" on", err)
	}
	if !granted {
		conn.Close()
		return nil, false, nil
	}
	return conn, true, nil
}

// idleTimeout reads how long the server lets the lock's session idle; 0
// when it does not limit it or cannot tell.
func (d *DB) idleTimeout(ctx context.Context, conn *sql.Conn) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	if d.driver == DriverPostgres {
		var setting, unit string
		if err := conn.QueryRowContext(ctx, "SELECT setting, unit FROM pg_settings WHERE name = 'idle_session_timeout'").
			Scan(&setting, &unit); err != nil {
			return 0
		}
		n, err := strconv.ParseInt(setting, 10, 64)
		if err != nil || unit != "ms" {
			return 0
		}
		return time.Duration(n) * time.Millisecond
	}
	var secs int64
	if err := conn.QueryRowContext(ctx, "SELECT @@session.wait_timeout").Scan(&secs); err != nil {
		return 0
	}
	return time.Duration(secs) * time.Second
}

// held asks the server whether conn's session still holds the lock.
func (l *Lock) held(ctx context.Context, conn *sql.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, l.d.timeout)
	defer cancel()
	var ok sql.NullBool
	var err error
	if l.d.driver == DriverPostgres {
		// The connection holds this lock and no other.
		err = conn.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "+
			"AND pid = pg_backend_pid() AND granted)").Scan(&ok)
	} else {
		err = conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", l.name).Scan(&ok)
	}
	switch {
	case err != nil:
		return l.d.wrap("check lock "+l.name+" on", err)
	case !ok.Valid || !ok.Bool:
		return fmt.Errorf("lock %s is no longer held by this session", l.name)
	}
	return nil
}

// ErrLockHeld is a lock another session holds.
var ErrLockHeld = errors.New("lock is held by another session")

// keepalive checks the lock at every interval until Release; a lost lock is
// reported and taken again when it becomes free.
func (l *Lock) keepalive(ctx context.Context) {
	defer close(l.done)
	tick := time.NewTicker(l.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		_ = l.check(ctx, false)
	}
}

// Check makes sure the lock is held now, before work that must not run
// without it: it asks the server, and when the lock was lost it tries to
// take it again at once. It returns nil when the lock is held, an error
// matching ErrLockHeld when another session holds it, or the error that
// kept it from asking.
func (l *Lock) Check(ctx context.Context) error {
	return l.check(ctx, true)
}

// check is one keepalive step: the held lock's connection is asked, a lost
// one dropped (OnLost), a lock found lost before taken again when free
// (OnRegained); retake also takes a lock it has just found lost.
func (l *Lock) check(ctx context.Context, retake bool) error {
	l.checkMu.Lock()
	defer l.checkMu.Unlock()
	if l.released {
		return fmt.Errorf("lock %s was released", l.name)
	}
	l.mu.Lock()
	conn := l.conn
	l.mu.Unlock()
	if conn != nil {
		err := l.held(ctx, conn)
		if err == nil || ctx.Err() != nil {
			return err
		}
		discard(conn)
		l.mu.Lock()
		l.conn = nil
		l.lost++
		l.mu.Unlock()
		if l.opts.OnLost != nil {
			l.opts.OnLost(err)
		}
		if !retake {
			return err
		}
	}
	conn, ok, err := l.d.takeLock(ctx, l.name)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("take lock %s again: %w", l.name, ErrLockHeld)
	}
	l.mu.Lock()
	l.conn = conn
	l.mu.Unlock()
	if l.opts.OnRegained != nil {
		l.opts.OnRegained()
	}
	return nil
}

// Name is the lock's name.
func (l *Lock) Name() string { return l.name }

// Lost reports how many times the lock was found lost while held.
func (l *Lock) Lost() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// Release gives the lock up and closes its connection, which ends the
// session's hold even when the release statement cannot be sent. It is
// safe to call once.
func (l *Lock) Release(ctx context.Context) error {
	l.stop()
	<-l.done
	l.checkMu.Lock()
	l.released = true
	l.checkMu.Unlock()
	l.mu.Lock()
	conn := l.conn
	l.conn = nil
	l.mu.Unlock()
	if conn == nil {
		return nil
	}
	defer discard(conn)
	ctx, cancel := context.WithTimeout(ctx, l.d.timeout)
	defer cancel()
	q := "SELECT RELEASE_LOCK(?) = 1"
	if l.d.driver == DriverPostgres {
		q = "SELECT pg_advisory_unlock(hashtext($1))"
	}
	var released sql.NullBool
	if err := conn.QueryRowContext(ctx, q, l.name).Scan(&released); err != nil {
		return l.d.wrap("release lock "+l.name+" on", err)
	}
	if !released.Valid || !released.Bool {
		return fmt.Errorf("release lock %s: it was not held by this session", l.name)
	}
	return nil
}

// discard closes conn and keeps the pool from reusing it, so a session
// lock it may still hold ends with it.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
