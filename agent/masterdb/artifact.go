package masterdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Artifact statuses of t_cube_rootfs_artifact.status that TC acts on.
const (
	ArtifactReady          = "READY"
	ArtifactCleanupPending = "CLEANUP_PENDING"
	ArtifactDeleting       = "DELETING"
)

// ErrArtifactNotFound is an artifact (or fingerprint) with no live row.
var ErrArtifactNotFound = errors.New("artifact not found in CubeMaster's database")

// ArtifactRow is what TC reads of a t_cube_rootfs_artifact row.
type ArtifactRow struct {
	ArtifactID      string
	Fingerprint     string
	SourceDigest    string
	Ext4Path        string
	Ext4SHA256      string
	Ext4SizeBytes   int64
	ImageConfigJSON string
	ArtifactURL     string
	// StorageBackend is "" (shared disk only), "s3" or "fs".
	StorageBackend string
	ObjectKey      string
	CABaked        bool
	CAFingerprint  string
	CATargets      int
	Status         string
	LastError      string
}

// StoreBacked reports whether the row's data lives in the blob store.
func (a ArtifactRow) StoreBacked() bool { return a.StorageBackend != "" && a.ObjectKey != "" }

const artifactColumns = "artifact_id, template_spec_fingerprint, source_image_digest, ext4_path, ext4_sha256, " +
	"ext4_size_bytes, image_config_json, artifact_url, storage_backend, object_key, cube_egress_ca_baked, " +
	"cube_egress_ca_fingerprint, cube_egress_ca_targets_written, status, last_error"

// scanArtifact reads one row of artifactColumns.
func scanArtifact(row *sql.Row) (ArtifactRow, error) {
	var a ArtifactRow
	var cfg, url, lastErr sql.NullString
	err := row.Scan(&a.ArtifactID, &a.Fingerprint, &a.SourceDigest, &a.Ext4Path, &a.Ext4SHA256, &a.Ext4SizeBytes,
		&cfg, &url, &a.StorageBackend, &a.ObjectKey, &a.CABaked, &a.CAFingerprint, &a.CATargets, &a.Status, &lastErr)
	a.ImageConfigJSON, a.ArtifactURL, a.LastError = cfg.String, url.String, lastErr.String
	return a, err
}

// ReadyArtifact returns the newest READY row for fingerprint, or
// ErrArtifactNotFound.
func (d *DB) ReadyArtifact(ctx context.Context, fingerprint string) (ArtifactRow, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	a, err := scanArtifact(d.db.QueryRowContext(ctx, d.bind("SELECT "+artifactColumns+" FROM t_cube_rootfs_artifact "+
		"WHERE template_spec_fingerprint = ? AND status = ? AND deleted_at IS NULL ORDER BY created_at DESC LIMIT 1"),
		fingerprint, ArtifactReady))
	switch {
	case errors.Is(err, sql.ErrNoRows), err == nil && a.Fingerprint != fingerprint:
		// MySQL's default collation compares without case: the
		// fingerprint must match exactly, as on PostgreSQL.
		return ArtifactRow{}, fmt.Errorf("READY artifact for %s: %w", fingerprint, ErrArtifactNotFound)
	case err != nil:
		return ArtifactRow{}, d.wrap("read READY artifact for "+fingerprint+" from", err)
	}
	return a, nil
}

// Artifact returns the live row of artifactID, whatever its status, or
// ErrArtifactNotFound.
func (d *DB) Artifact(ctx context.Context, artifactID string) (ArtifactRow, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	a, err := scanArtifact(d.db.QueryRowContext(ctx, d.bind("SELECT "+artifactColumns+" FROM t_cube_rootfs_artifact "+
		"WHERE artifact_id = ? AND deleted_at IS NULL"), artifactID))
	switch {
	case errors.Is(err, sql.ErrNoRows), err == nil && a.ArtifactID != artifactID:
		return ArtifactRow{}, fmt.Errorf("artifact %s: %w", artifactID, ErrArtifactNotFound)
	case err != nil:
		return ArtifactRow{}, d.wrap("read artifact "+artifactID+" from", err)
	}
	return a, nil
}

// ClaimArtifact marks artifactID's row DELETING when it is waiting for
// deletion (CLEANUP_PENDING, DELETING, FAILED or ORPHANED) and returns it.
// claimed is false when there was no such row: the row is gone, or has
// another status (returned in row, ErrArtifactNotFound when gone). A claim
// of a row already DELETING succeeds: its deleter may have died, and every
// data step is idempotent.
func (d *DB) ClaimArtifact(ctx context.Context, artifactID string) (row ArtifactRow, claimed bool, err error) {
	qctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	res, err := d.db.ExecContext(qctx, d.bind("UPDATE t_cube_rootfs_artifact SET status = ?, updated_at = "+d.now()+
		" WHERE artifact_id = ? AND status IN ('CLEANUP_PENDING', 'DELETING', 'FAILED', 'ORPHANED') AND deleted_at IS NULL"),
		ArtifactDeleting, artifactID)
	if err != nil {
		return ArtifactRow{}, false, d.wrap("claim artifact "+artifactID+" in", err)
	}
	// Rows matched, not changed, on MySQL too (ClientFoundRows).
	n, err := res.RowsAffected()
	if err != nil {
		return ArtifactRow{}, false, d.wrap("claim artifact "+artifactID+" in", err)
	}
	row, err = d.Artifact(ctx, artifactID)
	if err != nil {
		return ArtifactRow{}, false, err
	}
	return row, n > 0 && row.Status == ArtifactDeleting, nil
}

// DeleteClaimed hard-deletes artifactID's row once its data is gone; only a
// row still DELETING is removed.
func (d *DB) DeleteClaimed(ctx context.Context, artifactID string) error {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	if _, err := d.db.ExecContext(ctx, d.bind("DELETE FROM t_cube_rootfs_artifact WHERE artifact_id = ? AND status = ?"),
		artifactID, ArtifactDeleting); err != nil {
		return d.wrap("delete artifact row "+artifactID+" from", err)
	}
	return nil
}

// ReleaseClaim puts a claimed row back to CLEANUP_PENDING with lastError,
// after a data step failed, so a later delete or sweep retries it.
func (d *DB) ReleaseClaim(ctx context.Context, artifactID, lastError string) error {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	if _, err := d.db.ExecContext(ctx, d.bind("UPDATE t_cube_rootfs_artifact SET status = ?, last_error = ?, updated_at = "+
		d.now()+" WHERE artifact_id = ? AND status = ?"), ArtifactCleanupPending, lastError, artifactID, ArtifactDeleting); err != nil {
		return d.wrap("release claim on artifact "+artifactID+" in", err)
	}
	return nil
}

// StaleCleanups returns up to limit artifact ids whose rows have been
// CLEANUP_PENDING, untouched, for longer than age, by the database's clock,
// oldest first.
func (d *DB) StaleCleanups(ctx context.Context, age time.Duration, limit int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	ms := strconv.FormatInt(age.Milliseconds(), 10)
	cutoff := "NOW(3) - INTERVAL " + ms + "000 MICROSECOND"
	if d.driver == DriverPostgres {
		cutoff = "now() - interval '" + ms + " milliseconds'"
	}
	rows, err := d.db.QueryContext(ctx, d.bind("SELECT artifact_id FROM t_cube_rootfs_artifact WHERE status = ? "+
		"AND deleted_at IS NULL AND updated_at < "+cutoff+" ORDER BY updated_at LIMIT "+strconv.Itoa(limit)), ArtifactCleanupPending)
	if err != nil {
		return nil, d.wrap("list CLEANUP_PENDING artifacts in", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, d.wrap("list CLEANUP_PENDING artifacts in", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrap("list CLEANUP_PENDING artifacts in", err)
	}
	return ids, nil
}

// now is the database's current time, at the columns' precision.
func (d *DB) now() string {
	if d.driver == DriverPostgres {
		return "now()"
	}
	return "NOW(3)"
}

// bind turns ? placeholders into PostgreSQL's $n; queries hold no literal
// question marks.
func (d *DB) bind(q string) string {
	if d.driver != DriverPostgres {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
