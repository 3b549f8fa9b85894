package spool

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/tmpfs"
)

func openTest(t testing.TB) *Spool {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "state", "spool.db"))
}

func openAt(t testing.TB, path string) *Spool {
	t.Helper()
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustEnqueue(t testing.TB, s *Spool, id string) Job {
	t.Helper()
	j, err := s.Enqueue(context.Background(), NewJob{ID: id, Request: []byte(`{"job_id":"` + id + `"}`)}, 100)
	if err != nil {
		t.Fatalf("Enqueue(%s): %v", id, err)
	}
	return j
}

func TestOpenCreatesPrivateWALDatabase(t *testing.T) {
	s := openTest(t)
	fi, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("spool file mode = %o, want 600", perm)
	}
	di, err := os.Stat(filepath.Dir(s.Path()))
	if err != nil {
		t.Fatal(err)
	}
	if perm := di.Mode().Perm(); perm != 0o700 {
		t.Errorf("spool dir mode = %o, want 700", perm)
	}
	var mode string
	if err := s.db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	var fk int
	if err := s.db.QueryRow("PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
		t.Errorf("foreign_keys = %d, %v; want 1", fk, err)
	}
	if v, _ := s.version(context.Background()); v != len(migrations) {
		t.Errorf("schema version = %d, want %d", v, len(migrations))
	}
}

func TestOpenMigratesOlderSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spool.db")
	old, err := open(ctx, path, false, busyTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.migrate(ctx, 1); err != nil {
		t.Fatalf("migrate to v1: %v", err)
	}
	if _, err := old.db.Exec(`INSERT INTO jobs (job_id, state, request, created_at, updated_at) VALUES ('j1', 'queued', '{}', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	old.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open on v1 spool: %v", err)
	}
	defer s.Close()
	j, err := s.Job(ctx, "j1")
	if err != nil {
		t.Fatalf("Job after migration: %v", err)
	}
	if j.State != StateQueued || j.Fingerprint != "" {
		t.Errorf("migrated job = %+v", j)
	}
	if err := s.PutArtifact(ctx, Artifact{ID: "rfs-1", Fingerprint: "fp", Path: "/x", SHA256: "ab", Size: 1}); err != nil {
		t.Errorf("artifacts table missing after migration: %v", err)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	if _, err := s.db.Exec("PRAGMA user_version = 99"); err != nil {
		t.Fatal(err)
	}
	path := s.Path()
	s.Close()
	if _, err := Open(ctx, path); err == nil {
		t.Fatal("Open of a spool from a newer version succeeded")
	}
}

func TestOpenCorruptSpoolLeavesFileInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	garbage := bytes.Repeat([]byte("this is not sqlite "), 512)
	if err := os.WriteFile(path, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), path)
	if err == nil {
		t.Fatal("Open of a garbage file succeeded")
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("Open error = %v, want ErrCorrupt", err)
	}
	got, rerr := os.ReadFile(path)
	if rerr != nil || !bytes.Equal(got, garbage) {
		t.Errorf("corrupt spool file was modified (read err %v)", rerr)
	}
}

func TestOpenUnreadableSpool(t *testing.T) {
	if os.Geteuid() == 0 {
		// root reads anything: use a directory where the file should be.
		path := filepath.Join(t.TempDir(), "spool.db")
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(context.Background(), path); err == nil {
			t.Fatal("Open of a directory succeeded")
		}
		return
	}
	path := filepath.Join(t.TempDir(), "spool.db")
	if err := os.WriteFile(path, nil, 0o000); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), path); err == nil {
		t.Fatal("Open of an unreadable file succeeded")
	}
}

func TestEnqueueDuplicateAndQueueFull(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	if _, err := s.Enqueue(ctx, NewJob{ID: "a", Request: []byte("{}")}, 2); err != nil {
		t.Fatal(err)
	}
	j, err := s.Enqueue(ctx, NewJob{ID: "a", Request: []byte("{}")}, 2)
	if !errors.Is(err, ErrJobExists) || j.ID != "a" || j.State != StateQueued {
		t.Errorf("duplicate Enqueue = %+v, %v; want existing job and ErrJobExists", j, err)
	}
	if _, err := s.Enqueue(ctx, NewJob{ID: "b", Request: []byte("{}")}, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Enqueue(ctx, NewJob{ID: "c", Request: []byte("{}")}, 2); !errors.Is(err, ErrQueueFull) {
		t.Errorf("third Enqueue with limit 2 = %v, want ErrQueueFull", err)
	}
	// Running jobs do not count against the queue.
	if _, _, err := s.ClaimNext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Enqueue(ctx, NewJob{ID: "c", Request: []byte("{}")}, 2); err != nil {
		t.Errorf("Enqueue after a claim = %v, want room", err)
	}
}

func TestClaimIsFIFOAndRequeueKeepsPlace(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	for _, id := range []string{"first", "second", "third"} {
		mustEnqueue(t, s, id)
	}
	j, ok, err := s.ClaimNext(ctx)
	if err != nil || !ok || j.ID != "first" || j.Attempts != 1 || j.State != StateRunning {
		t.Fatalf("ClaimNext = %+v, %v, %v; want first, attempt 1", j, ok, err)
	}
	if err := s.Requeue(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	j, _, _ = s.ClaimNext(ctx)
	if j.ID != "first" || j.Attempts != 2 {
		t.Errorf("after requeue ClaimNext = %s attempt %d, want first attempt 2", j.ID, j.Attempts)
	}
	j, _, _ = s.ClaimNext(ctx)
	if j.ID != "second" {
		t.Errorf("ClaimNext = %s, want second", j.ID)
	}
	n, err := s.RequeueRunning(ctx)
	if err != nil || n != 2 {
		t.Errorf("RequeueRunning = %d, %v; want 2", n, err)
	}
	q, r, err := s.Counts(ctx)
	if err != nil || q != 3 || r != 0 {
		t.Errorf("Counts = %d queued %d running, %v; want 3, 0", q, r, err)
	}
	s.ClaimNext(ctx)
	s.ClaimNext(ctx)
	s.ClaimNext(ctx)
	if _, ok, err := s.ClaimNext(ctx); ok || err != nil {
		t.Errorf("ClaimNext on empty queue = %v, %v; want false", ok, err)
	}
}

func TestFinishCommitsTerminalReportAndScrubsRequest(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	mustEnqueue(t, s, "j")
	s.ClaimNext(ctx)
	body := []byte(`{"status":"BUILT"}`)
	if err := s.Finish(ctx, "j", StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: body}); err != nil {
		t.Fatal(err)
	}
	j, err := s.Job(ctx, "j")
	if err != nil {
		t.Fatal(err)
	}
	if j.State != StateBuilt || j.Request != nil || !bytes.Equal(j.Result, body) || j.Progress != 100 || j.FinishedAt.IsZero() {
		t.Errorf("finished job = %+v", j)
	}
	reps, _ := s.Reports(ctx, "j")
	if len(reps) != 1 || !reps[0].Terminal || !bytes.Equal(reps[0].Body, body) {
		t.Fatalf("outbox = %+v, want the terminal report", reps)
	}
	if err := s.Finish(ctx, "missing", StateFailed, "PULLING", "x", Report{Kind: KindTerminal, Body: body}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Finish of unknown job = %v, want ErrNotFound", err)
	}
	if err := s.Finish(ctx, "j", StateRunning, "", "", Report{Kind: KindTerminal, Body: body}); err == nil {
		t.Error("Finish with a non-terminal state succeeded")
	}
	s.RemoveReport(ctx, reps[0].ID)
	if err := s.Resend(ctx, "j"); err != nil {
		t.Fatal(err)
	}
	reps, _ = s.Reports(ctx, "j")
	if len(reps) != 1 || !bytes.Equal(reps[0].Body, body) {
		t.Errorf("after Resend outbox = %+v", reps)
	}
}

// TestFinishedJobTakesNoMoreChange: a job ends once. A second Finish (a
// cancel racing the build's own end), a late progress update or report is
// refused with ErrFinished and leaves the job and its outbox as they were.
func TestFinishedJobTakesNoMoreChange(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	mustEnqueue(t, s, "first")
	mustEnqueue(t, s, "second")
	s.ClaimNext(ctx)
	s.ClaimNext(ctx)
	for _, id := range []string{"first", "second"} {
		if err := s.Finish(ctx, id, StateFailed, "PULLING", "cancelled", Report{Kind: KindTerminal, Body: []byte(`{"status":"FAILED"}`)}); err != nil {
			t.Fatalf("Finish %s: %v", id, err)
		}
	}
	mustEnqueue(t, s, "waiting")
	if err := s.Finish(ctx, "waiting", StateFailed, "PULLING", "cancelled", Report{Kind: KindTerminal, Body: []byte(`{"status":"FAILED"}`)}); err != nil {
		t.Fatalf("Finish of a queued job: %v", err)
	}
	if _, ok, _ := s.ClaimNext(ctx); ok {
		t.Error("ClaimNext claimed a finished job")
	}
	for _, id := range []string{"first", "second", "waiting"} {
		err := s.Finish(ctx, id, StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte(`{"status":"BUILT"}`)})
		if !errors.Is(err, ErrFinished) {
			t.Errorf("second Finish of %s = %v, want ErrFinished", id, err)
		}
		if err := s.SetProgress(ctx, id, "BUILDING_EXT4", 40, &Report{Kind: KindStatus, Body: []byte(`{"status":"RUNNING"}`)}); !errors.Is(err, ErrFinished) {
			t.Errorf("SetProgress of finished %s = %v, want ErrFinished", id, err)
		}
		if err := s.AddReport(ctx, id, Report{Kind: KindPull, Body: []byte(`{}`)}); !errors.Is(err, ErrFinished) {
			t.Errorf("AddReport of finished %s = %v, want ErrFinished", id, err)
		}
		j, err := s.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != StateFailed || j.Phase != "PULLING" || j.Error != "cancelled" || string(j.Result) != `{"status":"FAILED"}` {
			t.Errorf("job %s after refused changes = %+v, want it FAILED as first finished", id, j)
		}
		reps, _ := s.Reports(ctx, id)
		if len(reps) != 1 || !reps[0].Terminal || string(reps[0].Body) != `{"status":"FAILED"}` {
			t.Errorf("outbox of %s = %+v, want only the first terminal report", id, reps)
		}
	}
	if err := s.SetProgress(ctx, "missing", "PULLING", 5, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetProgress of unknown job = %v, want ErrNotFound", err)
	}
	if err := s.AddReport(ctx, "missing", Report{Kind: KindPull, Body: []byte(`{}`)}); !errors.Is(err, ErrNotFound) {
		t.Errorf("AddReport of unknown job = %v, want ErrNotFound", err)
	}
}

// TestPhaseReportsAreNeverSuperseded: however far delivery lags, every
// phase report stays, in order; a heartbeat supersedes only the
// heartbeats of its phase, never a phase report nor another phase's.
func TestPhaseReportsAreNeverSuperseded(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	mustEnqueue(t, s, "j")
	add := func(kind, body string) {
		t.Helper()
		if err := s.SetProgress(ctx, "j", "X", 5, &Report{Kind: kind, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	add(KindPhase, "PULLING/5")
	add(KindStatus, "PULLING/5 beat")
	add(KindPhase, "UNPACKING/20")
	add(KindFingerprint, "fingerprint")
	add(KindPhase, "BUILDING_EXT4/40")
	add(KindStatus, "BUILDING_EXT4/50 beat")
	add(KindPull, "pull")
	add(KindStatus, "BUILDING_EXT4/60 beat") // supersedes the 50 beat only
	outbox := func() []string {
		t.Helper()
		reps, err := s.Reports(ctx, "j")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range reps {
			got = append(got, string(r.Body))
		}
		return got
	}
	want := []string{"PULLING/5", "PULLING/5 beat", "UNPACKING/20", "fingerprint", "BUILDING_EXT4/40", "pull", "BUILDING_EXT4/60 beat"}
	if got := outbox(); !slices.Equal(got, want) {
		t.Errorf("outbox = %q\nwant     %q", got, want)
	}
	// Once a phase report is delivered, the heartbeats after it are still
	// of its phase, and still supersede each other.
	reps, _ := s.Reports(ctx, "j")
	for _, r := range reps[:5] {
		if err := s.RemoveReport(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
	}
	add(KindStatus, "BUILDING_EXT4/70 beat")
	if got, want := outbox(), []string{"pull", "BUILDING_EXT4/70 beat"}; !slices.Equal(got, want) {
		t.Errorf("outbox after delivery = %q, want %q", got, want)
	}
}

func TestReportsCoalesceAndStayOrderedPerJob(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	mustEnqueue(t, s, "a")
	mustEnqueue(t, s, "b")
	add := func(job, kind, body string) {
		t.Helper()
		if err := s.SetProgress(ctx, job, "PULLING", 5, &Report{Kind: kind, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	add("a", KindStatus, "a1")
	add("a", KindFingerprint, "a2")
	add("b", KindStatus, "b1")
	add("a", KindStatus, "a3") // supersedes a1
	if err := s.Finish(ctx, "a", StateFailed, "PULLING", "boom", Report{Kind: KindTerminal, Body: []byte("a4")}); err != nil {
		t.Fatal(err)
	}
	var got []string
	reps, _ := s.Reports(ctx, "a")
	for _, r := range reps {
		got = append(got, string(r.Body))
	}
	want := []string{"a2", "a3", "a4"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("job a outbox = %v, want %v", got, want)
	}

	now := time.Now()
	due, err := s.DueReports(ctx, now.Add(time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 2 {
		t.Fatalf("DueReports = %d reports, want the head of each job", len(due))
	}
	heads := map[string]string{}
	for _, r := range due {
		heads[r.JobID] = string(r.Body)
	}
	if heads["a"] != "a2" || heads["b"] != "b1" {
		t.Errorf("heads = %v, want a2 and b1", heads)
	}

	// A retried head blocks its job's later reports until it is due.
	later := now.Add(time.Hour)
	if err := s.RetryReport(ctx, reps[0].ID, later, "connection refused"); err != nil {
		t.Fatal(err)
	}
	due, _ = s.DueReports(ctx, now.Add(time.Second), 10)
	if len(due) != 1 || due[0].JobID != "b" {
		t.Errorf("DueReports with a's head backing off = %+v, want only b", due)
	}
	next, ok, err := s.NextDue(ctx)
	if err != nil || !ok || next.After(now.Add(time.Second)) {
		t.Errorf("NextDue = %v, %v, %v; want b's report, due now", next, ok, err)
	}
	depth, _ := s.OutboxDepth(ctx)
	if depth != 4 {
		t.Errorf("OutboxDepth = %d, want 4", depth)
	}
	r, _ := s.Reports(ctx, "a")
	if r[0].Attempts != 1 || r[0].LastError != "connection refused" {
		t.Errorf("retried report = %+v", r[0])
	}
}

func TestArtifactsAndPurge(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	mt := time.Unix(1700000000, 123456789)
	a := Artifact{ID: "rfs-abc", Fingerprint: "fp1", Path: "/store/rfs-abc/rfs-abc.ext4", SHA256: "00ff", Size: 2 << 20, ModTime: mt, Result: []byte(`{}`)}
	if err := s.PutArtifact(ctx, a); err != nil {
		t.Fatal(err)
	}
	got, err := s.ArtifactByFingerprint(ctx, "fp1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != a.ID || got.Path != a.Path || got.Size != a.Size || !got.ModTime.Equal(mt) || got.SHA256 != a.SHA256 {
		t.Errorf("ArtifactByFingerprint = %+v, want %+v", got, a)
	}
	if err := s.DeleteArtifact(ctx, "rfs-abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ArtifactByFingerprint(ctx, "fp1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after delete = %v, want ErrNotFound", err)
	}

	mustEnqueue(t, s, "done")
	mustEnqueue(t, s, "pending-report")
	mustEnqueue(t, s, "queued")
	for _, id := range []string{"done", "pending-report"} {
		if err := s.Finish(ctx, id, StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	reps, _ := s.Reports(ctx, "done")
	s.RemoveReport(ctx, reps[0].ID)
	n, err := s.PurgeFinished(ctx, time.Now().Add(time.Minute))
	if err != nil || n != 1 {
		t.Errorf("PurgeFinished = %d, %v; want 1 (the delivered one)", n, err)
	}
	if _, err := s.Job(ctx, "pending-report"); err != nil {
		t.Errorf("job with an undelivered report was purged: %v", err)
	}
	if _, err := s.Job(ctx, "queued"); err != nil {
		t.Errorf("queued job was purged: %v", err)
	}
}

func TestReadOnlyOpenSeesWritersCommits(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	mustEnqueue(t, s, "visible")
	ro, err := OpenReadOnly(ctx, s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	jobs, err := ro.Jobs(ctx, JobFilter{})
	if err != nil || len(jobs) != 1 || jobs[0].ID != "visible" {
		t.Fatalf("read-only Jobs = %+v, %v", jobs, err)
	}
	if _, err := ro.Enqueue(ctx, NewJob{ID: "nope", Request: []byte("{}")}, 10); err == nil {
		t.Error("Enqueue through a read-only spool succeeded")
	}
	if _, err := OpenReadOnly(ctx, filepath.Join(t.TempDir(), "missing.db")); err == nil {
		t.Error("OpenReadOnly of a missing file succeeded")
	}
}

func TestWALAndSHMArePrivateFromTheFirstOpen(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	s := openTest(t)
	mustEnqueue(t, s, "j") // a write makes sure the WAL exists
	for _, f := range []string{s.Path(), s.Path() + "-wal", s.Path() + "-shm"} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatalf("stat %s: %v", f, err)
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s mode = %o, want 600", filepath.Base(f), perm)
		}
	}
}

func TestOpenRestrictsAnOlderWorldReadableSpool(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openAt(t, path)
	mustEnqueue(t, s, "j")
	s.Close()
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(f, 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	openAt(t, path)
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(f)
		if err != nil {
			continue // a clean close may remove the WAL
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s mode after reopen = %o, want 600", filepath.Base(f), perm)
		}
	}
}

// TestFinishedJobLeavesNoSecretOnDisk writes a request carrying a registry
// password, finishes the job, and looks for the password in every file of
// the spool, WAL and shared memory included.
func TestFinishedJobLeavesNoSecretOnDisk(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	const secret = "hunter2-registry-password-5f2c"
	for i := range 20 { // enough rows to span pages, like a busy spool
		id := fmt.Sprintf("j%d", i)
		req := fmt.Sprintf(`{"job_id":%q,"registry_password":%q,"pad":%q}`, id, secret, strings.Repeat("x", 500))
		if _, err := s.Enqueue(ctx, NewJob{ID: id, Request: []byte(req), Secret: true}, 100); err != nil {
			t.Fatal(err)
		}
	}
	found := func() []string {
		var in []string
		for _, f := range []string{s.Path(), s.Path() + "-wal", s.Path() + "-shm"} {
			b, err := os.ReadFile(f)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			if bytes.Contains(b, []byte(secret)) {
				in = append(in, filepath.Base(f))
			}
		}
		return in
	}
	if len(found()) == 0 {
		t.Fatal("the password is nowhere in the spool before the jobs finish: the check cannot see it")
	}
	for i := range 20 {
		id := fmt.Sprintf("j%d", i)
		s.ClaimNext(ctx)
		if err := s.Finish(ctx, id, StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if in := found(); len(in) > 0 {
		t.Errorf("the registry password is still in %v after every job finished", in)
	}
}

// TestCredentialsOfOlderReleasesAreScrubbed: a job a release without the
// secret column accepted may hold credentials, so finishing it after the
// upgrade empties the WAL as before.
func TestCredentialsOfOlderReleasesAreScrubbed(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spool.db")
	old, err := open(ctx, path, false, busyTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.migrate(ctx, 2); err != nil {
		t.Fatalf("migrate to v2: %v", err)
	}
	const secret = "older-release-registry-password-91ad"
	req := fmt.Sprintf(`{"registry_password":%q}`, secret)
	if _, err := old.db.Exec(`INSERT INTO jobs (job_id, state, request, created_at, updated_at) VALUES ('j1', 'running', ?, 1, 1)`, req); err != nil {
		t.Fatal(err)
	}
	// Close would checkpoint and delete the WAL; keep the old frames
	// there, as a crash of the older release would.
	keepWAL(t, old)
	s := openAt(t, path)
	mustEnqueue(t, s, "other") // frames after the old ones
	if err := s.Finish(ctx, "j1", StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if in := filesWith(t, s, secret); len(in) > 0 {
		t.Errorf("the older job's password is still in %v after it finished", in)
	}
}

// TestFinishWithoutCredentialsKeepsTheWAL: a job whose request held no
// credentials ends without the checkpoint, and one with them empties the
// WAL.
func TestFinishWithoutCredentialsKeepsTheWAL(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	for _, id := range []string{"plain", "secret"} {
		if _, err := s.Enqueue(ctx, NewJob{ID: id, Request: []byte(`{"job_id":"` + id + `"}`), Secret: id == "secret"}, 10); err != nil {
			t.Fatal(err)
		}
	}
	walSize := func() int64 {
		fi, err := os.Stat(s.Path() + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	if err := s.Finish(ctx, "plain", StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if n := walSize(); n == 0 {
		t.Error("the WAL was emptied after a job without credentials")
	}
	if err := s.Finish(ctx, "secret", StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if n := walSize(); n != 0 {
		t.Errorf("the WAL holds %d bytes after a job with credentials ended, want it emptied", n)
	}
}

// TestDurableCommitsSyncOthersDoNot: the accept and the end of a job
// commit on the connections that wait for the disk, the rest on those
// that do not.
func TestDurableCommitsSyncOthersDoNot(t *testing.T) {
	s := openTest(t)
	for _, c := range []struct {
		name string
		pool interface {
			QueryRow(string, ...any) *sql.Row
		}
		want int
	}{{"durable", s.durable, 2}, {"db", s.db, 1}} {
		var got int
		if err := c.pool.QueryRow("PRAGMA synchronous").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s pool: synchronous = %d, want %d (2 FULL, 1 NORMAL)", c.name, got, c.want)
		}
	}
}

// keepWAL closes s the way a crash would: without the last connection's
// checkpoint, so the WAL stays as it was.
func keepWAL(t testing.TB, s *Spool) {
	t.Helper()
	for _, db := range []*sql.DB{s.db, s.durable} {
		if _, err := db.Exec("PRAGMA wal_autocheckpoint = 0"); err != nil {
			t.Fatal(err)
		}
	}
	wal := s.Path() + "-wal"
	saved, err := os.ReadFile(wal)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.WriteFile(wal, saved, 0o600); err != nil {
		t.Fatal(err)
	}
}

// filesWith lists the spool's files (database, WAL, shared memory) that
// contain needle.
func filesWith(t testing.TB, s *Spool, needle string) []string {
	t.Helper()
	var in []string
	for _, f := range []string{s.Path(), s.Path() + "-wal", s.Path() + "-shm"} {
		b, err := os.ReadFile(f)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(needle)) {
			in = append(in, filepath.Base(f))
		}
	}
	return in
}

// TestFullDiskIsCannotWrite: with the spool's filesystem full, a commit
// fails with ErrCannotWrite (a condition of the volume, worth a retry),
// and the jobs committed before are intact.
func TestFullDiskIsCannotWrite(t *testing.T) {
	dir := tmpfs.Mount(t, "4m")
	s := openAt(t, filepath.Join(dir, "spool.db"))
	mustEnqueue(t, s, "before")
	// An empty WAL makes the next commit grow it on the full disk.
	if _, err := s.db.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
	}
	tmpfs.Fill(t, dir)
	_, err := s.Enqueue(context.Background(), NewJob{ID: "after", Request: []byte(`{}`)}, 100)
	if !errors.Is(err, ErrCannotWrite) {
		t.Fatalf("Enqueue on a full disk = %v, want ErrCannotWrite", err)
	}
	if j, err := s.Job(context.Background(), "before"); err != nil || j.State != StateQueued {
		t.Errorf("Job(before) = %+v, %v; want it queued still", j, err)
	}
	// A constraint failure is about the data, not the volume.
	if err := s.AddReport(context.Background(), "before", Report{}); errors.Is(err, ErrCannotWrite) {
		t.Errorf("AddReport with an empty kind = %v; not a storage failure", err)
	}
}

// TestOldestReport: the outbox's oldest report is the first queued still
// undelivered; none when the outbox is empty.
func TestOldestReport(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	if _, ok, err := s.OldestReport(ctx); ok || err != nil {
		t.Fatalf("OldestReport of an empty outbox = %v, %v; want none", ok, err)
	}
	before := time.Now().Add(-time.Second)
	for _, id := range []string{"a", "b"} {
		mustEnqueue(t, s, id)
		if err := s.AddReport(ctx, id, Report{Kind: KindStatus, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	at, ok, err := s.OldestReport(ctx)
	if err != nil || !ok || at.Before(before) || at.After(time.Now()) {
		t.Errorf("OldestReport = %v, %v, %v; want a time of this test", at, ok, err)
	}
}

// TestWritersTakeTurnsWithoutSQLiteBusyWaits: the process's own writers
// never meet on SQLite's write lock, whose busy handler hands it over by
// sleeping (1, 2, 5, 10 ms and up). With no busy wait allowed at all, any
// write that found the lock taken would fail "database is locked".
func TestWritersTakeTurnsWithoutSQLiteBusyWaits(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spool.db")
	openAt(t, path).Close()
	s, err := open(ctx, path, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const jobs = 12
	var wg sync.WaitGroup
	errs := make(chan error, jobs*16)
	for i := range jobs {
		wg.Go(func() {
			id := fmt.Sprintf("job-%d", i)
			steps := []func() error{
				func() error {
					_, err := s.Enqueue(ctx, NewJob{ID: id, Request: []byte(`{}`), Secret: i%4 == 0}, 1000)
					return err
				},
				func() error { _, _, err := s.ClaimNext(ctx); return err },
				func() error {
					return s.SetProgress(ctx, id, "PULLING", 1, &Report{Kind: KindPhase, Body: []byte(`{}`)})
				},
				func() error { return s.SetFingerprint(ctx, id, "fp-"+id, "rfs-"+id) },
				func() error { return s.AddReport(ctx, id, Report{Kind: KindPull, Body: []byte(`{}`)}) },
				func() error {
					return s.PutArtifact(ctx, Artifact{ID: "rfs-" + id, Fingerprint: "fp-" + id, Path: "/x", Result: []byte(`{}`)})
				},
				func() error { return s.Ping(ctx) },
				func() error {
					reps, err := s.Reports(ctx, id)
					if err != nil || len(reps) == 0 {
						return err
					}
					if err := s.RetryReport(ctx, reps[0].ID, time.Now(), "x"); err != nil {
						return err
					}
					return s.RemoveReport(ctx, reps[0].ID)
				},
				func() error {
					err := s.Finish(ctx, id, StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte(`{}`)})
					if errors.Is(err, ErrFinished) {
						return nil
					}
					return err
				},
				func() error { return s.Requeue(ctx, id) },
				func() error { _, err := s.PurgeFinished(ctx, time.Now().Add(-time.Hour)); return err },
				func() error { return s.DeleteArtifact(ctx, "rfs-"+id) },
				func() error { _, err := s.ScrubWAL(ctx); return err },
				func() error { return s.Resend(ctx, id) },
			}
			for _, step := range steps {
				if err := step(); err != nil {
					errs <- fmt.Errorf("%s: %w", id, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
