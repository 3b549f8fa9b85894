package spool

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Report kinds. An undelivered non-terminal report is superseded by a
// newer one of its kind for its job, except that a phase report never is
// and a heartbeat supersedes only the heartbeats of its phase: every change
// of phase reaches CubeMaster, in order, however far delivery lags.
const (
	// KindPhase is a change of phase; never superseded.
	KindPhase = "phase"
	// KindStatus is a heartbeat within a phase: it supersedes the job's
	// undelivered heartbeats queued after its latest phase report, which
	// are the ones of the same phase (earlier ones come before that report
	// and are delivered first).
	KindStatus      = "status"
	KindFingerprint = "fingerprint"
	KindPull        = "pull"
	KindTerminal    = "terminal"
)

// Report is one status callback waiting in the outbox.
type Report struct {
	ID       int64
	JobID    string
	Kind     string
	Terminal bool
	// Body is the JSON object POSTed to CubeMaster.
	Body        []byte
	Attempts    int
	NextAttempt time.Time
	LastError   string
	CreatedAt   time.Time
	// TraceParent and TraceState are the W3C trace context the callback
	// continues. Empty when added, they are the job's.
	TraceParent string
	TraceState  string
}

const reportColumns = "id, job_id, kind, terminal, body, attempts, next_attempt, last_error, created_at, trace_parent, trace_state"

func scanReport(row interface{ Scan(...any) error }) (Report, error) {
	var r Report
	var next, created sql.NullInt64
	if err := row.Scan(&r.ID, &r.JobID, &r.Kind, &r.Terminal, &r.Body, &r.Attempts, &next, &r.LastError, &created,
		&r.TraceParent, &r.TraceState); err != nil {
		return Report{}, err
	}
	r.NextAttempt, r.CreatedAt = fromMS(next), fromMS(created)
	return r, nil
}

// AddReport puts a report for job id in the outbox. A finished job takes no
// more reports: ErrFinished.
func (s *Spool) AddReport(ctx context.Context, id string, r Report) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var state State
		err := tx.QueryRowContext(ctx, "SELECT state FROM jobs WHERE job_id = ?", id).Scan(&state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("add report for job %s: %w", id, ErrNotFound)
		case err != nil:
			return fmt.Errorf("add report for job %s: read job state: %w", id, err)
		case state.Terminal():
			return fmt.Errorf("add report for job %s: %w (%s)", id, ErrFinished, state)
		}
		return s.addReport(ctx, tx, id, r)
	})
}

func (s *Spool) addReport(ctx context.Context, tx *sql.Tx, id string, r Report) error {
	if r.Kind == "" {
		return fmt.Errorf("add report for job %s: empty kind", id)
	}
	if !r.Terminal && r.Kind != KindPhase {
		if _, err := tx.ExecContext(ctx, `DELETE FROM reports WHERE job_id = ? AND kind = ? AND terminal = 0
			AND (kind <> ? OR id > COALESCE((SELECT MAX(id) FROM reports WHERE job_id = ? AND kind = ?), 0))`,
			id, r.Kind, KindStatus, id, KindPhase); err != nil {
			return fmt.Errorf("coalesce %s reports of job %s: %w", r.Kind, id, err)
		}
	}
	now := s.nowMS()
	// A report without a trace context of its own takes the job's.
	if _, err := tx.ExecContext(ctx, `INSERT INTO reports (job_id, kind, terminal, body, next_attempt, created_at,
		trace_parent, trace_state)
		SELECT ?, ?, ?, ?, ?, ?, CASE WHEN ? = '' THEN COALESCE(j.trace_parent, '') ELSE ? END,
			CASE WHEN ? = '' THEN COALESCE(j.trace_state, '') ELSE ? END
		FROM (SELECT 1) LEFT JOIN jobs j ON j.job_id = ?`,
		id, r.Kind, r.Terminal, r.Body, now, now, r.TraceParent, r.TraceParent, r.TraceParent, r.TraceState, id); err != nil {
		return fmt.Errorf("add %s report for job %s: %w", r.Kind, id, err)
	}
	return nil
}

// heads selects the oldest report of every job: reports of one job are
// delivered strictly in order.
const heads = "SELECT MIN(id) FROM reports GROUP BY job_id"

// DueReports returns up to limit reports that head their job's queue and
// whose next attempt is due at now.
func (s *Spool) DueReports(ctx context.Context, now time.Time, limit int) ([]Report, error) {
	return s.queryReports(ctx, "list due reports", "SELECT "+reportColumns+" FROM reports WHERE id IN ("+heads+
		") AND next_attempt <= ? ORDER BY next_attempt, id LIMIT ?", now.UnixMilli(), limit)
}

// DueReportOf returns the oldest report of job id when it is due at now;
// false when the job has none or its head waits for a later attempt.
func (s *Spool) DueReportOf(ctx context.Context, id string, now time.Time) (Report, bool, error) {
	r, err := scanReport(s.db.QueryRowContext(ctx, "SELECT "+reportColumns+" FROM reports WHERE job_id = ? ORDER BY id LIMIT 1", id))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Report{}, false, nil
	case err != nil:
		return Report{}, false, fmt.Errorf("read next report of job %s: %w", id, err)
	}
	return r, r.NextAttempt.UnixMilli() <= now.UnixMilli(), nil
}

// queryReports runs a query selecting reportColumns.
func (s *Spool) queryReports(ctx context.Context, op, query string, args ...any) ([]Report, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer rows.Close()
	var out []Report
	for rows.Next() {
		r, err := scanReport(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: scan report: %w", op, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// NextDue returns when the earliest pending report becomes due; false when
// the outbox is empty.
func (s *Spool) NextDue(ctx context.Context) (time.Time, bool, error) {
	var next sql.NullInt64
	err := s.db.QueryRowContext(ctx, "SELECT MIN(next_attempt) FROM reports WHERE id IN ("+heads+")").Scan(&next)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("find next due report: %w", err)
	}
	if !next.Valid {
		return time.Time{}, false, nil
	}
	return time.UnixMilli(next.Int64), true, nil
}

// Reports lists the outbox in delivery order, optionally for one job.
func (s *Spool) Reports(ctx context.Context, jobID string) ([]Report, error) {
	if jobID == "" {
		return s.queryReports(ctx, "list reports", "SELECT "+reportColumns+" FROM reports ORDER BY id")
	}
	return s.queryReports(ctx, "list reports", "SELECT "+reportColumns+" FROM reports WHERE job_id = ? ORDER BY id", jobID)
}

// RemoveReport deletes a report that was delivered or is given up on. A
// report already superseded is not an error. When it is a BUILT job's
// terminal report, its artifact's delivery time (Artifact.DeliveredAt) is
// set: from then on CubeMaster may register the artifact.
func (s *Spool) RemoveReport(ctx context.Context, id int64) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE artifacts SET delivered_at = ? WHERE artifact_id = (
			SELECT j.artifact_id FROM reports r JOIN jobs j ON j.job_id = r.job_id
			WHERE r.id = ? AND r.terminal = 1 AND j.state = ? AND j.artifact_id <> '')`, s.nowMS(), id, StateBuilt); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "DELETE FROM reports WHERE id = ?", id)
		return err
	})
	if err != nil {
		return fmt.Errorf("remove report %d: %w", id, err)
	}
	return nil
}

// RetryReport records a failed delivery attempt and when to try again.
func (s *Spool) RetryReport(ctx context.Context, id int64, next time.Time, lastErr string) error {
	if _, err := s.exec(ctx, "UPDATE reports SET attempts = attempts + 1, next_attempt = ?, last_error = ? WHERE id = ?",
		next.UnixMilli(), lastErr, id); err != nil {
		return fmt.Errorf("reschedule report %d: %w", id, err)
	}
	return nil
}

// OldestReport returns when the oldest report not yet delivered was
// queued; ok is false when the outbox is empty.
func (s *Spool) OldestReport(ctx context.Context) (at time.Time, ok bool, err error) {
	var ms sql.NullInt64
	if err := s.db.QueryRowContext(ctx, "SELECT MIN(created_at) FROM reports").Scan(&ms); err != nil {
		return time.Time{}, false, fmt.Errorf("read the outbox's oldest report: %w", err)
	}
	if !ms.Valid {
		return time.Time{}, false, nil
	}
	return time.UnixMilli(ms.Int64), true, nil
}

// OutboxDepth counts the reports not yet delivered.
func (s *Spool) OutboxDepth(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM reports").Scan(&n); err != nil {
		return 0, fmt.Errorf("count outbox: %w", err)
	}
	return n, nil
}
