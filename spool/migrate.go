package spool

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations are applied in order; the schema version (PRAGMA user_version)
// is the number applied. Never edit a released entry: append a new one.
var migrations = []string{
	// 1: jobs and the reports outbox.
	`CREATE TABLE jobs (
		seq          INTEGER PRIMARY KEY AUTOINCREMENT,
		job_id       TEXT NOT NULL UNIQUE,
		state        TEXT NOT NULL,
		phase        TEXT NOT NULL DEFAULT '',
		progress     INTEGER NOT NULL DEFAULT 0,
		request      BLOB,
		attempts     INTEGER NOT NULL DEFAULT 0,
		error        TEXT NOT NULL DEFAULT '',
		result       BLOB,
		created_at   INTEGER NOT NULL,
		updated_at   INTEGER NOT NULL,
		started_at   INTEGER,
		finished_at  INTEGER
	);
	CREATE INDEX jobs_state ON jobs(state, seq);
	CREATE TABLE reports (
		id           INTEGER PRIMARY KEY AUTOINCREMENT,
		job_id       TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
		kind         TEXT NOT NULL,
		terminal     INTEGER NOT NULL,
		body         BLOB NOT NULL,
		attempts     INTEGER NOT NULL DEFAULT 0,
		next_attempt INTEGER NOT NULL,
		last_error   TEXT NOT NULL DEFAULT '',
		created_at   INTEGER NOT NULL
	);
	CREATE INDEX reports_job ON reports(job_id, id);`,

	// 2: the template fingerprint on jobs, and published artifacts.
	`ALTER TABLE jobs ADD COLUMN fingerprint TEXT NOT NULL DEFAULT '';
	ALTER TABLE jobs ADD COLUMN artifact_id TEXT NOT NULL DEFAULT '';
	CREATE TABLE artifacts (
		artifact_id  TEXT PRIMARY KEY,
		fingerprint  TEXT NOT NULL UNIQUE,
		path         TEXT NOT NULL,
		sha256       TEXT NOT NULL,
		size         INTEGER NOT NULL,
		mtime_ns     INTEGER NOT NULL,
		result       BLOB,
		created_at   INTEGER NOT NULL
	);`,

	// 3: whether a job's request holds credentials (the WAL is scrubbed
	// when such a job ends). Rows of older releases may: assume they do.
	`ALTER TABLE jobs ADD COLUMN secret INTEGER NOT NULL DEFAULT 1;`,

	// 4: when the last BUILT report naming an artifact left the outbox
	// (Unix ms; NULL: none yet). Artifacts of older releases count from
	// the upgrade: their delivery time is unknown.
	`ALTER TABLE artifacts ADD COLUMN delivered_at INTEGER;
	UPDATE artifacts SET delivered_at = CAST(strftime('%s', 'now') AS INTEGER) * 1000;`,

	// 5: the W3C trace context of each job, so that every run of it and
	// every report about it joins one trace, and of each report, whose
	// callback carries it. Rows of older releases have none: their next
	// run starts a trace.
	`ALTER TABLE jobs ADD COLUMN trace_parent TEXT NOT NULL DEFAULT '';
	ALTER TABLE jobs ADD COLUMN trace_state TEXT NOT NULL DEFAULT '';
	ALTER TABLE reports ADD COLUMN trace_parent TEXT NOT NULL DEFAULT '';
	ALTER TABLE reports ADD COLUMN trace_state TEXT NOT NULL DEFAULT '';`,
}

// version reads the schema version of the open database.
func (s *Spool) version(ctx context.Context) (int, error) {
	var v int
	if err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return 0, fmt.Errorf("read spool schema version: %w", err)
	}
	return v, nil
}

// migrate brings the schema up to version target, one transaction per step.
func (s *Spool) migrate(ctx context.Context, target int) error {
	v, err := s.version(ctx)
	if err != nil {
		return err
	}
	if v > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this binary knows (%d): refusing to touch it", v, len(migrations))
	}
	for ; v < target; v++ {
		step := migrations[v]
		err := s.durableTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, step); err != nil {
				return fmt.Errorf("apply migration %d: %w", v+1, err)
			}
			// PRAGMA takes no bound parameters.
			if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
				return fmt.Errorf("record schema version %d: %w", v+1, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
