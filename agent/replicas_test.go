package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

// replicaSet is what replicas share: CubeMaster's database (one fresh
// database per test) and a blob store (fs, in a temporary directory).
type replicaSet struct {
	t       *testing.T
	dialect dbDialect
	opts    masterdb.Options
	seed    *sql.DB
	objects *blobstore.FS
	root    string
	// srv is the database server, for outage tests.
	srv dbServer
	// tracer makes the replicas' spans, when set.
	tracer trace.TracerProvider
}

func newReplicaSet(t *testing.T, dl dbDialect) *replicaSet {
	t.Helper()
	opts, d, srv := dl.open(t)
	seed := d.Open(t)
	// No idle connections to find dead after a server restart.
	seed.SetMaxIdleConns(0)
	if err := dbserver.CreateCubeMasterSchema(context.Background(), seed, d.Dialect); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "objects")
	objects, err := blobstore.NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	return &replicaSet{t: t, dialect: dl, opts: opts, seed: seed, objects: objects, root: root, srv: srv}
}

// replica starts an agent on the shared database and blob store. With
// register its CubeMaster stand-in keeps the database as CubeMaster does
// (job rows, artifact rows on BUILT); without, artifact rows are never
// written, as in the gap before CubeMaster registers a BUILT.
func (rs *replicaSet) replica(register bool, mutate func(*config.Config)) *harness {
	return rs.replicaWith(register, mutate, nil)
}

// replicaWith is replica with the shared blob store seen through wrap.
func (rs *replicaSet) replicaWith(register bool, mutate func(*config.Config), wrap func(blobstore.Store) blobstore.Store) *harness {
	t := rs.t
	t.Helper()
	h := newHarness(t, func(c *config.Config) {
		c.Replicas.LockPollInterval = 50 * time.Millisecond
		c.Replicas.ReconcileInterval = time.Hour
		if mutate != nil {
			mutate(c)
		}
	})
	db, err := masterdb.Open(context.Background(), rs.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h.database, h.objects = db, rs.objects
	if wrap != nil {
		h.objects = wrap(rs.objects)
	}
	if register {
		if err := h.master.UseDatabase(rs.seed, rs.dialect.driver); err != nil {
			t.Fatal(err)
		}
	}
	h.tracer = rs.tracer
	h.start()
	return h
}

// createJob writes the job row CubeMaster writes before it posts body.
func (rs *replicaSet) createJob(body map[string]any) {
	rs.t.Helper()
	insertJobRow(rs.t, rs.seed, rs.dialect.driver, body["job_id"].(string), "PENDING", snapshotOf(rs.t, body))
}

// submit creates the job row and posts the build to h.
func (rs *replicaSet) submit(h *harness, id, ref string) {
	rs.t.Helper()
	body := buildBody(id, ref)
	rs.createJob(body)
	if code, out := h.post("/tc/api/v1/build", body); code != http.StatusOK {
		rs.t.Fatalf("submit %s: %d %v", id, code, out)
	}
}

// objectNames lists the blob store's files.
// contend submits job-a (alpine:3) to a and holds its build at publish,
// then the same spec as job-b to b, and returns once b waits for a's
// build lock; closing the channel returned lets a publish.
func (rs *replicaSet) contend(a, b *harness) chan struct{} {
	rs.t.Helper()
	entered, release := a.pauseAtPublish()
	rs.submit(a, "job-a", "alpine:3")
	<-entered
	rs.submit(b, "job-b", "alpine:3")
	wait.For(rs.t, "replica B to wait for the lock", func() bool {
		return b.metric("replica_lock_waits_total") == 1
	})
	return release
}

func (rs *replicaSet) objectNames() []string {
	rs.t.Helper()
	entries, err := os.ReadDir(rs.root)
	if err != nil {
		rs.t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// artifactRows reads the artifact table.
func (rs *replicaSet) artifactRows() map[string]string {
	rs.t.Helper()
	rows, err := rs.seed.Query("SELECT artifact_id, status FROM t_cube_rootfs_artifact")
	if err != nil {
		rs.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			rs.t.Fatal(err)
		}
		out[id] = status
	}
	return out
}

// TestReplicasShareOneBuild: while replica A builds a spec under its lock,
// replica B, given the same spec, waits; once A's artifact is out B
// reports it without building, from CubeMaster's READY row when CubeMaster
// registered it, or from A's object and record when it has not yet.
func TestReplicasShareOneBuild(t *testing.T) {
	for _, dl := range dbDialects {
		for _, register := range []bool{true, false} {
			t.Run(dl.name+"/"+map[bool]string{true: "registered", false: "unregistered"}[register], func(t *testing.T) {
				rs := newReplicaSet(t, dl)
				a, b := rs.replica(register, nil), rs.replica(register, nil)
				close(rs.contend(a, b))
				ca, cb := a.terminal("job-a"), b.terminal("job-b")
				if ca.Field("status") != "BUILT" || cb.Field("status") != "BUILT" {
					t.Fatalf("terminal reports: A %v, B %v", ca.Body, cb.Body)
				}
				for _, f := range []string{"artifact_id", "ext4_sha256", "object_key", "storage_backend", "image_config_json"} {
					if ca.Field(f) != cb.Field(f) || ca.Field(f) == "" {
						t.Errorf("%s: A %q, B %q", f, ca.Field(f), cb.Field(f))
					}
				}
				if ca.Int("ext4_size_bytes") != cb.Int("ext4_size_bytes") || ca.Body["cube_egress_ca_baked"] != cb.Body["cube_egress_ca_baked"] {
					t.Errorf("size or CA fields differ: A %v, B %v", ca.Body, cb.Body)
				}
				if n := b.builder.buildCount(); n != 0 {
					t.Errorf("replica B built %d times", n)
				}
				// Registered or not, B may take the lock before CubeMaster
				// registers A's artifact: then the object stands for it.
				row, object := b.metric("replica_reuse_hits_total", "source", "row"), b.metric("replica_reuse_hits_total", "source", "object")
				if row+object != 1 || (!register && object != 1) {
					t.Errorf("B's reuse_hits_total: row %v, object %v; want one (object without registration)", row, object)
				}
				id := ca.Field("artifact_id")
				if got, want := rs.objectNames(), []string{id + ".ext4", id + ".ext4.sha256", id + ".json", id + ".json.sha256"}; !slices.Equal(got, want) {
					t.Errorf("blob store holds %v, want %v", got, want)
				}
				if register {
					if rows := rs.artifactRows(); len(rows) != 1 || rows[id] != masterdb.ArtifactReady {
						t.Errorf("artifact rows = %v, want %s READY", rows, id)
					}
				}
				if _, err := os.Stat(b.cfg.Store.Dir + "/" + id); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("replica B has a local copy: %v", err)
				}
			})
		}
	}
}

// TestReuseFromReadyRow: a READY row whose object is intact is reported at
// once, with the row's fields; one whose object is gone is not reused.
func TestReuseFromReadyRow(t *testing.T) {
	for _, dl := range dbDialects {
		t.Run(dl.name, func(t *testing.T) {
			rs := newReplicaSet(t, dl)
			first := rs.replica(true, nil)
			rs.submit(first, "job-1", "alpine:3")
			built := first.terminal("job-1")
			if built.Field("status") != "BUILT" {
				t.Fatalf("first build: %v", built.Body)
			}
			// A replica with an empty store and spool: only the row and
			// the object can tell it about the artifact.
			h := rs.replica(true, nil)
			rs.submit(h, "job-2", "alpine:3")
			cb := h.terminal("job-2")
			if cb.Field("status") != "BUILT" || cb.Field("artifact_id") != built.Field("artifact_id") || h.builder.buildCount() != 0 {
				t.Fatalf("reuse: %v (builds %d)", cb.Body, h.builder.buildCount())
			}
			if got := h.metric("replica_reuse_hits_total", "source", "row"); got != 1 {
				t.Errorf("reuse_hits_total{source=row} = %v", got)
			}
			if cb.Field("master_node_ip") != "http://10.0.0.1:8089" {
				t.Errorf("master_node_ip = %q, want this job's download base", cb.Field("master_node_ip"))
			}

			// The object vanished behind TC's back: the row is not taken
			// for the artifact; the build runs (and uploads again).
			if err := rs.objects.Delete(context.Background(), built.Field("object_key")); err != nil {
				t.Fatal(err)
			}
			other := rs.replica(true, nil)
			rs.submit(other, "job-3", "alpine:3")
			if cb := other.terminal("job-3"); cb.Field("status") != "BUILT" || other.builder.buildCount() != 1 {
				t.Fatalf("after the object vanished: %v (builds %d)", cb.Body, other.builder.buildCount())
			}
			if _, err := rs.objects.Stat(context.Background(), built.Field("object_key")); err != nil {
				t.Errorf("object not uploaded again: %v", err)
			}
		})
	}
}

// failingDelete is a blob store whose deletes fail.
type failingDelete struct{ blobstore.Store }

func (failingDelete) Delete(ctx context.Context, key string) error {
	return &blobstore.Error{Backend: blobstore.BackendFS, Op: "delete", Key: key, Detail: "permission denied"}
}

// TestDeleteClaimsTheRow follows CubeMaster's delete: the row marked
// CLEANUP_PENDING is claimed, the object, its record and the directory go,
// then the row. A READY row is refused, a missing one is success.
func TestDeleteClaimsTheRow(t *testing.T) {
	for _, dl := range dbDialects {
		t.Run(dl.name, func(t *testing.T) {
			rs := newReplicaSet(t, dl)
			h := rs.replica(true, nil)
			ctx := context.Background()
			rs.submit(h, "job-1", "alpine:3")
			id := h.terminal("job-1").Field("artifact_id")
			dir := filepath.Join(h.cfg.Store.Dir, id)

			// READY: CubeMaster did not mark it; nothing is touched.
			if code, out := h.post("/tc/api/v1/artifact/delete", map[string]string{"artifact_id": id}); code != http.StatusConflict ||
				!strings.Contains(out["error"].(string), "READY") {
				t.Errorf("delete of a READY artifact = %d %v, want 409", code, out)
			}
			if _, err := os.Stat(dir); err != nil || len(rs.objectNames()) != 4 {
				t.Fatalf("a refused delete removed data: %v, objects %v", err, rs.objectNames())
			}

			code, body, err := h.master.DeleteArtifact(ctx, h.url, testToken, id)
			if err != nil || code != http.StatusOK {
				t.Fatalf("DeleteArtifact = %d %s %v", code, body, err)
			}
			if rows := rs.artifactRows(); len(rows) != 0 {
				t.Errorf("rows after delete: %v", rows)
			}
			if names := rs.objectNames(); len(names) != 0 {
				t.Errorf("objects after delete: %v", names)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("artifact directory after delete: %v", err)
			}
			// Again: no row any more, nothing to do, success.
			if code, out := h.post("/tc/api/v1/artifact/delete", map[string]string{"artifact_id": id}); code != http.StatusOK {
				t.Errorf("second delete = %d %v, want 200", code, out)
			}
		})
	}
}

// TestDeleteDataErrorKeepsRow: when the object cannot be deleted the row
// goes back to CLEANUP_PENDING with last_error, the answer is 500, and the
// local copy stays for the retry.
func TestDeleteDataErrorKeepsRow(t *testing.T) {
	dl := dbDialects[0]
	rs := newReplicaSet(t, dl)
	h := newHarness(t, func(c *config.Config) { c.Replicas.ReconcileInterval = time.Hour })
	db, err := masterdb.Open(context.Background(), rs.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h.database, h.objects = db, failingDelete{rs.objects}
	if err := h.master.UseDatabase(rs.seed, dl.driver); err != nil {
		t.Fatal(err)
	}
	h.start()
	rs.submit(h, "job-1", "alpine:3")
	id := h.terminal("job-1").Field("artifact_id")
	code, body, err := h.master.DeleteArtifact(context.Background(), h.url, testToken, id)
	if err != nil || code != http.StatusInternalServerError || !strings.Contains(body, "permission denied") {
		t.Fatalf("DeleteArtifact with the store failing = %d %s %v, want 500", code, body, err)
	}
	row, err := db.Artifact(context.Background(), id)
	if err != nil || row.Status != masterdb.ArtifactCleanupPending || !strings.Contains(row.LastError, "permission denied") {
		t.Errorf("row after the failed delete = %+v, %v", row, err)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Store.Dir, id)); err != nil {
		t.Errorf("local copy removed although the object was not: %v", err)
	}
}

// TestSweepDeletesStaleCleanups: rows CLEANUP_PENDING for over five minutes
// are deleted by the sweep, which runs soon after start; fresh ones and
// other statuses are left; with the sweep disabled nothing is deleted.
func TestSweepDeletesStaleCleanups(t *testing.T) {
	for _, dl := range dbDialects {
		t.Run(dl.name, func(t *testing.T) {
			rs := newReplicaSet(t, dl)
			builder := rs.replica(true, nil)
			var ids []string
			for i, ref := range []string{"alpine:1", "alpine:2", "alpine:3"} {
				id := "job-" + string(rune('1'+i))
				rs.submit(builder, id, ref)
				ids = append(ids, builder.terminal(id).Field("artifact_id"))
			}
			builder.stop()
			for _, id := range ids[:2] {
				if err := builder.master.Exec(context.Background(),
					"UPDATE t_cube_rootfs_artifact SET status = 'CLEANUP_PENDING' WHERE artifact_id = ?", id); err != nil {
					t.Fatal(err)
				}
			}
			if err := builder.master.AgeArtifact(context.Background(), ids[0], 6*time.Minute); err != nil {
				t.Fatal(err)
			}

			disabled := rs.replica(false, func(c *config.Config) {
				c.Replicas.ReconcileInterval, c.Replicas.ReconcileDisabled = 100*time.Millisecond, true
			})
			time.Sleep(500 * time.Millisecond) // several intervals: a disabled sweep must not run in any
			if got := disabled.metric("reconcile_sweeps_total", "result", "done"); got != 0 {
				t.Errorf("disabled sweep ran %v times", got)
			}
			disabled.stop()

			sweeper := rs.replica(false, func(c *config.Config) { c.Replicas.ReconcileInterval = 100 * time.Millisecond })
			wait.For(t, "a sweep", func() bool {
				return sweeper.metric("reconcile_sweeps_total", "result", "done") >= 1
			})
			if got := sweeper.metric("reconcile_deleted_total"); got != 1 {
				t.Errorf("reconcile_deleted_total = %v, want 1", got)
			}
			rows := rs.artifactRows()
			if _, ok := rows[ids[0]]; ok || rows[ids[1]] != masterdb.ArtifactCleanupPending || rows[ids[2]] != masterdb.ArtifactReady {
				t.Errorf("rows after the sweep = %v; want the stale one gone, the fresh CLEANUP_PENDING and READY kept", rows)
			}
			names := strings.Join(rs.objectNames(), " ")
			if strings.Contains(names, ids[0]) || !strings.Contains(names, ids[1]) || !strings.Contains(names, ids[2]) {
				t.Errorf("objects after the sweep: %s", names)
			}
		})
	}
}

// TestBuildLockLostWithDatabase: the database going away mid-build loses
// the lock (reported and counted), and the build still ends BUILT.
func TestBuildLockLostWithDatabase(t *testing.T) {
	for _, dl := range dbDialects {
		t.Run(dl.name, func(t *testing.T) {
			rs := newReplicaSet(t, dl)
			h := rs.replica(false, func(c *config.Config) { c.Replicas.LockKeepalive = 100 * time.Millisecond })
			entered, release := h.pauseAtPublish()
			rs.submit(h, "job-1", "alpine:3")
			<-entered
			restart := stopServer(t, rs.srv)
			wait.For(t, "the lock loss", func() bool { return h.metric("replica_lock_losses_total") >= 1 })
			close(release)
			if cb := h.terminal("job-1"); cb.Field("status") != "BUILT" {
				t.Fatalf("build with the database gone: %v", cb.Body)
			}
			restart()
			// Back: a new job row is checked and built (reused) again.
			rs.submit(h, "job-2", "alpine:3")
			if cb := h.terminal("job-2"); cb.Field("status") != "BUILT" {
				t.Fatalf("build after the database came back: %v", cb.Body)
			}
		})
	}
}

// TestBuildWithoutLockWhenDatabaseDown: a build whose lock cannot be taken
// because the database is unreachable goes on without it and ends BUILT.
func TestBuildWithoutLockWhenDatabaseDown(t *testing.T) {
	rs := newReplicaSet(t, dbDialects[1])
	h := rs.replica(false, nil)
	// The job row check passes, then the database goes before the lock.
	block := make(chan struct{})
	h.builder.mu.Lock()
	h.builder.resolveHook = func() { <-block }
	h.builder.mu.Unlock()
	rs.submit(h, "job-1", "alpine:3")
	stopServer(t, rs.srv)
	close(block)
	if cb := h.terminal("job-1"); cb.Field("status") != "BUILT" {
		t.Fatalf("build with the database down: %v", cb.Body)
	}
	if got := h.metric("replica_lock_unavailable_total"); got != 1 {
		t.Errorf("lock_unavailable_total = %v, want 1", got)
	}
}

// TestOrphanedLocalCopyRemoved: when another replica answered the delete,
// the builder's local copy has no row any more; its reconcile pass removes
// it, but never one whose BUILT report CubeMaster has not received.
func TestOrphanedLocalCopyRemoved(t *testing.T) {
	for _, dl := range dbDialects {
		t.Run(dl.name, func(t *testing.T) {
			rs := newReplicaSet(t, dl)
			builder := rs.replica(true, func(c *config.Config) {
				c.Replicas.ReconcileInterval = 100 * time.Millisecond
				c.Replicas.OrphanAge = 0
			})
			other := rs.replica(true, nil)
			rs.submit(builder, "job-1", "alpine:3")
			id := builder.terminal("job-1").Field("artifact_id")
			if code, body, err := other.master.DeleteArtifact(context.Background(), other.url, testToken, id); err != nil || code != http.StatusOK {
				t.Fatalf("delete through the other replica = %d %s %v", code, body, err)
			}
			wait.For(t, "the orphaned copy to go", func() bool {
				return builder.metric("reconcile_local_removed_total") == 1
			})
			if _, err := os.Stat(filepath.Join(builder.cfg.Store.Dir, id)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("orphaned copy after its removal: %v", err)
			}

			// A BUILT CubeMaster has not received yet: no row, but kept.
			builder.master.Hold()
			body := buildBody("job-2", "alpine:4")
			rs.createJob(body)
			if code, out := builder.post("/tc/api/v1/build", body); code != http.StatusOK {
				t.Fatalf("submit: %d %v", code, out)
			}
			builder.waitJob("job-2", "built")
			sweeps := builder.metric("reconcile_sweeps_total", "result", "done")
			wait.For(t, "two more reconcile passes", func() bool {
				return builder.metric("reconcile_sweeps_total", "result", "done") >= sweeps+2
			})
			j, err := builder.sp.Job(context.Background(), "job-2")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(builder.cfg.Store.Dir, j.ArtifactID)); err != nil {
				t.Errorf("a copy whose BUILT is undelivered was removed: %v", err)
			}
			builder.master.Release()
			if cb := builder.terminal("job-2"); cb.Field("status") != "BUILT" {
				t.Fatalf("job-2: %v", cb.Body)
			}
		})
	}
}

// TestPlantedRecordIsNotAdopted: an object and record that someone with
// write access to the bucket planted for a spec's predictable artifact id
// (unsigned, or signed with another secret, or a genuine record beside a
// replaced object) are not adopted: the replica builds, uploads its own,
// and counts the record it refused.
func TestPlantedRecordIsNotAdopted(t *testing.T) {
	dl := dbDialects[0]
	for _, plant := range []struct {
		name, reason string
		edit         func(t *testing.T, rs *replicaSet, key string)
	}{
		{"signed with another secret", "signature", nil},
		{"unsigned", "unsigned", func(t *testing.T, rs *replicaSet, key string) {
			data, err := rs.objects.Get(context.Background(), recordKeyOf(key), 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			// The envelope's BUILT fields, as a record an older release or
			// anyone with write access to the bucket could store.
			var env struct {
				Built json.RawMessage `json:"built"`
			}
			if err := json.Unmarshal(data, &env); err != nil {
				t.Fatal(err)
			}
			putObject(t, rs.objects, recordKeyOf(key), env.Built) // the BUILT fields alone
		}},
		{"object replaced", "mismatch", func(t *testing.T, rs *replicaSet, key string) {
			info, err := rs.objects.Stat(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			// Same size, other bytes, and the recorded sha256 claimed.
			evil := bytes.Repeat([]byte("x"), int(info.Size))
			if err := rs.objects.Put(context.Background(), key, bytes.NewReader(evil), info.Size, sha256Hex(evil)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(rs.root, key+blobstore.SidecarSuffix),
				[]byte(info.SHA256+"  "+filepath.Base(key)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(strings.ReplaceAll(plant.name, " ", "_"), func(t *testing.T) {
			rs := newReplicaSet(t, dl)
			secret := testRecordSecret
			if plant.edit == nil {
				secret = "the attacker's own secret, not ours"
			}
			attacker := rs.replica(false, func(c *config.Config) { c.ArtifactStore.RecordSecret = config.Secret(secret) })
			rs.submit(attacker, "job-plant", "alpine:3")
			planted := attacker.terminal("job-plant")
			key := planted.Field("object_key")
			if planted.Field("status") != "BUILT" || key == "" {
				t.Fatalf("planting build: %v", planted.Body)
			}
			if plant.edit != nil {
				plant.edit(t, rs, key)
			}
			h := rs.replica(false, nil)
			rs.submit(h, "job-1", "alpine:3")
			if cb := h.terminal("job-1"); cb.Field("status") != "BUILT" || cb.Field("object_key") != key {
				t.Fatalf("job after the plant: %v", cb.Body)
			}
			if n := h.builder.buildCount(); n != 1 {
				t.Errorf("replica built %d times after a planted record, want 1", n)
			}
			if n := h.metric("blobstore_records_rejected_total", "reason", plant.reason); n != 1 {
				t.Errorf("records_rejected_total{reason=%s} = %v, want 1", plant.reason, n)
			}
			if n := h.metric("replica_reuse_hits_total", "source", "object"); n != 0 {
				t.Errorf("reuse_hits_total{source=object} = %v, want 0", n)
			}
			// What the replica uploaded in its place is adopted by the next.
			next := rs.replica(false, nil)
			rs.submit(next, "job-2", "alpine:3")
			if cb := next.terminal("job-2"); cb.Field("status") != "BUILT" || next.builder.buildCount() != 0 {
				t.Errorf("a replica after the rebuild: %v (builds %d), want the rebuilt object adopted", cb.Body, next.builder.buildCount())
			}
		})
	}
}

// putObject stores data at key with its sha256.
func putObject(t *testing.T, store blobstore.Store, key string, data []byte) {
	t.Helper()
	if err := store.Put(context.Background(), key, bytes.NewReader(data), int64(len(data)), sha256Hex(data)); err != nil {
		t.Fatal(err)
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// gatedStat is a blob store whose Stat, while armed, looks the object up,
// then waits for release before it answers with what it saw: a reuse that
// decided on the object is held there.
type gatedStat struct {
	blobstore.Store
	armed   *atomic.Bool
	entered chan string
	release chan struct{}
}

func (g gatedStat) Stat(ctx context.Context, key string) (blobstore.Info, error) {
	info, err := g.Store.Stat(ctx, key)
	if g.armed.CompareAndSwap(true, false) {
		g.entered <- key
		<-g.release
	}
	return info, err
}

// TestDeleteWaitsForReuse: a delete of an artifact that a job is reusing
// at that moment, on this replica or another, is refused (409, the row
// back to CLEANUP_PENDING) rather than removing what the job reports
// BUILT; once the reuse is over, the delete goes through. A BUILT report
// CubeMaster has not received yet holds deletes off the same way.
func TestDeleteWaitsForReuse(t *testing.T) {
	for _, dl := range dbDialects {
		t.Run(dl.name, func(t *testing.T) {
			rs := newReplicaSet(t, dl)
			ctx := context.Background()
			gate := gatedStat{armed: new(atomic.Bool), entered: make(chan string, 1), release: make(chan struct{})}
			h := rs.replicaWith(true, nil, func(s blobstore.Store) blobstore.Store { gate.Store = s; return gate })
			other := rs.replica(true, nil)
			rs.submit(h, "job-1", "alpine:3")
			first := h.terminal("job-1")
			id, key := first.Field("artifact_id"), first.Field("object_key")

			// This replica reuses the READY row's object while the delete
			// comes in: refused.
			gate.armed.Store(true)
			rs.submit(h, "job-2", "alpine:3")
			<-gate.entered
			for name, via := range map[string]*harness{"this replica": h, "another replica": other} {
				code, body, err := h.master.DeleteArtifact(ctx, via.url, testToken, id)
				if err != nil || code != http.StatusConflict {
					t.Errorf("delete through %s during a reuse = %d %s %v, want 409", name, code, body, err)
				}
				if rows := rs.artifactRows(); rows[id] != masterdb.ArtifactCleanupPending {
					t.Errorf("row after a refused delete: %v, want CLEANUP_PENDING", rows)
				}
			}
			close(gate.release)
			cb := h.terminal("job-2")
			if cb.Field("status") != "BUILT" || cb.Field("object_key") != key {
				t.Fatalf("the reusing job: %v", cb.Body)
			}
			if _, err := rs.objects.Stat(ctx, key); err != nil {
				t.Fatalf("the object a BUILT report names is gone: %v", err)
			}
			if _, err := os.Stat(cb.Field("ext4_path")); err != nil {
				t.Fatalf("the local copy a BUILT report names is gone: %v", err)
			}

			// A BUILT naming it that CubeMaster has not received: refused.
			h.master.Hold()
			rs.submit(h, "job-3", "alpine:3")
			h.waitJob("job-3", spool.StateBuilt)
			if code, body, err := h.master.DeleteArtifact(ctx, h.url, testToken, id); err != nil || code != http.StatusConflict {
				t.Errorf("delete with a BUILT undelivered = %d %s %v, want 409", code, body, err)
			}
			h.master.Release()
			h.terminal("job-3")

			// Another replica building or reusing it holds its lock.
			lock, ok, err := other.database.TryLock(ctx, masterdb.BuildLockName(first.Field("template_spec_fingerprint")), masterdb.LockOptions{})
			if err != nil || !ok {
				t.Fatalf("take the build lock as a replica would: %v %v", ok, err)
			}
			if code, body, err := h.master.DeleteArtifact(ctx, h.url, testToken, id); err != nil || code != http.StatusConflict {
				t.Errorf("delete while a replica holds the build lock = %d %s %v, want 409", code, body, err)
			}
			if err := lock.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if code, body, err := h.master.DeleteArtifact(ctx, h.url, testToken, id); err != nil || code != http.StatusOK {
				t.Fatalf("delete once nothing uses the artifact = %d %s %v, want 200", code, body, err)
			}
			if _, err := rs.objects.Stat(ctx, key); !errors.Is(err, blobstore.ErrNotFound) {
				t.Errorf("object after the delete: %v", err)
			}
		})
	}
}

// TestLostLockWaitsBeforePublish: a build whose lock was lost (its session
// killed) and taken by another replica meanwhile does not publish next to
// that replica's upload: it waits until the lock is free again, then
// publishes, and the job ends BUILT with its object.
func TestLostLockWaitsBeforePublish(t *testing.T) {
	for _, dl := range dbDialects {
		t.Run(dl.name, func(t *testing.T) {
			rs := newReplicaSet(t, dl)
			ctx := context.Background()
			h := rs.replica(false, func(c *config.Config) { c.Replicas.LockKeepalive = time.Hour })
			entered, release := h.pauseAtPublish()
			rs.submit(h, "job-1", "alpine:3")
			<-entered
			j := h.waitJob("job-1", spool.StateRunning)
			name := masterdb.BuildLockName(j.Fingerprint)
			kill := "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
			if dl.driver == masterdb.DriverMySQL {
				var id int64
				if err := rs.seed.QueryRow("SELECT IS_USED_LOCK(?)", name).Scan(&id); err != nil {
					t.Fatal(err)
				}
				kill = "KILL " + strconv.FormatInt(id, 10)
			}
			if _, err := rs.seed.Exec(kill); err != nil {
				t.Fatalf("%s: %v", kill, err)
			}
			db, err := masterdb.Open(ctx, rs.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var other *masterdb.Lock
			wait.For(t, "another replica to take the lost lock", func() bool {
				l, ok, err := db.TryLock(ctx, name, masterdb.LockOptions{Keepalive: time.Hour})
				other = l
				return err == nil && ok
			})
			close(release)
			wait.For(t, "the build to find its lock lost", func() bool {
				return h.metric("replica_publish_lock_lost_total") == 1
			})
			if names := rs.objectNames(); len(names) != 0 {
				t.Errorf("published while another replica held the lock: %v", names)
			}
			if err := other.Release(ctx); err != nil {
				t.Fatal(err)
			}
			cb := h.terminal("job-1")
			if cb.Field("status") != "BUILT" || cb.Field("object_key") == "" {
				t.Fatalf("after the lock came back: %v", cb.Body)
			}
			if _, err := rs.objects.Stat(ctx, cb.Field("object_key")); err != nil {
				t.Errorf("object of the BUILT report: %v", err)
			}
		})
	}
}

// TestOrphanAgeCountsFromDelivery: a BUILT report retried across a
// CubeMaster outage longer than replicas.orphan_age reaches CubeMaster
// long after the copy was built; CubeMaster then registers it when it can.
// The copy must survive that: its age counts from the delivery, and it is
// removed only once its row is gone on two passes an interval apart after
// the age has passed.
func TestOrphanAgeCountsFromDelivery(t *testing.T) {
	dl := dbDialects[0]
	rs := newReplicaSet(t, dl)
	const orphanAge = 1500 * time.Millisecond
	h := rs.replica(false, func(c *config.Config) {
		c.Replicas.ReconcileInterval = 100 * time.Millisecond
		c.Replicas.OrphanAge = orphanAge
	})
	passes := func(n float64) {
		t.Helper()
		done := h.metric("reconcile_sweeps_total", "result", "done")
		wait.For(t, "reconcile passes", func() bool {
			return h.metric("reconcile_sweeps_total", "result", "done") >= done+n
		})
	}
	h.master.Hold() // CubeMaster down
	rs.submit(h, "job-1", "alpine:3")
	j := h.waitJob("job-1", spool.StateBuilt)
	copyPath := filepath.Join(h.cfg.Store.Dir, j.ArtifactID)
	time.Sleep(orphanAge + 500*time.Millisecond) // the outage outlasts the age
	h.master.Release()
	delivered := time.Now()
	h.terminal("job-1")
	passes(3)
	if _, err := os.Stat(copyPath); err != nil {
		t.Fatalf("the copy went right after its BUILT was delivered: %v", err)
	}
	if n := h.metric("reconcile_local_orphans_kept", "reason", "young"); n != 1 {
		t.Errorf("local_orphans_kept{reason=young} = %v, want 1", n)
	}
	// CubeMaster registers it late (its first lock wait timed out, and
	// its reconciler replayed the job), still inside the age.
	if _, err := rs.seed.Exec("INSERT INTO t_cube_rootfs_artifact (artifact_id, template_spec_fingerprint, status) VALUES (?, ?, 'READY')",
		j.ArtifactID, j.Fingerprint); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(delivered); d > orphanAge {
		t.Fatalf("the test registered the row %s after the delivery, past the orphan age: too slow to tell", d)
	}
	time.Sleep(orphanAge)
	passes(2)
	if _, err := os.Stat(copyPath); err != nil {
		t.Fatalf("a registered copy was removed: %v", err)
	}
	// Another replica deletes it: now the copy is an orphan, and goes.
	if _, err := rs.seed.Exec("DELETE FROM t_cube_rootfs_artifact WHERE artifact_id = ?", j.ArtifactID); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the orphaned copy to go", func() bool { return h.metric("reconcile_local_removed_total") == 1 })
	if _, err := os.Stat(copyPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphaned copy after its removal: %v", err)
	}
}

// recordKeyOf is where the blob store keeps the record beside the object
// at key: the bucket layout replicas share.
func recordKeyOf(objectKey string) string {
	return strings.TrimSuffix(objectKey, ".ext4") + ".json"
}
