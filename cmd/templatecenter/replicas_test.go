package main

// Replica scenarios: several agents coordinate through CubeMaster's
// database (MariaDB and PostgreSQL) and share one S3 bucket, as a
// CubeMaster deployment with more than one TC runs them.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

// TestReplicasShareOneBuild: three replicas on one database and one bucket
// get the same spec at once, two jobs each. One takes the build lock and
// builds; the other two wait for it and reuse its artifact. Exactly one
// build (one layer download, one "artifact published"), one upload; every
// job ends BUILT with the same artifact; one READY row, one object and its
// record in the bucket, and no local directory without a row.
//
// RowRegistered lets CubeMaster register the artifact as soon as its BUILT
// report comes; BeforeRegistration holds CubeMaster's answers (503) while
// the build lands, so that no READY row exists when the waiting replicas
// take the lock in turn: they reuse the object and its record instead.
func TestReplicasShareOneBuild(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		hold bool
	}{{"RowRegistered", false}, {"BeforeRegistration", true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			forDialects(t, true, sharedHost, func(t *testing.T, host dbHost) { shareOneBuild(t, host, mode.hold) })
		})
	}
}

// shareOneBuild is TestReplicasShareOneBuild on one server, CubeMaster
// holding its answers while the build lands when hold is set.
func shareOneBuild(t *testing.T, host dbHost, hold bool) {
	s := newReplicaSetup(t, host)
	ref, layer := s.pushImage("shared")
	agents := s.startAgents(3)
	s.gate.shut()
	jobs := map[string]*replicaAgent{}
	for i, a := range agents {
		for j := range 2 {
			jobs[fmt.Sprintf("shared-%d-%d", i+1, j+1)] = a
		}
	}
	s.submitAtOnce(jobs, ref)

	// Hold the build until both other replicas wait for its lock and
	// every replica's second job joined its first: the lock, not luck,
	// is what keeps the build single.
	wait.Until(t, replicaWait, "two replicas waiting for the build lock, every second job joined", func() (bool, string) {
		joined := 0
		for _, a := range agents {
			joined += countLines(a.log(), "identical build in flight, waiting for it")
		}
		waiting := len(waitingReplicas(agents))
		return waiting == 2 && joined == 3, fmt.Sprintf("%d replicas waiting, %d jobs joined", waiting, joined)
	})
	if hold {
		s.cm.Hold()
	}
	s.gate.open()
	if hold {
		wait.Until(t, replicaWait, "both waiting replicas reusing the object before CubeMaster registered it", func() (bool, string) {
			n := 0
			for _, a := range agents {
				n += countLines(a.log(), "artifact uploaded by another replica, reusing it")
			}
			return n == 2, fmt.Sprintf("%d reusing the object", n)
		})
		if rows := s.rows(); len(rows) != 0 {
			t.Fatalf("artifact rows while CubeMaster answers 503: %+v", rows)
		}
		s.cm.Release()
	}

	var artifactID string
	var size int64
	for id := range jobs {
		cb := s.waitBuilt(id)
		if artifactID == "" {
			artifactID, size = cb.Field("artifact_id"), cb.Int("ext4_size_bytes")
		}
		if got := cb.Field("artifact_id"); got != artifactID {
			t.Errorf("job %s BUILT artifact %s, another job %s", id, got, artifactID)
		}
		if cb.Field("storage_backend") != "s3" || cb.Field("object_key") != s.prefix+"/"+artifactID+".ext4" {
			t.Errorf("job %s BUILT without the shared object: %v", id, cb.Body)
		}
	}
	for _, a := range agents {
		waitOutboxEmpty(t, a.base())
	}
	for id := range jobs {
		checkOneTerminal(t, s.cm, id)
		row, err := s.cm.JobRow(bounded(t), id)
		if err != nil || row.Status != "BUILT" || row.ArtifactID != artifactID {
			t.Errorf("job row %s = %+v, %v; want BUILT with artifact %s", id, row, err, artifactID)
		}
	}

	if n := s.reg.BlobGETs(layer); n != 1 {
		t.Errorf("the layer was downloaded %d times, want 1 (one build)", n)
	}
	published := 0
	for _, a := range agents {
		published += countLines(a.log(), "artifact published")
	}
	if published != 1 {
		t.Errorf("%d builds published an artifact, want 1", published)
	}
	if got := sumMetric(t, agents, "cube_templatecenter_blobstore_upload_bytes_total"); got != float64(size) {
		t.Errorf("uploaded %g bytes over the replicas, want one image of %d", got, size)
	}
	if got := sumMetric(t, agents, "cube_templatecenter_replica_lock_waits_total"); got != 2 {
		t.Errorf("lock_waits_total summed = %g, want 2", got)
	}
	byRow := sumMetric(t, agents, `cube_templatecenter_replica_reuse_hits_total{source="row"}`)
	byObject := sumMetric(t, agents, `cube_templatecenter_replica_reuse_hits_total{source="object"}`)
	if byRow+byObject != 2 || (hold && byObject != 2) {
		t.Errorf("reuse hits: %g by row, %g by object; want 2 in all (one per waiting replica), by object when CubeMaster held its answers",
			byRow, byObject)
	}
	if got := sumMetric(t, agents, `cube_templatecenter_replica_reuse_hits_total{source="local"}`); got != 0 {
		t.Errorf("local reuse hits = %g, want 0", got)
	}
	if got := sumMetric(t, agents, "cube_templatecenter_replica_lock_losses_total"); got != 0 {
		t.Errorf("lock_losses_total summed = %g, want 0", got)
	}

	rows := s.rows()
	if len(rows) != 1 || rows[0].ArtifactID != artifactID || rows[0].Status != "READY" ||
		rows[0].ObjectKey != s.prefix+"/"+artifactID+".ext4" || rows[0].StorageBackend != "s3" {
		t.Errorf("artifact rows = %+v, want one READY row of %s in s3", rows, artifactID)
	}
	if got, want := s.objects(), s.artifactKeys(artifactID); !slices.Equal(got, want) {
		t.Errorf("bucket holds %q, want exactly %q", got, want)
	}
	for _, a := range agents {
		for _, id := range a.localArtifacts(t) {
			if _, ok := s.row(id); !ok {
				t.Errorf("%s keeps a local artifact %s without a row", a.name, id)
			}
		}
	}
	for _, a := range agents {
		a.p.stop(t)
	}
}

// TestReplicaKilledMidBuild: the replica holding the build lock is killed
// with SIGKILL in the middle of its build; its session ends with it, so
// another replica takes the lock and builds, and every job of the
// survivors ends BUILT. Restarted, the killed replica finishes its own
// jobs on the artifact the others registered, without building.
func TestReplicaKilledMidBuild(t *testing.T) {
	t.Parallel()
	forDialects(t, true, sharedHost, func(t *testing.T, host dbHost) {
		s := newReplicaSetup(t, host)
		ref, _ := s.pushImage("killed")
		agents := s.startAgents(3)
		s.gate.shut()
		jobs := map[string]*replicaAgent{}
		for i, a := range agents {
			for j := range 2 {
				jobs[fmt.Sprintf("killed-%d-%d", i+1, j+1)] = a
			}
		}
		s.submitAtOnce(jobs, ref)
		s.gate.waitArrivals(t, 1)
		wait.Until(t, replicaWait, "two replicas waiting for the build lock", func() (bool, string) {
			w := waitingReplicas(agents)
			return len(w) == 2, fmt.Sprintf("%d waiting", len(w))
		})
		waiting := waitingReplicas(agents)
		var holder *replicaAgent
		for _, a := range agents {
			if !slices.Contains(waiting, a) {
				holder = a
			}
		}
		holder.p.kill(t)
		s.gate.open()

		for id, a := range jobs {
			if a != holder {
				s.waitBuilt(id)
			}
		}
		published := 0
		for _, a := range waiting {
			published += countLines(a.log(), "artifact published")
			if strings.Contains(a.log(), "building without it") {
				t.Errorf("%s built without the lock:\n%s", a.name, a.log())
			}
		}
		if published != 1 {
			t.Errorf("%d survivors published the artifact, want 1 (the new lock holder)", published)
		}
		took := 0
		for _, a := range waiting {
			took += countLines(a.log(), "build lock taken after waiting")
		}
		if took == 0 {
			t.Errorf("no survivor took the killed replica's build lock")
		}
		rows := s.rows()
		if len(rows) != 1 || rows[0].Status != "READY" {
			t.Fatalf("artifact rows = %+v, want one READY row", rows)
		}

		holder.start()
		for id, a := range jobs {
			if a == holder {
				if cb := s.waitBuilt(id); cb.Field("artifact_id") != rows[0].ArtifactID {
					t.Errorf("job %s of the restarted replica BUILT %s, want %s", id, cb.Field("artifact_id"), rows[0].ArtifactID)
				}
			}
		}
		if strings.Contains(holder.log(), "artifact published") {
			t.Errorf("the restarted replica built again instead of reusing the registered artifact")
		}
		for id := range jobs {
			checkConsistentTerminals(t, s.cm, id)
		}
		if got, want := s.objects(), s.artifactKeys(rows[0].ArtifactID); !slices.Equal(got, want) {
			t.Errorf("bucket holds %q, want exactly %q", got, want)
		}
		for _, a := range agents {
			a.p.stop(t)
		}
	})
}

// TestReplicaLockSurvivesIdleTimeout: on a server that drops sessions idle
// for 3 s (MariaDB wait_timeout, PostgreSQL idle_session_timeout), a build
// held longer than that keeps its lock while a second replica waits for
// it: no loss on the holder, one build, one upload, both jobs BUILT.
func TestReplicaLockSurvivesIdleTimeout(t *testing.T) {
	t.Parallel()
	const idle = 3 * time.Second
	own := func(t testing.TB, d dbserver.Dialect) dbHost {
		if d == dbserver.PostgresDialect {
			return postgresHost(dbserver.StartPostgres(t, dbserver.WithVar("idle_session_timeout", "3s")))
		}
		return mariaDBHost(dbserver.StartMariaDB(t, dbserver.WithVar("wait_timeout", "3")))
	}
	forDialects(t, true, own, func(t *testing.T, host dbHost) {
		s := newReplicaSetup(t, host)
		ref, _ := s.pushImage("idle")
		agents := s.startAgents(2)
		holder, waiter := agents[0], agents[1]
		s.gate.shut()
		s.submitJob(holder, "idle-1", ref, nil)
		s.gate.waitArrivals(t, 1)
		// A session of the test's own, idle from now on, shows that the
		// server's idle timeout did pass while the build held its lock.
		probe, err := s.db.Conn(bounded(t))
		if err != nil {
			t.Fatal(err)
		}
		defer probe.Close()
		if _, err := probe.ExecContext(bounded(t), "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		s.submitJob(waiter, "idle-2", ref, nil)
		wait.Until(t, replicaWait, "the second replica waiting for the build lock", func() (bool, string) {
			return len(waitingReplicas([]*replicaAgent{waiter})) == 1, "not waiting"
		})
		time.Sleep(idle + 2*time.Second) // the build outlasts the idle timeout
		if _, err := probe.ExecContext(bounded(t), "SELECT 1"); err == nil {
			t.Fatalf("a session idle for %s was not dropped: the server's idle timeout is not in force", idle+2*time.Second)
		}
		// The holder still has the lock: it is taken, and not by the
		// waiter, which would have taken it had the server dropped it.
		if !s.lockHeldElsewhere(cubemaster.BuildLockName(s.fingerprintOf("idle-1"))) {
			t.Errorf("the build lock is free while the build runs: the idle timeout dropped it")
		}
		if strings.Contains(waiter.log(), "build lock taken after waiting") {
			t.Errorf("the waiting replica took the build lock while the holder's build ran: the idle timeout dropped it")
		}
		s.gate.open()

		built := s.waitBuilt("idle-1")
		if cb := s.waitBuilt("idle-2"); cb.Field("artifact_id") != built.Field("artifact_id") {
			t.Errorf("jobs BUILT %s and %s, want one artifact", built.Field("artifact_id"), cb.Field("artifact_id"))
		}
		if got := sumMetric(t, []*replicaAgent{holder}, "cube_templatecenter_replica_lock_losses_total"); got != 0 {
			t.Errorf("the holder lost its build lock %g times, want 0", got)
		}
		if got := sumMetric(t, agents, "cube_templatecenter_blobstore_upload_bytes_total"); got != float64(built.Int("ext4_size_bytes")) {
			t.Errorf("uploaded %g bytes, want one image of %d", got, built.Int("ext4_size_bytes"))
		}
		if n := countLines(holder.log(), "artifact published") + countLines(waiter.log(), "artifact published"); n != 1 {
			t.Errorf("%d builds published the artifact, want 1", n)
		}
		for _, a := range agents {
			a.p.stop(t)
		}
	})
}

// TestReplicaDatabaseOutage: with CubeMaster's database down a submit gets
// 503 and nothing is accepted; once it is back the re-submit is accepted
// and ends BUILT. A database that goes down in the middle of a build loses
// no job: the BUILT report waits in the spool (CubeMaster answers 500
// meanwhile) and is delivered once the database is back.
//
// Not parallel: it stops the package's shared servers, which no other test
// may be using meanwhile.
func TestReplicaDatabaseOutage(t *testing.T) {
	forDialects(t, false, sharedHost, func(t *testing.T, host dbHost) {
		s := newReplicaSetup(t, host)
		submitRef, _ := s.pushImage("outage-submit")
		buildRef, _ := s.pushImage("outage-build")
		a := s.startAgents(1)[0]
		t.Cleanup(func() { host.start(context.Background()) })

		body := s.buildBody("outage-submit", submitRef, nil)
		host.stop()
		if code, resp, err := postBuild(a.base(), body); err != nil || code != http.StatusServiceUnavailable {
			t.Errorf("submit with the database down = %d %s, %v; want 503", code, resp, err)
		}
		if code, resp := call(t, http.MethodGet, a.base()+"/tc/api/v1/jobs/outage-submit", testToken, nil); code != http.StatusNotFound {
			t.Errorf("GET the refused job = %d %v, want 404", code, resp)
		}
		if err := host.start(bounded(t)); err != nil {
			t.Fatal(err)
		}
		if code, resp, err := postBuild(a.base(), body); err != nil || code != http.StatusOK {
			t.Fatalf("re-submit with the database back = %d %s, %v; want 200", code, resp, err)
		}
		s.waitBuilt("outage-submit")

		s.gate.shut()
		before := s.gate.arrived()
		s.submitJob(a, "outage-build", buildRef, nil)
		s.gate.waitArrivals(t, before+1)
		host.stop()
		s.gate.open()
		wait.Until(t, replicaWait, "a BUILT report refused while the database is down", func() (bool, string) {
			for _, c := range s.cm.All() {
				if c.JobID == "outage-build" && c.Field("status") == "BUILT" && c.Status == http.StatusInternalServerError {
					return true, ""
				}
			}
			return false, "none yet"
		})
		if err := host.start(bounded(t)); err != nil {
			t.Fatal(err)
		}
		cb := s.waitBuilt("outage-build")
		waitOutboxEmpty(t, a.base())
		for _, id := range []string{"outage-submit", "outage-build"} {
			checkOneTerminal(t, s.cm, id)
			if row, err := s.cm.JobRow(bounded(t), id); err != nil || row.Status != "BUILT" {
				t.Errorf("job row %s = %+v, %v; want BUILT", id, row, err)
			}
		}
		if row, ok := s.row(cb.Field("artifact_id")); !ok || row.Status != "READY" {
			t.Errorf("artifact row of %s: status %q (found %v), want READY", cb.Field("artifact_id"), row.Status, ok)
		}
		a.p.stop(t)
	})
}

// TestReplicaJobRowCheck: a submit is checked against CubeMaster's job
// row: an unknown job is 404, a request that differs from the stored
// snapshot 400, a job no longer buildable 404, and none of them reaches the
// spool; the stored request is accepted whatever its registry password
// and request id.
func TestReplicaJobRowCheck(t *testing.T) {
	t.Parallel()
	forDialects(t, true, sharedHost, func(t *testing.T, host dbHost) {
		s := newReplicaSetup(t, host)
		ref, _ := s.pushImage("rowcheck")
		a := s.startAgents(1)[0]
		encode := func(body map[string]any) []byte {
			data, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
		create := func(jobID string, template map[string]any) map[string]any {
			tmpl := map[string]any{"with_cube_ca": false}
			for k, v := range template {
				tmpl[k] = v
			}
			body, err := s.cm.CreateBuildRequest(bounded(t), jobID, ref, tmpl)
			if err != nil {
				t.Fatal(err)
			}
			return body
		}

		unknown := encode(cubemaster.BuildRequest("rowcheck-unknown", ref, map[string]any{"with_cube_ca": false}))
		mismatch := create("rowcheck-mismatch", nil)
		mismatch["request"].(map[string]any)["writable_layer_size"] = "2Gi"
		create("rowcheck-failed", nil)
		s.exec("UPDATE t_cube_template_image_job SET status = 'FAILED' WHERE job_id = ?", "rowcheck-failed")
		failed := encode(cubemaster.BuildRequest("rowcheck-failed", ref, map[string]any{"with_cube_ca": false}))
		for _, c := range []struct {
			jobID string
			body  []byte
			want  int
			says  string
		}{
			{"rowcheck-unknown", unknown, http.StatusNotFound, "not found"},
			{"rowcheck-mismatch", encode(mismatch), http.StatusBadRequest, "does not match"},
			{"rowcheck-failed", failed, http.StatusNotFound, "FAILED"},
		} {
			if code, resp, err := postBuild(a.base(), c.body); err != nil || code != c.want || !strings.Contains(resp, c.says) {
				t.Errorf("submit %s = %d %s, %v; want %d saying %q", c.jobID, code, resp, err, c.want, c.says)
			}
			if code, resp := call(t, http.MethodGet, a.base()+"/tc/api/v1/jobs/"+c.jobID, testToken, nil); code != http.StatusNotFound {
				t.Errorf("GET refused job %s = %d %v, want 404", c.jobID, code, resp)
			}
		}

		ok := create("rowcheck-ok", map[string]any{"registry_username": "blackbox", "registry_password": registrySecret})
		ok["request"].(map[string]any)["requestID"] = "req-redelivered"
		if code, resp, err := postBuild(a.base(), encode(ok)); err != nil || code != http.StatusOK {
			t.Fatalf("submit of the stored request = %d %s, %v; want 200", code, resp, err)
		}
		s.waitBuilt("rowcheck-ok")
		if row, err := s.cm.JobRow(bounded(t), "rowcheck-ok"); err != nil || strings.Contains(row.RequestJSON, registrySecret) {
			t.Errorf("job row = %+v, %v; want the snapshot without the password", row, err)
		}
		a.p.stop(t)
	})
}

// TestReplicaDeleteClaims: CubeMaster's delete (row CLEANUP_PENDING, then
// the call) removes row, object, record and local directory; a delete of a
// READY row is refused with 409 and deletes nothing. The sweep, switched
// off, leaves a stale CLEANUP_PENDING row alone; switched on, it deletes
// it, and leaves a fresh one alone.
func TestReplicaDeleteClaims(t *testing.T) {
	t.Parallel()
	forDialects(t, true, sharedHost, func(t *testing.T, host dbHost) {
		s := newReplicaSetup(t, host)
		ref, _ := s.pushImage("delete")
		a := s.newAgent("replica (sweep disabled)")
		a.start("CUBE_TEMPLATE_CENTER_RECONCILE_DISABLED=true")
		var ids []string
		for _, size := range []string{"1Gi", "2Gi", "3Gi"} {
			s.submitJob(a, "delete-"+size, ref, map[string]any{"writable_layer_size": size})
		}
		for _, size := range []string{"1Gi", "2Gi", "3Gi"} {
			ids = append(ids, s.waitBuilt("delete-"+size).Field("artifact_id"))
		}
		waitOutboxEmpty(t, a.base())
		deleted, refused, fresh := ids[0], ids[1], ids[2]
		present := func(id, status string) {
			t.Helper()
			if row, ok := s.row(id); !ok {
				t.Errorf("artifact row of %s is gone, want it %s", id, status)
			} else if row.Status != status {
				t.Errorf("artifact row of %s is %s, want %s", id, row.Status, status)
			}
			objs := s.objects()
			for _, k := range s.artifactKeys(id) {
				if !slices.Contains(objs, k) {
					t.Errorf("object %s is gone; the bucket holds %q", k, objs)
				}
			}
			if !pathExists(t, a.artifactDir(id)) {
				t.Errorf("local directory of %s is gone", id)
			}
		}
		gone := func(id string) {
			t.Helper()
			if row, ok := s.row(id); ok {
				t.Errorf("artifact row of %s survived: %+v", id, row)
			}
			objs := s.objects()
			for _, k := range s.artifactKeys(id) {
				if slices.Contains(objs, k) {
					t.Errorf("object %s survived", k)
				}
			}
			if pathExists(t, a.artifactDir(id)) {
				t.Errorf("local directory of %s survived", id)
			}
		}
		for _, id := range ids {
			present(id, "READY")
		}

		code, resp, err := s.cm.DeleteArtifact(bounded(t), a.base(), testToken, deleted)
		if err != nil || code != http.StatusOK {
			t.Fatalf("CubeMaster's delete of %s = %d %s, %v; want 200", deleted, code, resp, err)
		}
		gone(deleted)

		if code, resp := call(t, http.MethodPost, a.base()+"/tc/api/v1/artifact/delete", testToken,
			[]byte(`{"artifact_id":"`+refused+`"}`)); code != http.StatusConflict {
			t.Errorf("delete of a READY row = %d %v, want 409", code, resp)
		}
		present(refused, "READY")

		s.markCleanupPending(refused)
		if err := s.cm.AgeArtifact(bounded(t), refused, 6*time.Minute); err != nil {
			t.Fatal(err)
		}
		s.markCleanupPending(fresh)
		// Four reconcile intervals with the sweep switched off: a sweep
		// would have deleted the stale row (as the restart below shows).
		time.Sleep(4 * time.Second)
		present(refused, "CLEANUP_PENDING")
		m := metrics(t, a.base())
		for _, series := range []string{`cube_templatecenter_reconcile_sweeps_total{result="done"}`,
			`cube_templatecenter_reconcile_sweeps_total{result="skipped"}`,
			`cube_templatecenter_reconcile_sweeps_total{result="failed"}`, "cube_templatecenter_reconcile_deleted_total"} {
			if v, ok := m[series]; !ok || v != 0 {
				t.Errorf("with the sweep switched off %s = %g (exposed %v), want 0", series, v, ok)
			}
		}

		a.p.stop(t)
		a.name = "replica (sweep enabled)"
		a.start()
		wait.Until(t, replicaWait, "the sweep of the stale CLEANUP_PENDING row", func() (bool, string) {
			_, ok := s.row(refused)
			return !ok, "row still there"
		})
		gone(refused)
		const done = `cube_templatecenter_reconcile_sweeps_total{result="done"}`
		// The row goes a moment before the sweep counts it.
		wait.Until(t, replicaWait, "the sweep to count its delete", func() (bool, string) {
			v := metrics(t, a.base())["cube_templatecenter_reconcile_deleted_total"]
			return v == 1, fmt.Sprintf("reconcile_deleted_total = %g, want 1", v)
		})
		// Two more sweeps leave the fresh row alone.
		after := metrics(t, a.base())[done]
		wait.Until(t, replicaWait, "two more sweeps", func() (bool, string) {
			v := metrics(t, a.base())[done]
			return v >= after+2, fmt.Sprintf("%g sweeps done", v)
		})
		present(fresh, "CLEANUP_PENDING")
		if v := metrics(t, a.base())["cube_templatecenter_reconcile_deleted_total"]; v != 1 {
			t.Errorf("reconcile_deleted_total = %g after the fresh row's sweeps, want 1", v)
		}
		a.p.stop(t)
	})
}
