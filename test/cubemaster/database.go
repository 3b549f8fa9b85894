package cubemaster

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
)

// The dialects UseDatabase takes.
const (
	dialectMySQL    = "mysql"
	dialectPostgres = "postgres"
)

// Table names of CubeMaster's schema.
const (
	jobTable      = "t_cube_template_image_job"
	artifactTable = "t_cube_rootfs_artifact"
)

// Job and artifact statuses the stand-in writes or tests.
const (
	statusPending        = "PENDING"
	statusBuilt          = "BUILT"
	statusReady          = "READY"
	statusFailed         = "FAILED"
	statusCleanupPending = "CLEANUP_PENDING"
	statusDeleting       = "DELETING"
)

// ErrNoDatabase is a database call on a stand-in without UseDatabase.
var ErrNoDatabase = errors.New("cubemaster stand-in has no database")

// store is the stand-in's handle on CubeMaster's database.
type store struct {
	db      *sql.DB
	dialect string
}

// UseDatabase turns database mode on: from now on callbacks update the
// job rows of db (whose schema is CubeMaster's, see test/dbserver) as
// CubeMaster does, and a BUILT callback registers the artifact row under
// the build lock before it is answered. driver is "mysql" or "postgres"
// ("pgx" is taken for "postgres"); a MySQL db must scan DATETIME into
// time.Time or text (either works). Callbacks are still recorded.
func (s *Server) UseDatabase(db *sql.DB, driver string) error {
	dialect := driver
	switch driver {
	case dialectMySQL, dialectPostgres:
	case "pgx":
		dialect = dialectPostgres
	default:
		return fmt.Errorf("use database: driver %q is not mysql or postgres", driver)
	}
	s.mu.Lock()
	s.db = &store{db: db, dialect: dialect}
	s.mu.Unlock()
	return nil
}

func (s *Server) store() (*store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil, ErrNoDatabase
	}
	return s.db, nil
}

// rebind turns q, written with ? placeholders and the {now} and {gc}
// markers, into the dialect's SQL: $n placeholders on PostgreSQL, the
// server's clock for {now} and now plus seven days for {gc}.
func (st *store) rebind(q string) string {
	if st.dialect == dialectMySQL {
		return strings.NewReplacer("{now}", "NOW(3)", "{gc}", "NOW(3) + INTERVAL 7 DAY").Replace(q)
	}
	q = strings.NewReplacer("{now}", "now()", "{gc}", "now() + interval '168 hours'").Replace(q)
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

// execer is what both *sql.DB and *sql.Conn offer.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (st *store) exec(ctx context.Context, e execer, q string, args ...any) (int64, error) {
	res, err := e.ExecContext(ctx, st.rebind(q), args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// CreateJob inserts the job row CubeMaster writes before it posts a build:
// status PENDING, the template request's identifying columns, and
// request_json, the request object with registry_password blanked (set to
// "" where present) and every other member kept.
func (s *Server) CreateJob(ctx context.Context, jobID string, request json.RawMessage) error {
	st, err := s.store()
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(request))
	dec.UseNumber()
	var req map[string]any
	if err := dec.Decode(&req); err != nil {
		return fmt.Errorf("create job %s: decode request: %w", jobID, err)
	}
	if req == nil {
		return fmt.Errorf("create job %s: request is not a JSON object", jobID)
	}
	if _, ok := req["registry_password"]; ok {
		req["registry_password"] = ""
	}
	snapshot, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("create job %s: encode request: %w", jobID, err)
	}
	str := func(k string) string { v, _ := req[k].(string); return v }
	_, err = st.exec(ctx, st.db, `INSERT INTO `+jobTable+` (job_id, template_id, request_id, source_image_ref,
		writable_layer_size, instance_type, network_type, status, request_json, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, {now}, {now})`,
		jobID, str("template_id"), str("requestID"), str("source_image_ref"),
		str("writable_layer_size"), str("instance_type"), str("network_type"), statusPending, string(snapshot))
	if err != nil {
		return fmt.Errorf("create job %s: %w", jobID, err)
	}
	return nil
}

// CreateBuildRequest is BuildRequest for a stand-in in database mode: it
// inserts the job row (CreateJob) for the request and returns the body to
// post to the agent.
func (s *Server) CreateBuildRequest(ctx context.Context, jobID, image string, template map[string]any) (map[string]any, error) {
	body := BuildRequest(jobID, image, template)
	req, err := json.Marshal(body["request"])
	if err != nil {
		return nil, fmt.Errorf("create build request %s: %w", jobID, err)
	}
	if err := s.CreateJob(ctx, jobID, req); err != nil {
		return nil, err
	}
	return body, nil
}

// jobColumns are the callback keys CubeMaster copies into job columns;
// the int ones are coerced to integers.
var (
	jobStringColumns = []string{"status", "phase", "error_message", "artifact_id", "artifact_status",
		"source_image_digest", "template_spec_fingerprint"}
	jobIntColumns = []string{"progress", "pull_total_bytes", "pull_downloaded_bytes", "pull_total_layers",
		"pull_completed_layers", "pull_speed_bps"}
)

// column is one column assignment of an UPDATE.
type column struct {
	name  string
	value any
}

// jobUpdates picks the whitelisted keys of a callback body.
func jobUpdates(body map[string]any) ([]column, error) {
	var cols []column
	for _, k := range jobStringColumns {
		if v, ok := body[k]; ok {
			s, isString := v.(string)
			if !isString {
				s = fmt.Sprint(v)
			}
			cols = append(cols, column{k, s})
		}
	}
	for _, k := range jobIntColumns {
		if v, ok := body[k]; ok {
			n, err := toInt(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			cols = append(cols, column{k, n})
		}
	}
	return cols, nil
}

// toInt coerces a JSON number (or a numeric string) as CubeMaster does.
func toInt(v any) (int64, error) {
	switch t := v.(type) {
	case float64:
		return int64(t), nil
	case json.Number:
		if n, err := t.Int64(); err == nil {
			return n, nil
		}
		f, err := t.Float64()
		return int64(f), err
	case string:
		return strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	}
	return 0, fmt.Errorf("not a number: %v", v)
}

func setColumn(cols []column, name string, value any) []column {
	for i := range cols {
		if cols[i].name == name {
			cols[i].value = value
			return cols
		}
	}
	return append(cols, column{name, value})
}

// terminalJob reports whether CubeMaster refuses to move a job in status
// out of it.
func terminalJob(status string) bool { return status == statusReady || status == statusFailed }

// jobState is what a callback reads of a job row first.
type jobState struct {
	status, sourceImageRef, writableLayerSize string
}

func (st *store) jobState(ctx context.Context, jobID string) (jobState, error) {
	var j jobState
	err := st.db.QueryRowContext(ctx, st.rebind(`SELECT status, source_image_ref, writable_layer_size FROM `+jobTable+
		` WHERE job_id = ? AND deleted_at IS NULL`), jobID).Scan(&j.status, &j.sourceImageRef, &j.writableLayerSize)
	return j, err
}

// apply makes the database changes CubeMaster makes for an accepted
// callback and returns the HTTP status and error message to answer with.
func (st *store) apply(ctx context.Context, jobID string, body map[string]any, lockWait time.Duration) (int, string) {
	cols, err := jobUpdates(body)
	if err != nil {
		return http.StatusBadRequest, "invalid payload: " + err.Error()
	}
	if len(cols) == 0 {
		return http.StatusBadRequest, "no updatable fields in payload"
	}
	if _, ok := body["status"]; !ok {
		n, err := st.updateJob(ctx, jobID, cols, "")
		if err != nil {
			return http.StatusInternalServerError, "update job: " + err.Error()
		}
		if n == 0 {
			if _, err := st.jobState(ctx, jobID); err != nil {
				return http.StatusInternalServerError, "update job: " + err.Error()
			}
		}
		return http.StatusOK, ""
	}
	status := strings.ToUpper(fmt.Sprint(body["status"]))
	job, err := st.jobState(ctx, jobID)
	if err != nil {
		return http.StatusInternalServerError, "read job: " + err.Error()
	}
	if terminalJob(job.status) && job.status != status {
		return http.StatusConflict, "job already in terminal state " + job.status
	}
	if status == statusBuilt {
		result, err := json.Marshal(body)
		if err != nil {
			return http.StatusInternalServerError, "encode result: " + err.Error()
		}
		cols = setColumn(cols, "result_json", string(result))
		b, problem := parseBuilt(body)
		if problem != "" {
			// CubeMaster accepts the report, then fails the job when
			// its resume step finds the result invalid.
			cols = []column{{"status", statusFailed}, {"phase", "BUILDING_EXT4"}, {"progress", int64(100)},
				{"error_message", "invalid build result: " + problem}, {"result_json", string(result)}}
			status = statusFailed
		} else {
			artifactID, err := st.registerArtifact(ctx, b, job, lockWait)
			if err != nil {
				return http.StatusInternalServerError, "register artifact: " + err.Error()
			}
			cols = setColumn(cols, "artifact_id", artifactID)
		}
	}
	n, err := st.updateJob(ctx, jobID, cols, status)
	if err != nil {
		return http.StatusInternalServerError, "update job: " + err.Error()
	}
	if n == 0 {
		// Nothing matched, or MySQL saw no change: tell them apart.
		job, err := st.jobState(ctx, jobID)
		if err != nil {
			return http.StatusInternalServerError, "update job: " + err.Error()
		}
		if terminalJob(job.status) && job.status != status {
			return http.StatusConflict, "job already in terminal state " + job.status
		}
	}
	return http.StatusOK, ""
}

// updateJob sets cols and updated_at on the job row; with a status, only
// while the row is not in a different terminal status.
func (st *store) updateJob(ctx context.Context, jobID string, cols []column, status string) (int64, error) {
	var set []string
	var args []any
	for _, c := range cols {
		set = append(set, c.name+" = ?")
		args = append(args, c.value)
	}
	q := `UPDATE ` + jobTable + ` SET ` + strings.Join(set, ", ") + `, updated_at = {now} WHERE job_id = ? AND deleted_at IS NULL`
	args = append(args, jobID)
	if status != "" {
		q += ` AND (status NOT IN ('` + statusReady + `', '` + statusFailed + `') OR status = ?)`
		args = append(args, status)
	}
	return st.exec(ctx, st.db, q, args...)
}

// built is the artifact a BUILT report describes.
type built struct {
	artifactID, fingerprint, digest, ext4Path, ext4SHA256 string
	size                                                  int64
	imageConfig, masterNodeIP, artifactURL                string
	storageBackend, objectKey                             string
	caBaked                                               bool
	caFingerprint                                         string
	caTargets                                             int64
}

// parseBuilt reads a BUILT report; problem is non-empty when CubeMaster's
// validation of the result would fail.
func parseBuilt(body map[string]any) (b built, problem string) {
	str := func(k string) string { v, _ := body[k].(string); return v }
	num := func(k string) int64 { n, _ := toInt(body[k]); return n }
	b = built{
		artifactID: str("artifact_id"), fingerprint: str("template_spec_fingerprint"),
		digest: str("source_image_digest"), ext4Path: str("ext4_path"), ext4SHA256: str("ext4_sha256"),
		size: num("ext4_size_bytes"), imageConfig: str("image_config_json"), masterNodeIP: str("master_node_ip"),
		artifactURL: str("artifact_url"), storageBackend: str("storage_backend"), objectKey: str("object_key"),
		caFingerprint: str("cube_egress_ca_fingerprint"), caTargets: num("cube_egress_ca_targets_written"),
	}
	b.caBaked, _ = body["cube_egress_ca_baked"].(bool)
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"artifact_id", b.artifactID}, {"template_spec_fingerprint", b.fingerprint}, {"ext4_path", b.ext4Path},
		{"ext4_sha256", b.ext4SHA256}, {"master_node_ip", b.masterNodeIP}, {"image_config_json", b.imageConfig},
	} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	switch {
	case len(missing) > 0:
		return b, "missing " + strings.Join(missing, ", ")
	case b.size <= 0:
		return b, "ext4_size_bytes must be positive"
	case !path.IsAbs(b.ext4Path):
		return b, "ext4_path must be absolute"
	}
	return b, ""
}

// registerArtifact does what CubeMaster's resume step does with a BUILT
// result, under the build lock of its fingerprint: adopt the READY row of
// the fingerprint when there is one, else insert or finalize the row as
// READY. It returns the artifact id the job ends with.
func (st *store) registerArtifact(ctx context.Context, b built, job jobState, lockWait time.Duration) (string, error) {
	conn, err := st.db.Conn(ctx)
	if err != nil {
		return "", fmt.Errorf("pin connection: %w", err)
	}
	defer conn.Close()
	name := BuildLockName(b.fingerprint)
	if err := acquireLock(ctx, conn, st.dialect, name, lockWait); err != nil {
		return "", err
	}
	defer releaseLock(conn, st.dialect, name)

	var heldBy, heldStatus string
	err = conn.QueryRowContext(ctx, st.rebind(`SELECT artifact_id, status FROM `+artifactTable+
		` WHERE template_spec_fingerprint = ? AND deleted_at IS NULL`), b.fingerprint).Scan(&heldBy, &heldStatus)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		token, err := newToken()
		if err != nil {
			return "", err
		}
		_, err = st.exec(ctx, conn, `INSERT INTO `+artifactTable+` (artifact_id, template_spec_fingerprint,
			source_image_ref, source_image_digest, master_node_ip, ext4_path, ext4_sha256, ext4_size_bytes,
			image_config_json, writable_layer_size, download_token, status, gc_deadline, artifact_url,
			storage_backend, object_key, cube_egress_ca_baked, cube_egress_ca_fingerprint,
			cube_egress_ca_targets_written, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {gc}, ?, ?, ?, ?, ?, ?, {now}, {now})`,
			b.artifactID, b.fingerprint, job.sourceImageRef, b.digest, b.masterNodeIP, b.ext4Path, b.ext4SHA256,
			b.size, b.imageConfig, job.writableLayerSize, token, statusReady, b.artifactURL,
			b.storageBackend, b.objectKey, b.caBaked, b.caFingerprint, b.caTargets)
		if err != nil {
			return "", fmt.Errorf("insert artifact %s: %w", b.artifactID, err)
		}
		return b.artifactID, nil
	case err != nil:
		return "", fmt.Errorf("read artifact of fingerprint %s: %w", b.fingerprint, err)
	case heldStatus == statusReady:
		return heldBy, nil
	case heldBy != b.artifactID || heldStatus == statusDeleting:
		// Retryable for CubeMaster: the job stays BUILT and is replayed.
		return "", fmt.Errorf("fingerprint %s held by artifact %s in status %s", b.fingerprint, heldBy, heldStatus)
	}
	token, err := newToken()
	if err != nil {
		return "", err
	}
	n, err := st.exec(ctx, conn, `UPDATE `+artifactTable+` SET source_image_ref = ?, source_image_digest = ?,
		master_node_ip = ?, ext4_path = ?, ext4_sha256 = ?, ext4_size_bytes = ?, image_config_json = ?,
		writable_layer_size = ?, download_token = ?, status = ?, gc_deadline = {gc}, artifact_url = ?,
		storage_backend = ?, object_key = ?, cube_egress_ca_baked = ?, cube_egress_ca_fingerprint = ?,
		cube_egress_ca_targets_written = ?, updated_at = {now}
		WHERE artifact_id = ? AND status = ?`,
		job.sourceImageRef, b.digest, b.masterNodeIP, b.ext4Path, b.ext4SHA256, b.size, b.imageConfig,
		job.writableLayerSize, token, statusReady, b.artifactURL, b.storageBackend, b.objectKey,
		b.caBaked, b.caFingerprint, b.caTargets, b.artifactID, heldStatus)
	if err != nil {
		return "", fmt.Errorf("finalize artifact %s: %w", b.artifactID, err)
	}
	if n == 0 {
		return "", fmt.Errorf("finalize artifact %s: row left status %s", b.artifactID, heldStatus)
	}
	return b.artifactID, nil
}

// newToken returns a fresh download token, a random UUID as CubeMaster's.
func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("download token: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

// DeleteArtifact deletes an artifact as CubeMaster does: it sets the row
// CLEANUP_PENDING, then posts {"artifact_id": artifactID} to
// tcBaseURL/tc/api/v1/artifact/delete with token in the shared-secret
// header (none when token is empty). It returns TC's status and body; any
// answer leaves the row to TC (CubeMaster leaves it CLEANUP_PENDING on a
// non-200 for TC's sweep). err is a database or transport failure.
func (s *Server) DeleteArtifact(ctx context.Context, tcBaseURL, token, artifactID string) (status int, body string, err error) {
	st, err := s.store()
	if err != nil {
		return 0, "", err
	}
	n, err := st.exec(ctx, st.db, `UPDATE `+artifactTable+` SET status = ?, updated_at = {now}
		WHERE artifact_id = ? AND deleted_at IS NULL`, statusCleanupPending, artifactID)
	if err != nil {
		return 0, "", fmt.Errorf("mark artifact %s for cleanup: %w", artifactID, err)
	}
	if n == 0 {
		var one int
		err := st.db.QueryRowContext(ctx, st.rebind(`SELECT 1 FROM `+artifactTable+` WHERE artifact_id = ? AND deleted_at IS NULL`), artifactID).Scan(&one)
		if err != nil {
			return 0, "", fmt.Errorf("mark artifact %s for cleanup: %w", artifactID, err)
		}
	}
	reqBody, err := json.Marshal(map[string]string{"artifact_id": artifactID})
	if err != nil {
		return 0, "", fmt.Errorf("encode delete request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(tcBaseURL, "/")+"/tc/api/v1/artifact/delete", bytes.NewReader(reqBody))
	if err != nil {
		return 0, "", fmt.Errorf("delete artifact %s: %w", artifactID, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if t := strings.TrimSpace(token); t != "" {
		req.Header.Set(tokenHeader, t)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("delete artifact %s: %w", artifactID, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, string(b), fmt.Errorf("delete artifact %s: read answer: %w", artifactID, err)
	}
	return resp.StatusCode, string(b), nil
}
