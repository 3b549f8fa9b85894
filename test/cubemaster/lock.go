package cubemaster

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"
)

// DefaultLockWait is how long CubeMaster waits for a build lock when it
// registers a BUILT artifact.
const DefaultLockWait = 10 * time.Second

// maxLockName is the longest lock name MySQL's GET_LOCK takes; longer names
// are shortened (on PostgreSQL too, so both servers lock the same names).
const maxLockName = 64

// NormalizeLockName returns the database lock name CubeMaster uses for
// name: name itself when it has at most 64 characters, else its first 47
// characters, "_" and the first 16 hex digits of sha256(name).
func NormalizeLockName(name string) string {
	if len(name) <= maxLockName {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:47] + "_" + hex.EncodeToString(sum[:])[:16]
}

// BuildLockName is the lock a build of fingerprint runs under, on TC's
// side for the whole build and on CubeMaster's while it registers the
// artifact: "tc_build_<fingerprint>", normalized.
func BuildLockName(fingerprint string) string {
	return NormalizeLockName("tc_build_" + fingerprint)
}

// errLockBusy is a lock another session held for the whole wait.
var errLockBusy = errors.New("lock held by another session")

// lockPoll is how often PostgreSQL's lock is tried again, as CubeMaster
// polls.
const lockPoll = 200 * time.Millisecond

// acquireLock takes the session lock name on conn, waiting at most wait.
// MySQL waits in the server (GET_LOCK, whole seconds rounded up);
// PostgreSQL is polled with pg_try_advisory_lock.
func acquireLock(ctx context.Context, conn *sql.Conn, dialect, name string, wait time.Duration) error {
	if dialect == dialectMySQL {
		secs := int64(math.Ceil(wait.Seconds()))
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", name, secs).Scan(&got); err != nil {
			return fmt.Errorf("get lock %s: %w", name, err)
		}
		if !got.Valid || got.Int64 != 1 {
			return fmt.Errorf("get lock %s within %s: %w", name, wait, errLockBusy)
		}
		return nil
	}
	deadline := time.Now().Add(wait)
	for {
		var got bool
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", name).Scan(&got); err != nil {
			return fmt.Errorf("get lock %s: %w", name, err)
		}
		if got {
			return nil
		}
		if !time.Now().Add(lockPoll).Before(deadline) {
			return fmt.Errorf("get lock %s within %s: %w", name, wait, errLockBusy)
		}
		t := time.NewTimer(lockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("get lock %s: %w", name, ctx.Err())
		case <-t.C:
		}
	}
}

// releaseLock gives the lock back. When that fails the connection is
// dropped rather than returned to the pool, since a session that still
// holds the lock would block every later registration of the fingerprint.
func releaseLock(conn *sql.Conn, dialect, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q := "SELECT RELEASE_LOCK(?)"
	if dialect == dialectPostgres {
		q = "SELECT pg_advisory_unlock(hashtext($1))"
	}
	var released sql.NullBool
	if err := conn.QueryRowContext(ctx, q, name).Scan(&released); err != nil || !released.Valid || !released.Bool {
		conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}
