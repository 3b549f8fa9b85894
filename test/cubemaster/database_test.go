package cubemaster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

var servers dbserver.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	servers.Close()
	os.Exit(code)
}

const testToken = "cm-secret"

// dbEnv is a stand-in in database mode on a fresh database.
type dbEnv struct {
	cm      *Server
	db      *sql.DB
	dialect dbserver.Dialect
}

// eachDialect runs f against MariaDB and PostgreSQL, each time with a
// fresh database holding CubeMaster's schema and a stand-in using it.
func eachDialect(t *testing.T, f func(t *testing.T, e dbEnv)) {
	t.Helper()
	for _, c := range []struct {
		name string
		open func(t *testing.T) dbserver.Database
	}{
		{"MariaDB", func(t *testing.T) dbserver.Database { return servers.MariaDB(t).NewDatabase(t) }},
		{"Postgres", func(t *testing.T) dbserver.Database { return servers.Postgres(t).NewDatabase(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := c.open(t)
			db := d.Open(t)
			if err := dbserver.CreateCubeMasterSchema(testCtx(t), db, d.Dialect); err != nil {
				t.Fatal(err)
			}
			cm, err := Start(testToken)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cm.Stop)
			if err := cm.UseDatabase(db, string(d.Dialect)); err != nil {
				t.Fatal(err)
			}
			f(t, dbEnv{cm: cm, db: db, dialect: d.Dialect})
		})
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// post sends a callback body as TC does and returns the answer's status.
func post(t *testing.T, cm *Server, jobID string, body map[string]any) int {
	t.Helper()
	code, err := postCallback(cm, jobID, body)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// postCallback is post for goroutines other than the test's.
func postCallback(cm *Server, jobID string, body map[string]any) (int, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequest(http.MethodPost, cm.URL()+"/internal/template/jobs/"+jobID+"/status", bytes.NewReader(data))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(api.TokenHeader, testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("post callback of %s: %w", jobID, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func expectPost(t *testing.T, cm *Server, jobID string, body map[string]any, want int) {
	t.Helper()
	if got := post(t, cm, jobID, body); got != want {
		t.Fatalf("callback %v of %s answered %d, want %d", body["status"], jobID, got, want)
	}
}

const testFingerprint = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// builtFor is a complete BUILT report as the agent writes it, object
// store fields included.
func builtFor(artifactID, fingerprint string) api.Built {
	return api.Built{
		ArtifactID:      artifactID,
		Fingerprint:     fingerprint,
		SourceDigest:    "sha256:" + strings.Repeat("d", 64),
		Ext4Path:        "/store/" + artifactID + "/" + artifactID + ".ext4",
		Ext4SHA256:      strings.Repeat("e", 64),
		Ext4SizeBytes:   4 << 20,
		ImageConfigJSON: `{"Cmd":["/bin/sh"],"Env":["PATH=/bin"]}`,
		MasterNodeIP:    "http://" + DownloadBaseURL,
		CABaked:         true,
		CAFingerprint:   strings.Repeat("c", 64),
		CATargets:       3,
		StorageBackend:  "s3",
		ObjectKey:       "rootfs/" + artifactID + ".ext4",
		ArtifactURL:     "https://s3.test/rootfs/" + artifactID + ".ext4?sig=x",
	}
}

// report is an api.Report as the JSON map the stand-in decodes.
func report(r api.Report) map[string]any {
	data, err := r.Encode()
	if err != nil {
		panic(err)
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		panic(err)
	}
	return m
}

// createJob inserts a job row for a build of image.
func createJob(t *testing.T, e dbEnv, jobID string) {
	t.Helper()
	if _, err := e.cm.CreateBuildRequest(testCtx(t), jobID, "registry.test/app:v1", nil); err != nil {
		t.Fatal(err)
	}
}

func jobRow(t *testing.T, e dbEnv, jobID string) JobRow {
	t.Helper()
	j, err := e.cm.JobRow(testCtx(t), jobID)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func artifactRows(t *testing.T, e dbEnv) []ArtifactRow {
	t.Helper()
	rows, err := e.cm.ArtifactRows(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestCreateJobSnapshot checks the job row CreateJob writes: PENDING, the
// request's columns, and a snapshot without the password that TC's own
// submit check accepts for the request posted with the password.
func TestCreateJobSnapshot(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		body, err := e.cm.CreateBuildRequest(testCtx(t), "job-1", "registry.test/app:v1",
			map[string]any{"registry_username": "u", "registry_password": "hunter2", "exposed_ports": []int{8080}})
		if err != nil {
			t.Fatal(err)
		}
		j := jobRow(t, e, "job-1")
		if j.Status != "PENDING" || j.ArtifactID != "" || j.Progress != 0 {
			t.Errorf("JobRow = %+v, want PENDING without artifact", j)
		}
		if strings.Contains(j.RequestJSON, "hunter2") {
			t.Errorf("request_json keeps the password: %s", j.RequestJSON)
		}
		var snap map[string]any
		if err := json.Unmarshal([]byte(j.RequestJSON), &snap); err != nil {
			t.Fatalf("request_json %q: %v", j.RequestJSON, err)
		}
		if pw, ok := snap["registry_password"]; !ok || pw != "" {
			t.Errorf("request_json registry_password = %v (present %v), want \"\"", pw, ok)
		}
		if snap["registry_username"] != "u" || snap["requestID"] != "req-job-1" || snap["source_image_ref"] != "registry.test/app:v1" {
			t.Errorf("request_json = %s, want the request's other fields", j.RequestJSON)
		}
		submitted, err := json.Marshal(body["request"])
		if err != nil {
			t.Fatal(err)
		}
		ok, err := masterdb.JobRow{JobID: "job-1", Status: j.Status, RequestJSON: j.RequestJSON}.MatchesRequest(submitted)
		if err != nil || !ok {
			t.Errorf("MatchesRequest(submitted) = %v, %v; want the stored snapshot to match the posted request", ok, err)
		}
		var templateID, requestID, image, size string
		err = e.db.QueryRowContext(testCtx(t), rebindFor(e, `SELECT template_id, request_id, source_image_ref, writable_layer_size
			FROM t_cube_template_image_job WHERE job_id = ?`), "job-1").Scan(&templateID, &requestID, &image, &size)
		if err != nil {
			t.Fatal(err)
		}
		if templateID != "tpl-job-1" || requestID != "req-job-1" || image != "registry.test/app:v1" || size != "1Gi" {
			t.Errorf("job columns = %q %q %q %q", templateID, requestID, image, size)
		}
		if err := e.cm.CreateJob(testCtx(t), "job-1", json.RawMessage(`{}`)); err == nil {
			t.Error("CreateJob of an existing job id succeeded")
		}
	})
}

func rebindFor(e dbEnv, q string) string {
	return (&store{dialect: string(e.dialect)}).rebind(q)
}

// TestRunningAndFailedUpdateJob checks the job row follows RUNNING and
// FAILED reports, and that CubeMaster's terminal guard keeps it FAILED.
func TestRunningAndFailedUpdateJob(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		createJob(t, e, "job-1")
		before := jobRow(t, e, "job-1")
		expectPost(t, e.cm, "job-1", report(api.RunningReport(api.PhasePulling, api.ProgressPulling)), http.StatusOK)
		j := jobRow(t, e, "job-1")
		if j.Status != "RUNNING" || j.Phase != "PULLING" || j.Progress != 5 {
			t.Errorf("after RUNNING: JobRow = %+v, want RUNNING PULLING 5", j)
		}
		if j.UpdatedAt.Before(before.UpdatedAt) {
			t.Errorf("after RUNNING: updated_at %v before the insert's %v", j.UpdatedAt, before.UpdatedAt)
		}
		expectPost(t, e.cm, "job-1", report(api.FingerprintReport("rfs-1", testFingerprint, "sha256:abc")), http.StatusOK)
		expectPost(t, e.cm, "job-1", report(api.PullReport(api.Pull{TotalBytes: 10, DownloadedBytes: 4})), http.StatusOK)
		expectPost(t, e.cm, "job-1", report(api.RunningReport(api.PhaseUnpacking, api.ProgressUnpacking)), http.StatusOK)
		expectPost(t, e.cm, "job-1", report(api.FailedReport(api.PhaseUnpacking, "envd payload is not ELF")), http.StatusOK)
		j = jobRow(t, e, "job-1")
		if j.Status != "FAILED" || j.Phase != "UNPACKING" || j.Progress != 100 || j.ErrorMessage != "envd payload is not ELF" ||
			j.ArtifactID != "rfs-1" || j.Fingerprint != testFingerprint || j.SourceImageDigest != "sha256:abc" {
			t.Errorf("after FAILED: JobRow = %+v", j)
		}
		var total, downloaded int64
		if err := e.db.QueryRowContext(testCtx(t), rebindFor(e, `SELECT pull_total_bytes, pull_downloaded_bytes
			FROM t_cube_template_image_job WHERE job_id = ?`), "job-1").Scan(&total, &downloaded); err != nil {
			t.Fatal(err)
		}
		if total != 10 || downloaded != 4 {
			t.Errorf("pull columns = %d/%d, want 4/10", downloaded, total)
		}
		// A job in a terminal state keeps it (the database guard: the
		// in-memory one knows only BUILT and FAILED callbacks).
		expectPost(t, e.cm, "job-1", report(api.RunningReport(api.PhaseBuildingExt4, api.ProgressBuilding)), http.StatusConflict)
		expectPost(t, e.cm, "job-1", report(api.FailedReport(api.PhaseUnpacking, "envd payload is not ELF")), http.StatusOK)
		if j := jobRow(t, e, "job-1"); j.Status != "FAILED" || j.Phase != "UNPACKING" {
			t.Errorf("after a late RUNNING: JobRow = %+v, want it still FAILED in UNPACKING", j)
		}
	})
}

// TestCallbackRefusals checks the answers TC must retry or give up on: an
// unknown job is a 500 (CubeMaster's record-not-found), a body with no
// column CubeMaster copies a 400.
func TestCallbackRefusals(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		expectPost(t, e.cm, "nope", report(api.FingerprintReport("rfs-1", testFingerprint, "sha256:abc")), http.StatusInternalServerError)
		expectPost(t, e.cm, "nope", report(api.RunningReport(api.PhasePulling, api.ProgressPulling)), http.StatusInternalServerError)
		createJob(t, e, "job-1")
		expectPost(t, e.cm, "job-1", map[string]any{"unrelated": 1}, http.StatusBadRequest)
		expectPost(t, e.cm, "job-1", map[string]any{"progress": "many"}, http.StatusBadRequest)
		if j := jobRow(t, e, "job-1"); j.Status != "PENDING" || j.Progress != 0 {
			t.Errorf("JobRow = %+v, want it untouched", j)
		}
	})
}

// TestBuiltInsertsReadyRow checks a BUILT report makes a READY artifact row
// with every field of the report and moves the job to BUILT.
func TestBuiltInsertsReadyRow(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		createJob(t, e, "job-1")
		expectPost(t, e.cm, "job-1", report(api.RunningReport(api.PhaseBuildingExt4, api.ProgressBuilding)), http.StatusOK)
		b := builtFor("rfs-0123456789abcdef01234567", testFingerprint)
		expectPost(t, e.cm, "job-1", report(api.BuiltReport(b)), http.StatusOK)

		rows := artifactRows(t, e)
		if len(rows) != 1 {
			t.Fatalf("ArtifactRows = %+v, want one row", rows)
		}
		a := rows[0]
		want := ArtifactRow{
			ArtifactID: b.ArtifactID, Fingerprint: b.Fingerprint, Status: "READY",
			SourceImageRef: "registry.test/app:v1", SourceImageDigest: b.SourceDigest, MasterNodeIP: b.MasterNodeIP,
			Ext4Path: b.Ext4Path, Ext4SHA256: b.Ext4SHA256, Ext4SizeBytes: b.Ext4SizeBytes,
			ImageConfigJSON: b.ImageConfigJSON, WritableLayerSize: "1Gi", ArtifactURL: b.ArtifactURL,
			StorageBackend: b.StorageBackend, ObjectKey: b.ObjectKey, CABaked: true, CAFingerprint: b.CAFingerprint,
			CATargets: b.CATargets,
		}
		got := a
		got.DownloadToken, got.GCDeadline, got.CreatedAt, got.UpdatedAt = "", time.Time{}, time.Time{}, time.Time{}
		if got != want {
			t.Errorf("artifact row:\n got %+v\nwant %+v", got, want)
		}
		if len(a.DownloadToken) != 36 {
			t.Errorf("download_token = %q, want a UUID", a.DownloadToken)
		}
		// Both set from the same statement's clock.
		if d := a.GCDeadline.Sub(a.UpdatedAt); d != 7*24*time.Hour {
			t.Errorf("gc_deadline - updated_at = %v, want 168h", d)
		}
		j := jobRow(t, e, "job-1")
		if j.Status != "BUILT" || j.ArtifactID != b.ArtifactID || j.Phase != "READY" || j.Progress != 100 ||
			j.ArtifactStatus != "READY" || j.Fingerprint != testFingerprint {
			t.Errorf("JobRow = %+v, want BUILT with %s", j, b.ArtifactID)
		}
		var result map[string]any
		if err := json.Unmarshal([]byte(j.ResultJSON), &result); err != nil || result["ext4_sha256"] != b.Ext4SHA256 {
			t.Errorf("result_json = %q (%v), want the raw report", j.ResultJSON, err)
		}

		// TC re-sends a BUILT it got no answer to: same row, same token.
		expectPost(t, e.cm, "job-1", report(api.BuiltReport(b)), http.StatusOK)
		if again := artifactRows(t, e); len(again) != 1 || again[0].DownloadToken != a.DownloadToken {
			t.Errorf("after a repeated BUILT: ArtifactRows = %+v, want the row unchanged", again)
		}
	})
}

// TestBuiltAdoptsReadyRow checks that a BUILT of a fingerprint already
// READY under another artifact leaves that row as it is and gives its
// artifact id to the job.
func TestBuiltAdoptsReadyRow(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		createJob(t, e, "job-1")
		createJob(t, e, "job-2")
		first := builtFor("rfs-first", testFingerprint)
		expectPost(t, e.cm, "job-1", report(api.BuiltReport(first)), http.StatusOK)
		before := artifactRows(t, e)
		second := builtFor("rfs-second", testFingerprint)
		second.Ext4SHA256 = strings.Repeat("f", 64)
		expectPost(t, e.cm, "job-2", report(api.BuiltReport(second)), http.StatusOK)
		after := artifactRows(t, e)
		if len(after) != 1 || after[0] != before[0] {
			t.Errorf("ArtifactRows after the second BUILT:\n got %+v\nwant %+v", after, before)
		}
		if j := jobRow(t, e, "job-2"); j.Status != "BUILT" || j.ArtifactID != "rfs-first" {
			t.Errorf("JobRow(job-2) = %+v, want BUILT with rfs-first", j)
		}
	})
}

// TestBuiltFinalizesOwnRow checks a row of the same artifact that is not
// READY is finalized, while one of another artifact makes the BUILT a 500
// (CubeMaster retries later) and stays as it is.
func TestBuiltFinalizesOwnRow(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		createJob(t, e, "job-1")
		b := builtFor("rfs-1", testFingerprint)
		expectPost(t, e.cm, "job-1", report(api.BuiltReport(b)), http.StatusOK)
		if _, err := e.db.ExecContext(testCtx(t), rebindFor(e, `UPDATE t_cube_rootfs_artifact SET status = 'FAILED'`)); err != nil {
			t.Fatal(err)
		}
		old := artifactRows(t, e)[0].DownloadToken
		createJob(t, e, "job-2")
		expectPost(t, e.cm, "job-2", report(api.BuiltReport(b)), http.StatusOK)
		rows := artifactRows(t, e)
		if len(rows) != 1 || rows[0].Status != "READY" || rows[0].DownloadToken == old {
			t.Errorf("ArtifactRows = %+v, want rfs-1 READY again with a new token", rows)
		}

		if _, err := e.db.ExecContext(testCtx(t), rebindFor(e, `UPDATE t_cube_rootfs_artifact SET status = 'DELETING'`)); err != nil {
			t.Fatal(err)
		}
		createJob(t, e, "job-3")
		expectPost(t, e.cm, "job-3", report(api.BuiltReport(builtFor("rfs-other", testFingerprint))), http.StatusInternalServerError)
		createJob(t, e, "job-4")
		expectPost(t, e.cm, "job-4", report(api.BuiltReport(b)), http.StatusInternalServerError)
		if rows := artifactRows(t, e); len(rows) != 1 || rows[0].Status != "DELETING" {
			t.Errorf("ArtifactRows = %+v, want rfs-1 still DELETING", rows)
		}
		for _, id := range []string{"job-3", "job-4"} {
			if j := jobRow(t, e, id); j.Status != "PENDING" || j.ArtifactID != "" {
				t.Errorf("JobRow(%s) = %+v, want it untouched by a refused BUILT", id, j)
			}
		}
	})
}

// TestBuiltInvalidFailsJob checks CubeMaster's validation of a result: a
// BUILT without its ext4 path is accepted, registers nothing and fails the
// job in BUILDING_EXT4.
func TestBuiltInvalidFailsJob(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		createJob(t, e, "job-1")
		b := builtFor("rfs-1", testFingerprint)
		b.Ext4Path = ""
		expectPost(t, e.cm, "job-1", report(api.BuiltReport(b)), http.StatusOK)
		if rows := artifactRows(t, e); len(rows) != 0 {
			t.Errorf("ArtifactRows = %+v, want none", rows)
		}
		if j := jobRow(t, e, "job-1"); j.Status != "FAILED" || j.Phase != "BUILDING_EXT4" || !strings.Contains(j.ErrorMessage, "ext4_path") {
			t.Errorf("JobRow = %+v, want FAILED in BUILDING_EXT4 naming ext4_path", j)
		}
	})
}

// TestConcurrentBuiltOneRow posts BUILTs of one fingerprint from several
// goroutines: the lock lets exactly one row in, every job adopts it.
func TestConcurrentBuiltOneRow(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		const n = 6
		for i := range n {
			createJob(t, e, fmt.Sprintf("job-%d", i))
		}
		var wg sync.WaitGroup
		codes, errs := make([]int, n), make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				codes[i], errs[i] = postCallback(e.cm, fmt.Sprintf("job-%d", i), report(api.BuiltReport(builtFor(fmt.Sprintf("rfs-%d", i), testFingerprint))))
			})
		}
		close(start)
		wg.Wait()
		for i, c := range codes {
			if c != http.StatusOK || errs[i] != nil {
				t.Errorf("BUILT of job-%d answered %d, %v", i, c, errs[i])
			}
		}
		rows := artifactRows(t, e)
		if len(rows) != 1 {
			t.Fatalf("ArtifactRows = %+v, want exactly one", rows)
		}
		for i := range n {
			if j := jobRow(t, e, fmt.Sprintf("job-%d", i)); j.Status != "BUILT" || j.ArtifactID != rows[0].ArtifactID {
				t.Errorf("JobRow(job-%d) = %+v, want BUILT with %s", i, j, rows[0].ArtifactID)
			}
		}
	})
}

// holdLock takes the named lock on a connection of its own, as a TC
// replica building the fingerprint would, and returns its release.
func holdLock(t *testing.T, e dbEnv, name string) func() {
	t.Helper()
	ctx := testCtx(t)
	conn, err := e.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	lock, unlock := "SELECT GET_LOCK(?, 0)", "SELECT RELEASE_LOCK(?)"
	if e.dialect == dbserver.PostgresDialect {
		lock, unlock = "SELECT pg_try_advisory_lock(hashtext($1))", "SELECT pg_advisory_unlock(hashtext($1))"
	}
	var got bool
	if err := conn.QueryRowContext(ctx, lock, name).Scan(&got); err != nil || !got {
		t.Fatalf("take lock %s: %v, %v", name, got, err)
	}
	return func() {
		var released bool
		if err := conn.QueryRowContext(ctx, unlock, name).Scan(&released); err != nil || !released {
			t.Fatalf("release lock %s: %v, %v", name, released, err)
		}
	}
}

// TestBuiltWaitsForBuildLock holds the build lock under the name written
// out here, as TC holds it: the BUILT cannot register (500, no row, job
// untouched) until the lock is free. It fails if the stand-in locked any
// other name.
func TestBuiltWaitsForBuildLock(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		e.cm.LockWait = time.Second
		createJob(t, e, "job-1")
		release := holdLock(t, e, "tc_build_0123456789abcdef0123456789abcdef012345_82be2dba7afe5e6d")
		b := builtFor("rfs-1", testFingerprint)
		expectPost(t, e.cm, "job-1", report(api.BuiltReport(b)), http.StatusInternalServerError)
		if rows := artifactRows(t, e); len(rows) != 0 {
			t.Errorf("ArtifactRows under a held lock = %+v, want none", rows)
		}
		if j := jobRow(t, e, "job-1"); j.Status != "PENDING" {
			t.Errorf("JobRow under a held lock = %+v, want PENDING", j)
		}
		release()
		expectPost(t, e.cm, "job-1", report(api.BuiltReport(b)), http.StatusOK)
		if rows := artifactRows(t, e); len(rows) != 1 || rows[0].Status != "READY" {
			t.Errorf("ArtifactRows after release = %+v, want one READY", rows)
		}
		// The stand-in gave its lock back: TC can take it again.
		holdLock(t, e, BuildLockName(testFingerprint))()
	})
}

// TestNormalizeLockName checks the lock names against values computed
// step by step here and, independently, with sha256sum(1).
func TestNormalizeLockName(t *testing.T) {
	long := "tc_build_" + testFingerprint
	sum := sha256.Sum256([]byte(long))
	byHand := long[:47] + "_" + hex.EncodeToString(sum[:8])
	const golden = "tc_build_0123456789abcdef0123456789abcdef012345_82be2dba7afe5e6d"
	if byHand != golden {
		t.Fatalf("test vectors disagree: %q vs %q", byHand, golden)
	}
	cases := []struct{ in, want string }{
		{"tc_reconcile_v1", "tc_reconcile_v1"},
		{strings.Repeat("a", 64), strings.Repeat("a", 64)},
		{strings.Repeat("b", 65), strings.Repeat("b", 47) + "_74b128f30cf83de4"},
		{long, golden},
	}
	for _, c := range cases {
		if got := NormalizeLockName(c.in); got != c.want {
			t.Errorf("NormalizeLockName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := BuildLockName(testFingerprint); got != golden || len(got) != 64 {
		t.Errorf("BuildLockName(%s) = %q, want %q", testFingerprint, got, golden)
	}
}

// deleteRecorder is a fake TC delete endpoint answering status.
type deleteRecorder struct {
	mu     sync.Mutex
	status int
	reqs   []recordedDelete
}

type recordedDelete struct {
	method, path, token, contentType, body string
}

func (d *deleteRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reqs = append(d.reqs, recordedDelete{r.Method, r.URL.Path, r.Header.Get(api.TokenHeader), r.Header.Get("Content-Type"), string(body)})
	w.WriteHeader(d.status)
	fmt.Fprintf(w, `{"status":"answer %d"}`, d.status)
}

// TestDeleteArtifact checks the delete CubeMaster makes: row first
// CLEANUP_PENDING, then the request to TC with the token, TC's answer
// handed back, and the row left CLEANUP_PENDING when TC fails.
func TestDeleteArtifact(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		for i, fp := range []string{testFingerprint, strings.Repeat("9", 64)} {
			job := fmt.Sprintf("job-%d", i)
			createJob(t, e, job)
			expectPost(t, e.cm, job, report(api.BuiltReport(builtFor(fmt.Sprintf("rfs-%d", i), fp))), http.StatusOK)
		}
		rec := &deleteRecorder{status: http.StatusOK}
		tc := httptest.NewServer(rec)
		defer tc.Close()

		status, body, err := e.cm.DeleteArtifact(testCtx(t), tc.URL+"/", "tc-secret", "rfs-0")
		if err != nil || status != http.StatusOK || body != `{"status":"answer 200"}` {
			t.Errorf("DeleteArtifact(rfs-0) = %d, %q, %v; want TC's 200 and body", status, body, err)
		}
		rec.status = http.StatusInternalServerError
		status, body, err = e.cm.DeleteArtifact(testCtx(t), tc.URL, "tc-secret", "rfs-1")
		if err != nil || status != http.StatusInternalServerError || body != `{"status":"answer 500"}` {
			t.Errorf("DeleteArtifact(rfs-1) = %d, %q, %v; want TC's 500 and body", status, body, err)
		}
		want := []recordedDelete{
			{"POST", "/tc/api/v1/artifact/delete", "tc-secret", "application/json", `{"artifact_id":"rfs-0"}`},
			{"POST", "/tc/api/v1/artifact/delete", "tc-secret", "application/json", `{"artifact_id":"rfs-1"}`},
		}
		rec.mu.Lock()
		got := rec.reqs
		rec.mu.Unlock()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("requests TC received:\n got %+v\nwant %+v", got, want)
		}
		for _, a := range artifactRows(t, e) {
			if a.Status != "CLEANUP_PENDING" {
				t.Errorf("artifact %s is %s, want CLEANUP_PENDING", a.ArtifactID, a.Status)
			}
		}
		if _, _, err := e.cm.DeleteArtifact(testCtx(t), tc.URL, "tc-secret", "rfs-none"); !errors.Is(err, sql.ErrNoRows) {
			t.Errorf("DeleteArtifact(rfs-none) error = %v, want no rows", err)
		}
		rec.mu.Lock()
		n := len(rec.reqs)
		rec.mu.Unlock()
		if n != 2 {
			t.Errorf("TC received %d requests, want no request for a missing artifact", n)
		}
	})
}

// TestAgeArtifact checks updated_at moves back by exactly the duration.
func TestAgeArtifact(t *testing.T) {
	eachDialect(t, func(t *testing.T, e dbEnv) {
		createJob(t, e, "job-1")
		expectPost(t, e.cm, "job-1", report(api.BuiltReport(builtFor("rfs-1", testFingerprint))), http.StatusOK)
		before := artifactRows(t, e)[0]
		if err := e.cm.AgeArtifact(testCtx(t), "rfs-1", 6*time.Minute+250*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		after := artifactRows(t, e)[0]
		if d := before.UpdatedAt.Sub(after.UpdatedAt); d != 6*time.Minute+250*time.Millisecond {
			t.Errorf("updated_at moved back by %v, want 6m0.25s", d)
		}
		if err := e.cm.AgeArtifact(testCtx(t), "rfs-none", time.Minute); err == nil {
			t.Error("AgeArtifact of a missing artifact succeeded")
		}
	})
}

// TestNoDatabase checks the database calls refuse without UseDatabase
// and that callbacks keep the plain behaviour: any non-empty body is
// accepted, with no job row to find.
func TestNoDatabase(t *testing.T) {
	cm, err := Start(testToken)
	if err != nil {
		t.Fatal(err)
	}
	defer cm.Stop()
	if err := cm.CreateJob(context.Background(), "job-1", json.RawMessage(`{}`)); !errors.Is(err, ErrNoDatabase) {
		t.Errorf("CreateJob error = %v, want ErrNoDatabase", err)
	}
	if _, err := cm.ArtifactRows(context.Background()); !errors.Is(err, ErrNoDatabase) {
		t.Errorf("ArtifactRows error = %v, want ErrNoDatabase", err)
	}
	expectPost(t, cm, "job-1", map[string]any{"unrelated": 1}, http.StatusOK)
	expectPost(t, cm, "job-1", report(api.BuiltReport(builtFor("rfs-1", testFingerprint))), http.StatusOK)
	expectPost(t, cm, "job-1", report(api.FailedReport(api.PhasePulling, "x")), http.StatusConflict)
	if err := cm.UseDatabase(nil, "sqlite"); err == nil {
		t.Error("UseDatabase(sqlite) succeeded")
	}
}
