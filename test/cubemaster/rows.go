package cubemaster

import (
	"context"
	"fmt"
	"time"
)

// ArtifactRow is a t_cube_rootfs_artifact row, for test assertions.
type ArtifactRow struct {
	ArtifactID        string
	Fingerprint       string
	Status            string
	SourceImageRef    string
	SourceImageDigest string
	MasterNodeIP      string
	Ext4Path          string
	Ext4SHA256        string
	Ext4SizeBytes     int64
	ImageConfigJSON   string
	WritableLayerSize string
	DownloadToken     string
	ArtifactURL       string
	StorageBackend    string
	ObjectKey         string
	CABaked           bool
	CAFingerprint     string
	CATargets         int
	LastError         string
	// GCDeadline is zero when NULL.
	GCDeadline time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// JobRow is a t_cube_template_image_job row, for test assertions.
type JobRow struct {
	JobID             string
	Status            string
	Phase             string
	Progress          int
	ArtifactID        string
	ArtifactStatus    string
	Fingerprint       string
	SourceImageDigest string
	ErrorMessage      string
	RequestJSON       string
	ResultJSON        string
	CreatedAt         time.Time
	UpdatedAt         time.Time
}

// dbText scans a nullable text column; NULL is "".
type dbText string

// Scan implements sql.Scanner.
func (t *dbText) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		*t = ""
	case string:
		*t = dbText(x)
	case []byte:
		*t = dbText(x)
	default:
		return fmt.Errorf("scan text: unexpected %T", v)
	}
	return nil
}

// dbTime scans a nullable timestamp column, whether the driver hands it
// over as time.Time or as MySQL's text; NULL is the zero time.
type dbTime time.Time

// Scan implements sql.Scanner.
func (t *dbTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		*t = dbTime{}
		return nil
	case time.Time:
		*t = dbTime(x)
		return nil
	case []byte:
		v = string(x)
	}
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("scan time: unexpected %T", v)
	}
	p, err := time.Parse("2006-01-02 15:04:05.999999", s)
	if err != nil {
		return fmt.Errorf("scan time: %w", err)
	}
	*t = dbTime(p)
	return nil
}

// ArtifactRows returns every artifact row that is not soft-deleted, in
// insertion order.
func (s *Server) ArtifactRows(ctx context.Context) ([]ArtifactRow, error) {
	st, err := s.store()
	if err != nil {
		return nil, err
	}
	rows, err := st.db.QueryContext(ctx, `SELECT artifact_id, template_spec_fingerprint, status, source_image_ref,
		source_image_digest, master_node_ip, ext4_path, ext4_sha256, ext4_size_bytes, image_config_json,
		writable_layer_size, download_token, artifact_url, storage_backend, object_key, cube_egress_ca_baked,
		cube_egress_ca_fingerprint, cube_egress_ca_targets_written, last_error, gc_deadline, created_at, updated_at
		FROM `+artifactTable+` WHERE deleted_at IS NULL ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("read artifact rows: %w", err)
	}
	defer rows.Close()
	var out []ArtifactRow
	for rows.Next() {
		var a ArtifactRow
		var imageConfig, artifactURL, lastError dbText
		var gc, created, updated dbTime
		if err := rows.Scan(&a.ArtifactID, &a.Fingerprint, &a.Status, &a.SourceImageRef, &a.SourceImageDigest,
			&a.MasterNodeIP, &a.Ext4Path, &a.Ext4SHA256, &a.Ext4SizeBytes, &imageConfig, &a.WritableLayerSize,
			&a.DownloadToken, &artifactURL, &a.StorageBackend, &a.ObjectKey, &a.CABaked, &a.CAFingerprint,
			&a.CATargets, &lastError, &gc, &created, &updated); err != nil {
			return nil, fmt.Errorf("read artifact rows: %w", err)
		}
		a.ImageConfigJSON, a.ArtifactURL, a.LastError = string(imageConfig), string(artifactURL), string(lastError)
		a.GCDeadline, a.CreatedAt, a.UpdatedAt = time.Time(gc), time.Time(created), time.Time(updated)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read artifact rows: %w", err)
	}
	return out, nil
}

// JobRow returns the job row of jobID; an error wrapping sql.ErrNoRows
// when there is none.
func (s *Server) JobRow(ctx context.Context, jobID string) (JobRow, error) {
	st, err := s.store()
	if err != nil {
		return JobRow{}, err
	}
	var j JobRow
	var errMsg, reqJSON, resJSON dbText
	var created, updated dbTime
	err = st.db.QueryRowContext(ctx, st.rebind(`SELECT job_id, status, phase, progress, artifact_id, artifact_status,
		template_spec_fingerprint, source_image_digest, error_message, request_json, result_json, created_at, updated_at
		FROM `+jobTable+` WHERE job_id = ? AND deleted_at IS NULL`), jobID).Scan(&j.JobID, &j.Status, &j.Phase,
		&j.Progress, &j.ArtifactID, &j.ArtifactStatus, &j.Fingerprint, &j.SourceImageDigest, &errMsg, &reqJSON,
		&resJSON, &created, &updated)
	if err != nil {
		return JobRow{}, fmt.Errorf("read job %s: %w", jobID, err)
	}
	j.ErrorMessage, j.RequestJSON, j.ResultJSON = string(errMsg), string(reqJSON), string(resJSON)
	j.CreatedAt, j.UpdatedAt = time.Time(created), time.Time(updated)
	return j, nil
}

// AgeArtifact moves the artifact row's updated_at back by d, so a test
// can make a CLEANUP_PENDING row old enough for TC's sweep without waiting.
func (s *Server) AgeArtifact(ctx context.Context, artifactID string, d time.Duration) error {
	st, err := s.store()
	if err != nil {
		return err
	}
	q := `UPDATE ` + artifactTable + ` SET updated_at = updated_at - INTERVAL ? MICROSECOND WHERE artifact_id = ? AND deleted_at IS NULL`
	if st.dialect == dialectPostgres {
		q = `UPDATE ` + artifactTable + ` SET updated_at = updated_at - (?::bigint * interval '1 microsecond') WHERE artifact_id = ? AND deleted_at IS NULL`
	}
	n, err := st.exec(ctx, st.db, q, d.Microseconds(), artifactID)
	if err != nil {
		return fmt.Errorf("age artifact %s: %w", artifactID, err)
	}
	if n == 0 {
		return fmt.Errorf("age artifact %s: no such artifact row", artifactID)
	}
	return nil
}

// Exec runs a statement on the stand-in's database, written with ?
// placeholders and the {now} marker for the database's clock, for tests
// that put rows in states CubeMaster would (a FAILED job, a
// CLEANUP_PENDING artifact).
func (s *Server) Exec(ctx context.Context, query string, args ...any) error {
	st, err := s.store()
	if err != nil {
		return err
	}
	if _, err := st.exec(ctx, st.db, query, args...); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	return nil
}
