package spool

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Artifact is a template image this node published.
type Artifact struct {
	ID          string
	Fingerprint string
	Path        string
	SHA256      string
	Size        int64
	// ModTime is the file's modification time when it was recorded; a
	// matching size and time let a reuse skip re-hashing the file.
	ModTime time.Time
	// Result holds the BUILT report fields describing the artifact.
	Result    []byte
	CreatedAt time.Time
	// DeliveredAt is when the last BUILT report naming the artifact left
	// the outbox; zero while none has.
	DeliveredAt time.Time
}

// artifactColumns are the columns scanArtifact reads.
const artifactColumns = "artifact_id, fingerprint, path, sha256, size, mtime_ns, result, created_at, delivered_at"

// scanArtifact reads a row of artifactColumns.
func scanArtifact(row interface{ Scan(...any) error }) (Artifact, error) {
	var a Artifact
	var mtime, created int64
	var delivered sql.NullInt64
	if err := row.Scan(&a.ID, &a.Fingerprint, &a.Path, &a.SHA256, &a.Size, &mtime, &a.Result, &created, &delivered); err != nil {
		return Artifact{}, err
	}
	a.ModTime, a.CreatedAt = time.Unix(0, mtime), time.UnixMilli(created)
	if delivered.Valid {
		a.DeliveredAt = time.UnixMilli(delivered.Int64)
	}
	return a, nil
}

// PutArtifact records (or replaces) a published artifact.
func (s *Spool) PutArtifact(ctx context.Context, a Artifact) error {
	_, err := s.exec(ctx, `INSERT INTO artifacts (artifact_id, fingerprint, path, sha256, size, mtime_ns, result, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(artifact_id) DO UPDATE SET fingerprint = excluded.fingerprint, path = excluded.path,
			sha256 = excluded.sha256, size = excluded.size, mtime_ns = excluded.mtime_ns, result = excluded.result`,
		a.ID, a.Fingerprint, a.Path, a.SHA256, a.Size, a.ModTime.UnixNano(), a.Result, s.nowMS())
	if err != nil {
		return fmt.Errorf("record artifact %s: %w", a.ID, err)
	}
	return nil
}

// ArtifactByFingerprint returns the artifact published for a fingerprint,
// or ErrNotFound.
func (s *Spool) ArtifactByFingerprint(ctx context.Context, fingerprint string) (Artifact, error) {
	a, err := scanArtifact(s.db.QueryRowContext(ctx, "SELECT "+artifactColumns+" FROM artifacts WHERE fingerprint = ?", fingerprint))
	if errors.Is(err, sql.ErrNoRows) {
		return Artifact{}, fmt.Errorf("artifact for fingerprint %s: %w", fingerprint, ErrNotFound)
	}
	if err != nil {
		return Artifact{}, fmt.Errorf("read artifact for fingerprint %s: %w", fingerprint, err)
	}
	return a, nil
}

// DeleteArtifact forgets an artifact. Forgetting an unknown one is not an
// error.
func (s *Spool) DeleteArtifact(ctx context.Context, id string) error {
	if _, err := s.exec(ctx, "DELETE FROM artifacts WHERE artifact_id = ?", id); err != nil {
		return fmt.Errorf("forget artifact %s: %w", id, err)
	}
	return nil
}

// DeliveredArtifacts lists up to limit recorded artifacts whose last BUILT
// report left the outbox before cutoff, in artifact id order from after
// (exclusive; "" for the first page).
func (s *Spool) DeliveredArtifacts(ctx context.Context, cutoff time.Time, after string, limit int) ([]Artifact, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT "+artifactColumns+` FROM artifacts
		WHERE delivered_at IS NOT NULL AND delivered_at < ? AND artifact_id > ? ORDER BY artifact_id LIMIT ?`,
		cutoff.UnixMilli(), after, limit)
	if err != nil {
		return nil, fmt.Errorf("list delivered artifacts: %w", err)
	}
	defer rows.Close()
	var out []Artifact
	for rows.Next() {
		a, err := scanArtifact(rows)
		if err != nil {
			return nil, fmt.Errorf("list delivered artifacts: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list delivered artifacts: %w", err)
	}
	return out, nil
}

// ArtifactPending reports whether a job of artifact id is unfinished or
// still has reports to deliver: until its BUILT report is delivered,
// CubeMaster has not registered the artifact.
func (s *Spool) ArtifactPending(ctx context.Context, id string) (bool, error) {
	var pending bool
	err := s.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM jobs j WHERE j.artifact_id = ? AND
		(j.state NOT IN (?, ?) OR EXISTS (SELECT 1 FROM reports r WHERE r.job_id = j.job_id)))`,
		id, StateBuilt, StateFailed).Scan(&pending)
	if err != nil {
		return false, fmt.Errorf("check jobs of artifact %s: %w", id, err)
	}
	return pending, nil
}
