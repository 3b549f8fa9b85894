package spool

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	// The cgo SQLite driver registers itself as "sqlite3" (a stub that
	// fails every connection without cgo: see haveCgo).
	_ "github.com/mattn/go-sqlite3"
)

// Sentinel errors callers branch on.
var (
	// ErrNotFound means no row has the requested key.
	ErrNotFound = errors.New("not found")
	// ErrJobExists means a job with the same id is already in the spool.
	ErrJobExists = errors.New("job already exists")
	// ErrQueueFull means the bounded queue of waiting jobs has no room.
	ErrQueueFull = errors.New("queue is full")
	// ErrFinished means the job already reached a terminal state, so it
	// takes no further state change or report.
	ErrFinished = errors.New("job already finished")
	// ErrCorrupt means the database file failed its integrity check.
	ErrCorrupt = errors.New("spool is corrupt")
	// ErrNoCgo means the binary was built without cgo and so has no
	// SQLite driver: a build problem, not the spool's.
	ErrNoCgo = errors.New("built without cgo, which the SQLite spool needs")
	// ErrCannotWrite means the spool's storage refused a write (disk
	// full, I/O error, read-only): nothing was committed, and the same
	// write may succeed once the operator fixes the volume.
	ErrCannotWrite = errors.New("spool storage cannot take writes")
)

// Spool is an open spool database. It is safe for concurrent use.
//
// Two connection pools share the file. durable (synchronous=FULL) carries
// the commits a caller promises to someone: a job accepted (the HTTP 200),
// a job ended with its terminal report; each waits for the WAL to reach the
// disk. db (synchronous=NORMAL) carries everything else (claims, progress,
// delivered reports, artifacts): those commits survive a crash of the
// process but may be lost with a power cut, after which the job is
// resumed or the report re-sent, both of which the design allows. The
// next durable commit makes them durable too, since it syncs the whole WAL
// before it. Skipping their fsyncs keeps a dozen disk flushes off every
// job's path to its terminal report.
//
// Every write of the process, in either pool, first takes the spool's
// write turn (writing): SQLite hands its write lock from one connection to
// another by polling, its busy handler sleeping 1, 2, 5, 10, 15 ms and
// more between tries, which put tens of milliseconds between a job's steps
// whenever the reporter's commits met the build's; a channel hands the
// turn over at once.
type Spool struct {
	db       *sql.DB
	durable  *sql.DB
	path     string
	readOnly bool
	now      func() time.Time
	// writing holds a token while a writer of this process holds (or is
	// about to take) SQLite's write lock.
	writing chan struct{}
	// scrubOwed is set while a finished job's credentials may remain in
	// old WAL frames: a checkpoint could not empty the WAL.
	scrubOwed atomic.Bool
}

// Open opens (creating it if needed) the spool at path, migrates its schema
// to the current version and checks its integrity. A file that is not a
// readable spool is left untouched and reported as an error.
func Open(ctx context.Context, path string) (*Spool, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create spool directory: %w", err)
	}
	// SQLite creates the -wal and -shm files with the mode of the database
	// file, so the database must be private before SQLite first opens it:
	// the spool holds registry credentials until a job ends.
	if err := restrict(path); err != nil {
		return nil, err
	}
	s, err := open(ctx, path, false, busyTimeout)
	if err != nil {
		return nil, err
	}
	if err := s.migrate(ctx, len(migrations)); err != nil {
		s.Close()
		return nil, fmt.Errorf("migrate spool %s: %w", path, err)
	}
	for _, f := range []string{path + "-wal", path + "-shm"} {
		if err := os.Chmod(f, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.Close()
			return nil, fmt.Errorf("restrict spool permissions: %w", err)
		}
	}
	// A previous process may have ended between a job with credentials
	// finishing and the WAL being emptied.
	s.scrubOwed.Store(true)
	s.scrubIfOwed(ctx)
	return s, nil
}

// restrict creates the database file mode 0600 if it is missing, and sets
// 0600 on one left by an older release.
func restrict(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("create spool %s: %w", path, err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("restrict spool permissions: %w", err)
	}
	return f.Close()
}

// OpenReadOnly opens an existing spool for reading only, for inspection
// while an agent may be running on it. It never migrates or writes.
func OpenReadOnly(ctx context.Context, path string) (*Spool, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("open spool: %w", err)
	}
	s, err := open(ctx, path, true, busyTimeout)
	if err != nil {
		return nil, err
	}
	v, err := s.version(ctx)
	if err != nil {
		s.Close()
		return nil, err
	}
	if v != len(migrations) {
		s.Close()
		return nil, fmt.Errorf("spool %s has schema version %d, this binary reads version %d", path, v, len(migrations))
	}
	return s, nil
}

// dsn is the driver's name for the database at path. synchronous is
// SQLite's setting for the pool's commits (ignored read-only); busy is how
// long a statement waits for a lock another connection holds.
func dsn(path string, readOnly bool, synchronous string, busy time.Duration) string {
	q := url.Values{}
	q.Set("_busy_timeout", strconv.FormatInt(busy.Milliseconds(), 10))
	q.Set("_foreign_keys", "on")
	if readOnly {
		q.Set("mode", "ro")
	} else {
		q.Set("_journal_mode", "WAL")
		q.Set("_synchronous", synchronous)
		q.Set("_txlock", "immediate")
		// Deleted and overwritten content (a finished job's request, with
		// its registry password) is zeroed in the file, not left in free
		// pages.
		q.Set("_secure_delete", "on")
	}
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// busyTimeout bounds a statement's wait for a lock held by another
// process (an inspection, a backup): within the process, writes take
// their turn on Spool.writing first.
const busyTimeout = 10 * time.Second

func open(ctx context.Context, path string, readOnly bool, busy time.Duration) (*Spool, error) {
	if !haveCgo {
		// The spool is fine; the binary is not. Say so before the
		// driver's stub answers with an error that looks like the file's.
		return nil, fmt.Errorf("open spool %s: %w: this binary was built with CGO_ENABLED=0; rebuild it with cgo "+
			"(make build, or install the deb or rpm). The spool was not touched and keeps its queued jobs", path, ErrNoCgo)
	}
	// NORMAL in WAL mode: a commit is written to the WAL, not synced.
	db, err := sql.Open("sqlite3", dsn(path, readOnly, "NORMAL", busy))
	if err != nil {
		return nil, fmt.Errorf("open spool %s: %w", path, err)
	}
	db.SetMaxOpenConns(4)
	s := &Spool{db: db, durable: db, path: path, readOnly: readOnly, now: time.Now, writing: make(chan struct{}, 1)}
	if !readOnly {
		// FULL makes a commit durable across power loss, not only a
		// crash: a 200 to CubeMaster promises the job is on disk.
		if s.durable, err = sql.Open("sqlite3", dsn(path, false, "FULL", busy)); err != nil {
			db.Close()
			return nil, fmt.Errorf("open spool %s: %w", path, err)
		}
		s.durable.SetMaxOpenConns(2)
	}
	if err := s.check(ctx, readOnly); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// check verifies the file is a healthy SQLite database in WAL mode.
func (s *Spool) check(ctx context.Context, readOnly bool) error {
	var result string
	if err := s.db.QueryRowContext(ctx, "PRAGMA quick_check").Scan(&result); err != nil {
		// No advice to move the file: the cause may be outside it (its
		// directory's permissions, a lock, the build), and the file holds
		// queued jobs and undelivered reports.
		return fmt.Errorf("open spool %s: %w (the file was left in place)", s.path, classify(err))
	}
	if result != "ok" {
		return fmt.Errorf("open spool %s: %w: %s (the file was left in place)", s.path, ErrCorrupt, result)
	}
	if readOnly {
		return nil
	}
	for _, db := range []*sql.DB{s.db, s.durable} {
		var mode string
		if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
			return fmt.Errorf("read spool journal mode: %w", err)
		}
		if !strings.EqualFold(mode, "wal") {
			return fmt.Errorf("open spool %s: journal_mode is %q, want wal", s.path, mode)
		}
	}
	return nil
}

// classify marks the driver's "not a database" family as corruption.
func classify(err error) error {
	msg := err.Error()
	if strings.Contains(msg, "not a database") || strings.Contains(msg, "malformed") {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return err
}

// Path is the database file the spool was opened from.
func (s *Spool) Path() string { return s.path }

// Close closes the database.
func (s *Spool) Close() error {
	err := s.db.Close()
	if s.durable != s.db {
		err = errors.Join(err, s.durable.Close())
	}
	if err != nil {
		return fmt.Errorf("close spool: %w", err)
	}
	return nil
}

// Ping proves the spool answers within ctx: it takes the write lock (a
// read-only spool only reads), so a database wedged by a stuck writer fails.
func (s *Spool) Ping(ctx context.Context) error {
	var n int
	if s.readOnly {
		if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE state = ?", StateRunning).Scan(&n); err != nil {
			return fmt.Errorf("ping spool: %w", err)
		}
		return nil
	}
	done, err := s.takeTurn(ctx)
	if err != nil {
		return fmt.Errorf("ping spool: %w", err)
	}
	defer done()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ping spool: %w", err)
	}
	defer tx.Rollback()
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE state = ?", StateRunning).Scan(&n); err != nil {
		return fmt.Errorf("ping spool: %w", err)
	}
	return nil
}

// takeTurn waits for the process's write turn (see Spool); done gives it
// back.
func (s *Spool) takeTurn(ctx context.Context) (done func(), err error) {
	select {
	case s.writing <- struct{}{}:
		return func() { <-s.writing }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for the spool's write turn: %w", ctx.Err())
	}
}

// exec runs one writing statement on its own, without waiting for the
// disk, in the write turn.
func (s *Spool) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	done, err := s.takeTurn(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return s.db.ExecContext(ctx, query, args...)
}

// tx runs fn in a transaction, committing when it returns nil, without
// waiting for the disk (see Spool).
func (s *Spool) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	return s.txOn(ctx, s.db, fn)
}

// durableTx is tx for a commit that must survive a power cut before it
// returns.
func (s *Spool) durableTx(ctx context.Context, fn func(*sql.Tx) error) error {
	return s.txOn(ctx, s.durable, fn)
}

func (s *Spool) txOn(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	done, err := s.takeTurn(ctx)
	if err != nil {
		return storageError(err)
	}
	defer done()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return storageError(fmt.Errorf("begin transaction: %w", err))
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return storageError(err)
	}
	if err := tx.Commit(); err != nil {
		return storageError(fmt.Errorf("commit transaction: %w", err))
	}
	return nil
}

func (s *Spool) nowMS() int64 { return s.now().UnixMilli() }

func fromMS(ms sql.NullInt64) time.Time {
	if !ms.Valid || ms.Int64 == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms.Int64)
}
