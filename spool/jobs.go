package spool

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// State is where a job is in its life.
type State string

// Job states. Built and Failed are terminal.
const (
	StateQueued  State = "queued"
	StateRunning State = "running"
	StateBuilt   State = "built"
	StateFailed  State = "failed"
)

// Terminal reports whether the state is final.
func (s State) Terminal() bool { return s == StateBuilt || s == StateFailed }

// Job is one build request and what became of it.
type Job struct {
	Seq      int64
	ID       string
	State    State
	Phase    string
	Progress int
	// Request is the build request as received. It carries registry
	// credentials and the envd binary, so it is cleared when the job ends.
	Request []byte
	// Attempts counts how many times a worker has started the job.
	Attempts    int
	Fingerprint string
	ArtifactID  string
	Error       string
	// Result is the terminal report body, kept to answer re-submissions.
	Result     []byte
	CreatedAt  time.Time
	UpdatedAt  time.Time
	StartedAt  time.Time
	FinishedAt time.Time
	// TraceParent and TraceState are the W3C trace context the job was
	// accepted under; every run of the job continues that trace.
	TraceParent string
	TraceState  string
}

// NewJob is a build request to queue.
type NewJob struct {
	ID      string
	Request []byte
	// Secret tells that Request holds credentials: when the job ends, the
	// WAL is then emptied so no copy of them stays on disk.
	Secret bool
	// TraceParent and TraceState are the W3C trace context to store with
	// the job (empty: none).
	TraceParent string
	TraceState  string
}

const jobColumns = `seq, job_id, state, phase, progress, request, attempts, fingerprint, artifact_id,
	error, result, created_at, updated_at, started_at, finished_at, trace_parent, trace_state`

func scanJob(row interface{ Scan(...any) error }) (Job, error) {
	var j Job
	var created, updated, started, finished sql.NullInt64
	err := row.Scan(&j.Seq, &j.ID, &j.State, &j.Phase, &j.Progress, &j.Request, &j.Attempts,
		&j.Fingerprint, &j.ArtifactID, &j.Error, &j.Result, &created, &updated, &started, &finished,
		&j.TraceParent, &j.TraceState)
	if err != nil {
		return Job{}, err
	}
	j.CreatedAt, j.UpdatedAt = fromMS(created), fromMS(updated)
	j.StartedAt, j.FinishedAt = fromMS(started), fromMS(finished)
	return j, nil
}

// Enqueue commits a new queued job, durably (it survives a power cut once
// Enqueue returns). When the id is already known it returns the existing
// job and ErrJobExists; when maxQueued jobs already wait it returns
// ErrQueueFull. The check and the insert are one transaction.
func (s *Spool) Enqueue(ctx context.Context, nj NewJob, maxQueued int) (Job, error) {
	id := nj.ID
	var out Job
	err := s.durableTx(ctx, func(tx *sql.Tx) error {
		existing, err := scanJob(tx.QueryRowContext(ctx, "SELECT "+jobColumns+" FROM jobs WHERE job_id = ?", id))
		switch {
		case err == nil:
			out = existing
			return ErrJobExists
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("look up job %s: %w", id, err)
		}
		var queued int
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE state = ?", StateQueued).Scan(&queued); err != nil {
			return fmt.Errorf("count queued jobs: %w", err)
		}
		if queued >= maxQueued {
			return ErrQueueFull
		}
		now := s.nowMS()
		if _, err := tx.ExecContext(ctx, `INSERT INTO jobs (job_id, state, request, secret, created_at, updated_at,
			trace_parent, trace_state) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			id, StateQueued, nj.Request, nj.Secret, now, now, nj.TraceParent, nj.TraceState); err != nil {
			return fmt.Errorf("insert job %s: %w", id, err)
		}
		out, err = scanJob(tx.QueryRowContext(ctx, "SELECT "+jobColumns+" FROM jobs WHERE job_id = ?", id))
		if err != nil {
			return fmt.Errorf("read back job %s: %w", id, err)
		}
		return nil
	})
	return out, err
}

// Job returns the job with the given id, or ErrNotFound.
func (s *Spool) Job(ctx context.Context, id string) (Job, error) {
	j, err := scanJob(s.db.QueryRowContext(ctx, "SELECT "+jobColumns+" FROM jobs WHERE job_id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return Job{}, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Job{}, fmt.Errorf("read job %s: %w", id, err)
	}
	return j, nil
}

// JobFilter narrows a job listing. Zero values mean no restriction.
type JobFilter struct {
	State State
	Limit int
}

// Jobs lists jobs, newest first.
func (s *Spool) Jobs(ctx context.Context, f JobFilter) ([]Job, error) {
	query := "SELECT " + jobColumns + " FROM jobs"
	var args []any
	if f.State != "" {
		query += " WHERE state = ?"
		args = append(args, f.State)
	}
	query += " ORDER BY seq DESC"
	if f.Limit > 0 {
		query += " LIMIT ?"
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	defer rows.Close()
	var jobs []Job
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, fmt.Errorf("scan job: %w", err)
		}
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return jobs, nil
}

// ClaimNext moves the oldest queued job to running, counting the attempt.
// It reports false when nothing is queued.
func (s *Spool) ClaimNext(ctx context.Context) (Job, bool, error) {
	var out Job
	found := false
	err := s.tx(ctx, func(tx *sql.Tx) error {
		j, err := scanJob(tx.QueryRowContext(ctx, "SELECT "+jobColumns+" FROM jobs WHERE state = ? ORDER BY seq LIMIT 1", StateQueued))
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("find queued job: %w", err)
		}
		now := s.nowMS()
		if _, err := tx.ExecContext(ctx, `UPDATE jobs SET state = ?, attempts = attempts + 1, started_at = ?, updated_at = ?
			WHERE seq = ?`, StateRunning, now, now, j.Seq); err != nil {
			return fmt.Errorf("claim job %s: %w", j.ID, err)
		}
		j.State, j.Attempts = StateRunning, j.Attempts+1
		j.StartedAt, j.UpdatedAt = time.UnixMilli(now), time.UnixMilli(now)
		out, found = j, true
		return nil
	})
	return out, found, err
}

// Requeue puts a running job back at its place in the queue, for a build
// interrupted by shutdown. It is a no-op for a job in any other state.
func (s *Spool) Requeue(ctx context.Context, id string) error {
	_, err := s.exec(ctx, "UPDATE jobs SET state = ?, updated_at = ? WHERE job_id = ? AND state = ?",
		StateQueued, s.nowMS(), id, StateRunning)
	if err != nil {
		return fmt.Errorf("requeue job %s: %w", id, err)
	}
	return nil
}

// RequeueRunning puts every running job back in the queue: at startup they
// are leftovers of a crash. It returns how many it moved.
func (s *Spool) RequeueRunning(ctx context.Context) (int, error) {
	res, err := s.exec(ctx, "UPDATE jobs SET state = ?, updated_at = ? WHERE state = ?",
		StateQueued, s.nowMS(), StateRunning)
	if err != nil {
		return 0, fmt.Errorf("requeue interrupted jobs: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// SetProgress records a job's phase and progress and, when report is not
// nil, adds it to the outbox in the same transaction. A finished job is left
// as it is, with ErrFinished.
func (s *Spool) SetProgress(ctx context.Context, id, phase string, progress int, report *Report) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "UPDATE jobs SET phase = ?, progress = ?, updated_at = ? WHERE job_id = ? AND state IN (?, ?)",
			phase, progress, s.nowMS(), id, StateQueued, StateRunning)
		if err != nil {
			return fmt.Errorf("update job %s progress: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("update job %s progress: %w", id, inactive(ctx, tx, id))
		}
		if report == nil {
			return nil
		}
		return s.addReport(ctx, tx, id, *report)
	})
}

// SetFingerprint records the template fingerprint and artifact id a job
// resolved to.
func (s *Spool) SetFingerprint(ctx context.Context, id, fingerprint, artifactID string) error {
	_, err := s.exec(ctx, "UPDATE jobs SET fingerprint = ?, artifact_id = ?, updated_at = ? WHERE job_id = ?",
		fingerprint, artifactID, s.nowMS(), id)
	if err != nil {
		return fmt.Errorf("record fingerprint of job %s: %w", id, err)
	}
	return nil
}

// Finish ends a queued or running job in a terminal state and commits its
// terminal report in the same transaction, durably, so the job can never
// end without one, nor with two: a job already finished is left as it is,
// with ErrFinished. The request (with its credentials) is cleared; the
// report body is kept as the result. When the request held credentials
// (Enqueue's secret), the WAL is emptied before Finish returns.
func (s *Spool) Finish(ctx context.Context, id string, state State, phase, errMsg string, report Report) error {
	if !state.Terminal() {
		return fmt.Errorf("finish job %s: state %q is not terminal", id, state)
	}
	report.Terminal = true
	secret := false
	err := s.durableTx(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, "SELECT secret FROM jobs WHERE job_id = ?", id).Scan(&secret); err != nil &&
			!errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("finish job %s: %w", id, err)
		}
		now := s.nowMS()
		res, err := tx.ExecContext(ctx, `UPDATE jobs SET state = ?, phase = ?, progress = 100, error = ?, result = ?,
			request = NULL, finished_at = ?, updated_at = ? WHERE job_id = ? AND state IN (?, ?)`,
			state, phase, errMsg, report.Body, now, now, id, StateQueued, StateRunning)
		if err != nil {
			return fmt.Errorf("finish job %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("finish job %s: %w", id, inactive(ctx, tx, id))
		}
		return s.addReport(ctx, tx, id, report)
	})
	if err != nil {
		return err
	}
	// The scrubbed request still sits in earlier WAL frames; move them into
	// the database (where secure_delete zeroed it) and empty the WAL. A
	// reader holding an old snapshot can keep the WAL from being emptied;
	// the next Finish tries again. The job is finished either way. A
	// request without credentials needs none of it: the checkpoint (a
	// copy of the WAL, two flushes) stays off the path to the report.
	if secret {
		s.scrubOwed.Store(true)
	}
	s.scrubIfOwed(ctx)
	return nil
}

// scrubIfOwed empties the WAL when a finished job's credentials may still
// be in it, and remembers to try again when a reader prevents it.
func (s *Spool) scrubIfOwed(ctx context.Context) {
	if !s.scrubOwed.Swap(false) {
		return
	}
	if ok, err := s.ScrubWAL(ctx); err != nil || !ok {
		s.scrubOwed.Store(true)
	}
}

// inactive explains why a job took no change: ErrFinished when it exists
// (it can only be terminal), ErrNotFound when it does not.
func inactive(ctx context.Context, tx *sql.Tx, id string) error {
	var state State
	err := tx.QueryRowContext(ctx, "SELECT state FROM jobs WHERE job_id = ?", id).Scan(&state)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ErrNotFound
	case err != nil:
		return fmt.Errorf("read job state: %w", err)
	case state.Terminal():
		return fmt.Errorf("%w (%s)", ErrFinished, state)
	default:
		return fmt.Errorf("job is %s", state)
	}
}

// ScrubWAL checkpoints the write-ahead log into the database and truncates
// it, so content deleted from the database (a finished job's request) no
// longer survives in old WAL frames. It reports whether the WAL was
// emptied: false while a reader still holds a snapshot that needs it.
func (s *Spool) ScrubWAL(ctx context.Context) (bool, error) {
	var busy, logFrames, checkpointed int
	done, err := s.takeTurn(ctx)
	if err != nil {
		return false, fmt.Errorf("checkpoint spool WAL: %w", err)
	}
	defer done()
	if err := s.durable.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &logFrames, &checkpointed); err != nil {
		return false, fmt.Errorf("checkpoint spool WAL: %w", err)
	}
	return busy == 0, nil
}

// Resend queues the stored terminal report of a finished job again, for a
// re-submission of a job_id that already ended; durably, as the answer to
// that submission promises the report.
func (s *Spool) Resend(ctx context.Context, id string) error {
	return s.durableTx(ctx, func(tx *sql.Tx) error {
		j, err := scanJob(tx.QueryRowContext(ctx, "SELECT "+jobColumns+" FROM jobs WHERE job_id = ?", id))
		if err != nil {
			return fmt.Errorf("read job %s: %w", id, err)
		}
		if !j.State.Terminal() || len(j.Result) == 0 {
			return fmt.Errorf("resend report of job %s: job is %s", id, j.State)
		}
		var pending int
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM reports WHERE job_id = ? AND terminal = 1", id).Scan(&pending); err != nil {
			return fmt.Errorf("look for pending terminal report of job %s: %w", id, err)
		}
		if pending > 0 {
			return nil // still on its way
		}
		return s.addReport(ctx, tx, id, Report{Kind: KindTerminal, Terminal: true, Body: j.Result})
	})
}

// Counts returns how many jobs wait and how many run.
func (s *Spool) Counts(ctx context.Context) (queued, running int, err error) {
	rows, err := s.db.QueryContext(ctx, "SELECT state, COUNT(*) FROM jobs WHERE state IN (?, ?) GROUP BY state",
		StateQueued, StateRunning)
	if err != nil {
		return 0, 0, fmt.Errorf("count jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var st State
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return 0, 0, fmt.Errorf("count jobs: %w", err)
		}
		if st == StateQueued {
			queued = n
		} else {
			running = n
		}
	}
	return queued, running, rows.Err()
}

// PurgeFinished deletes terminal jobs that finished before cutoff and whose
// reports were all delivered. It returns how many it deleted.
func (s *Spool) PurgeFinished(ctx context.Context, cutoff time.Time) (int, error) {
	res, err := s.exec(ctx, `DELETE FROM jobs WHERE state IN (?, ?) AND finished_at < ?
		AND NOT EXISTS (SELECT 1 FROM reports r WHERE r.job_id = jobs.job_id)`,
		StateBuilt, StateFailed, cutoff.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("purge finished jobs: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
