package masterdb

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
	"github.com/cubesandbox/cubetemplatecenter/test/wait"
)

func TestLockName(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	for _, c := range []struct{ in, want string }{
		{ReconcileLockName, ReconcileLockName},
		{strings.Repeat("x", 64), strings.Repeat("x", 64)},
		// 73 characters: the first 47, "_", and sha256's first 16 hex
		// digits (sha256sum of the full name).
		{"tc_build_" + fp, "tc_build_ababababababababababababababababababab_a564e5c7e461b0b9"},
	} {
		if got := LockName(c.in); got != c.want || len(got) > 64 {
			t.Errorf("LockName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := BuildLockName(fp); got != LockName("tc_build_"+fp) {
		t.Errorf("BuildLockName = %q", got)
	}
}

func TestTryLock(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, _, _ := dl.open(t)
			a, b := openDB(t, o), openDB(t, o)
			ctx := context.Background()
			name := BuildLockName(strings.Repeat("cd", 32))
			la, ok, err := a.TryLock(ctx, name, LockOptions{})
			if err != nil || !ok {
				t.Fatalf("first TryLock = %v, %v", ok, err)
			}
			if _, ok, err := b.TryLock(ctx, name, LockOptions{}); err != nil || ok {
				t.Fatalf("TryLock of a held lock = %v, %v; want not granted", ok, err)
			}
			// Another name is independent.
			lo, ok, err := b.TryLock(ctx, ReconcileLockName, LockOptions{})
			if err != nil || !ok {
				t.Fatalf("TryLock of another name = %v, %v", ok, err)
			}
			if err := lo.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := la.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			lb, ok, err := b.TryLock(ctx, name, LockOptions{})
			if err != nil || !ok {
				t.Fatalf("TryLock after release = %v, %v", ok, err)
			}
			if err := lb.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// A released lock's connection left the pool: every pinned
			// connection was discarded, none holds a lock any more.
			if st := a.db.Stats(); st.InUse != 0 {
				t.Errorf("pool has %d connections in use after release", st.InUse)
			}
		})
	}
}

// TestLockSurvivesIdleTimeout holds a lock well past the server's idle
// session timeout: the keepalive keeps the session, so another session
// cannot take the lock. The same wait on a bare idle connection loses it,
// which shows the timeout is real.
func TestLockSurvivesIdleTimeout(t *testing.T) {
	const idle = 2 * time.Second
	cases := []struct {
		name string
		open func(t *testing.T) Options
	}{
		{"MySQL", func(t *testing.T) Options {
			srv := dbserver.StartMariaDB(t, dbserver.WithVar("wait_timeout", "2"))
			return options(DriverMySQL, srv.Addr, srv.User, srv.Password, srv.DBName)
		}},
		{"Postgres", func(t *testing.T) Options {
			srv := servers.Postgres(t)
			d := srv.NewDatabase(t)
			if _, err := d.Open(t).Exec("ALTER DATABASE " + d.Name + " SET idle_session_timeout = '2s'"); err != nil {
				t.Fatal(err)
			}
			o := options(DriverPostgres, srv.Addr, srv.User, srv.Password, d.Name)
			o.SSLMode = "disable"
			return o
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.open(t)
			holder, other := openDB(t, o), openDB(t, o)
			ctx := context.Background()
			var lost atomic.Int32
			l, ok, err := holder.TryLock(ctx, "tc_build_keepalive", LockOptions{Keepalive: time.Minute,
				OnLost: func(error) { lost.Add(1) }})
			if err != nil || !ok {
				t.Fatalf("TryLock = %v, %v", ok, err)
			}
			defer l.Release(ctx)
			bare := rawLock(t, other, o.Driver, "tc_build_bare")
			time.Sleep(3 * idle)
			if _, ok, err := other.TryLock(ctx, "tc_build_keepalive", LockOptions{}); err != nil || ok {
				t.Errorf("after %s idle, another session got the kept-alive lock (%v, %v)", 3*idle, ok, err)
			}
			if n := lost.Load(); n != 0 || l.Lost() != 0 {
				t.Errorf("keepalive reported %d losses", n)
			}
			if _, ok, err := holder.TryLock(ctx, "tc_build_bare", LockOptions{}); err != nil || !ok {
				t.Errorf("the lock of an idle bare connection survived the server's timeout (%v, %v)", ok, err)
			}
			bare.Close()
		})
	}
}

// rawLock takes name on a pinned connection and leaves it idle.
func rawLock(t *testing.T, d *DB, driver, name string) *sql.Conn {
	t.Helper()
	conn, err := d.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	q := "SELECT GET_LOCK(?, 0) = 1"
	if driver == DriverPostgres {
		q = "SELECT pg_try_advisory_lock(hashtext($1))"
	}
	var ok bool
	if err := conn.QueryRowContext(context.Background(), q, name).Scan(&ok); err != nil || !ok {
		t.Fatalf("take %s: %v, %v", name, ok, err)
	}
	return conn
}

// TestLockLostAndRegained kills the lock's session: the keepalive reports
// the loss, and takes the lock again once the session that took it over
// lets it go.
func TestLockLostAndRegained(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, admin, _ := dl.open(t)
			holder, other := openDB(t, o), openDB(t, o)
			ctx := context.Background()
			name := "tc_build_killed"
			lostCh, regained := make(chan error, 4), make(chan struct{}, 4)
			l, ok, err := holder.TryLock(ctx, name, LockOptions{Keepalive: 100 * time.Millisecond,
				OnLost: func(err error) { lostCh <- err }, OnRegained: func() { regained <- struct{}{} }})
			if err != nil || !ok {
				t.Fatalf("TryLock = %v, %v", ok, err)
			}
			defer l.Release(ctx)
			killLockSession(t, admin, o.Driver, name)
			select {
			case err := <-lostCh:
				t.Logf("loss reported: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the killed session's lock was not reported lost")
			}
			taken, ok, err := other.TryLock(ctx, name, LockOptions{})
			if err != nil || !ok {
				t.Fatalf("another session could not take the lost lock: %v, %v", ok, err)
			}
			if err := taken.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-regained:
			case <-time.After(30 * time.Second):
				t.Fatal("the lock was not taken again after it became free")
			}
			if l.Lost() != 1 {
				t.Errorf("Lost() = %d, want 1", l.Lost())
			}
			if _, ok, err := other.TryLock(ctx, name, LockOptions{}); err != nil || ok {
				t.Errorf("after regaining, another session got the lock (%v, %v)", ok, err)
			}
		})
	}
}

// TestLockCheck: Check answers at once, without waiting for the keepalive:
// nil while held; after the session was killed and another took the lock,
// ErrLockHeld (and the loss reported); once free, the lock is taken again.
func TestLockCheck(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, admin, _ := dl.open(t)
			holder, other := openDB(t, o), openDB(t, o)
			ctx := context.Background()
			name := "tc_build_checked"
			lost := 0
			l, ok, err := holder.TryLock(ctx, name, LockOptions{Keepalive: time.Hour, OnLost: func(error) { lost++ }})
			if err != nil || !ok {
				t.Fatalf("TryLock = %v, %v", ok, err)
			}
			defer l.Release(ctx)
			if err := l.Check(ctx); err != nil {
				t.Fatalf("Check of a held lock = %v", err)
			}
			killLockSession(t, admin, o.Driver, name)
			var taken *Lock
			wait.For(t, "another session to take the lock", func() bool {
				var err error
				taken, ok, err = other.TryLock(ctx, name, LockOptions{Keepalive: time.Hour})
				return err == nil && ok
			})
			if err := l.Check(ctx); !errors.Is(err, ErrLockHeld) {
				t.Errorf("Check with the lock taken over = %v, want ErrLockHeld", err)
			}
			if lost != 1 || l.Lost() != 1 {
				t.Errorf("losses reported %d, counted %d; want 1", lost, l.Lost())
			}
			if err := taken.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := l.Check(ctx); err != nil {
				t.Errorf("Check once the lock is free = %v, want it taken again", err)
			}
			if _, ok, err := other.TryLock(ctx, name, LockOptions{}); err != nil || ok {
				t.Errorf("after Check took it again, another session got the lock (%v, %v)", ok, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release after Check took the lock again: %v", err)
			}
			if err := l.Check(ctx); err == nil {
				t.Error("Check after Release took the lock again")
			}
		})
	}
}

// killLockSession ends, from admin, the session that holds lock name.
func killLockSession(t *testing.T, admin *sql.DB, driver, name string) {
	t.Helper()
	kill := "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
	if driver == DriverMySQL {
		var id int64
		if err := admin.QueryRow("SELECT IS_USED_LOCK(?)", name).Scan(&id); err != nil {
			t.Fatal(err)
		}
		kill = "KILL " + strconv.FormatInt(id, 10)
	}
	if _, err := admin.Exec(kill); err != nil {
		t.Fatalf("%s: %v", kill, err)
	}
}
