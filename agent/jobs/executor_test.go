package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/artifacts"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/wait"
)

// fakeBuilder resolves every reference to one image and builds a small
// file as its artifact; a build waits for release when it is set.
type fakeBuilder struct {
	store   rootfs.Store
	release chan struct{}
	mu      sync.Mutex
	builds  int
	fail    error
}

var _ Builder = (*fakeBuilder)(nil)

func (b *fakeBuilder) Resolve(_ context.Context, src rootfs.Source) (*rootfs.Image, error) {
	return &rootfs.Image{Digest: src.Ref + "@sha256:" + fmt.Sprintf("%064d", 1)}, nil
}

func (b *fakeBuilder) LoadCA(context.Context) (*rootfs.CA, error) {
	return nil, errors.New("no CA in these tests")
}

func (b *fakeBuilder) Build(ctx context.Context, spec rootfs.Spec, _ rootfs.ProgressFunc) (*rootfs.Artifact, error) {
	b.mu.Lock()
	b.builds++
	fail := b.fail
	b.mu.Unlock()
	if b.release != nil {
		select {
		case <-b.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail != nil {
		return nil, fail
	}
	data := []byte("image of " + spec.Fingerprint)
	f, err := b.store.CreateTemp(spec.ArtifactID)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(data); err != nil {
		b.store.Discard(f, spec.ArtifactID)
		return nil, err
	}
	if err := b.store.Commit(f, spec.ArtifactID); err != nil {
		return nil, err
	}
	fi, err := os.Stat(b.store.ArtifactPath(spec.ArtifactID))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	return &rootfs.Artifact{ID: spec.ArtifactID, Path: b.store.ArtifactPath(spec.ArtifactID), SHA256: hex.EncodeToString(sum[:]),
		Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

func (b *fakeBuilder) buildCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.builds
}

// nopWaker is a reporter nobody needs woken.
type nopWaker struct{}

func (nopWaker) Wake() {}

// testExecutor is an executor over a spool and a store in a temporary
// directory, its artifacts alone (no database, no blob store).
type testExecutor struct {
	*Executor
	spool   *spool.Spool
	builder *fakeBuilder
}

func newTestExecutor(t *testing.T, builder *fakeBuilder) *testExecutor {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	sp, err := spool.Open(ctx, filepath.Join(dir, "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	builder.store = rootfs.Store(filepath.Join(dir, "store"))
	logger := slog.New(slog.DiscardHandler)
	arts := artifacts.New(artifacts.Options{Index: sp, Store: builder.store, Logger: logger})
	settings := config.Build{MaxConcurrentBuilds: 4, HeartbeatInterval: time.Hour, Timeout: time.Minute, MaxAttempts: 3}
	e := New(Options{Jobs: sp, Artifacts: arts, Builder: builder, Reporter: nopWaker{},
		Settings: func() config.Build { return settings }, Logger: logger})
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.Dispatch(dctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if err := e.Wait(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return &testExecutor{Executor: e, spool: sp, builder: builder}
}

// submit queues a build of ref as job id.
func (x *testExecutor) submit(t *testing.T, id, ref string) {
	t.Helper()
	req := fmt.Sprintf(`{"job_id":%q,"request":{"source_image_ref":%q,"writable_layer_size":"1Gi","with_cube_ca":false}}`, id, ref)
	if _, err := x.spool.Enqueue(context.Background(), spool.NewJob{ID: id, Request: []byte(req)}, 100); err != nil {
		t.Fatal(err)
	}
	x.Wake()
}

// finished waits for job id to end and returns it.
func (x *testExecutor) finished(t *testing.T, id string) spool.Job {
	t.Helper()
	var j spool.Job
	wait.For(t, "job "+id+" to end", func() bool {
		var err error
		j, err = x.spool.Job(context.Background(), id)
		return err == nil && j.State.Terminal()
	})
	return j
}

// TestIdenticalJobsShareOneBuild: jobs of one fingerprint in flight
// together wait for one build; a later one reuses its artifact.
func TestIdenticalJobsShareOneBuild(t *testing.T) {
	b := &fakeBuilder{release: make(chan struct{})}
	x := newTestExecutor(t, b)
	x.submit(t, "job-1", "registry.test/app:1")
	x.submit(t, "job-2", "registry.test/app:1")
	wait.For(t, "both jobs to wait for the build", func() bool { jobs, _ := x.Busy(); return jobs == 2 && b.buildCount() == 1 })
	close(b.release)
	first, second := x.finished(t, "job-1"), x.finished(t, "job-2")
	for _, j := range []spool.Job{first, second} {
		if j.State != spool.StateBuilt || j.ArtifactID != first.ArtifactID {
			t.Errorf("job %s = %s artifact %s (%s), want built with %s", j.ID, j.State, j.ArtifactID, j.Error, first.ArtifactID)
		}
	}
	x.submit(t, "job-3", "registry.test/app:1")
	if j := x.finished(t, "job-3"); j.State != spool.StateBuilt {
		t.Errorf("job-3 = %s (%s), want built", j.State, j.Error)
	}
	if n := b.buildCount(); n != 1 {
		t.Errorf("builds = %d, want 1", n)
	}
}

// TestBuildFailureFailsJob: a build error is the job's error_message, in
// the phase it happened.
func TestBuildFailureFailsJob(t *testing.T) {
	b := &fakeBuilder{fail: errors.New("layer 2 is corrupt")}
	x := newTestExecutor(t, b)
	x.submit(t, "job-1", "registry.test/app:1")
	j := x.finished(t, "job-1")
	if j.State != spool.StateFailed || j.Error != "build image: layer 2 is corrupt" || j.Phase != api.PhaseBuildingExt4 {
		t.Errorf("job = %s in %s (%q), want failed in %s with the build's error", j.State, j.Phase, j.Error, api.PhaseBuildingExt4)
	}
}

// TestCancelRunningJob: a cancel ends a running job FAILED "cancelled" at
// once, and the build it alone waited for stops.
func TestCancelRunningJob(t *testing.T) {
	b := &fakeBuilder{release: make(chan struct{})}
	x := newTestExecutor(t, b)
	x.submit(t, "job-1", "registry.test/app:1")
	wait.For(t, "the build to start", func() bool { return b.buildCount() == 1 })
	if _, err := x.Cancel(context.Background(), "job-1"); err != nil {
		t.Fatalf("Cancel = %v", err)
	}
	j := x.finished(t, "job-1")
	if j.State != spool.StateFailed || j.Error != cancelMessage {
		t.Errorf("job = %s (%q), want failed %q", j.State, j.Error, cancelMessage)
	}
	wait.For(t, "the build to stop", func() bool { _, builds := x.Busy(); return builds == 0 })
	if _, err := x.Cancel(context.Background(), "job-1"); !errors.Is(err, spool.ErrFinished) {
		t.Errorf("second Cancel = %v, want spool.ErrFinished", err)
	}
}

// TestCancelLeaderOfSharedBuild: cancelling the job that started a build
// another job waits for cancels only that job: the build goes on, once,
// and the other job gets its artifact.
func TestCancelLeaderOfSharedBuild(t *testing.T) {
	b := &fakeBuilder{release: make(chan struct{})}
	x := newTestExecutor(t, b)
	x.submit(t, "twin-a", "registry.test/same:1")
	wait.For(t, "the build to start", func() bool { return b.buildCount() == 1 })
	x.submit(t, "twin-b", "registry.test/same:1")
	wait.For(t, "the second job to wait for the build", func() bool { jobs, _ := x.Busy(); return jobs == 2 })
	if _, err := x.Cancel(context.Background(), "twin-a"); err != nil {
		t.Fatalf("Cancel = %v", err)
	}
	if j := x.finished(t, "twin-a"); j.State != spool.StateFailed || j.Error != cancelMessage {
		t.Errorf("cancelled leader = %s (%q), want failed %q", j.State, j.Error, cancelMessage)
	}
	if _, builds := x.Busy(); builds != 1 {
		t.Errorf("builds in flight after the leader's cancel = %d, want the shared one", builds)
	}
	close(b.release)
	if j := x.finished(t, "twin-b"); j.State != spool.StateBuilt {
		t.Errorf("job sharing the build = %s (%q), want built", j.State, j.Error)
	}
	if n := b.buildCount(); n != 1 {
		t.Errorf("builds = %d, want the one shared build", n)
	}
	if j, err := x.spool.Job(context.Background(), "twin-a"); err != nil || j.State != spool.StateFailed {
		t.Errorf("cancelled leader after the build = %+v (%v), want it to stay failed", j, err)
	}
}

// gatedQueue holds every progress write (SetProgress, AddReport) until
// open is closed, as a spool commit stuck behind a slow disk would.
type gatedQueue struct {
	*spool.Spool
	open chan struct{}
}

func (q gatedQueue) SetProgress(ctx context.Context, id, phase string, progress int, r *spool.Report) error {
	<-q.open
	return q.Spool.SetProgress(ctx, id, phase, progress, r)
}

func (q gatedQueue) AddReport(ctx context.Context, id string, r spool.Report) error {
	<-q.open
	return q.Spool.AddReport(ctx, id, r)
}

// resolveWatcher is a fakeBuilder that tells when it is asked to resolve.
type resolveWatcher struct {
	*fakeBuilder
	resolving chan struct{}
}

func (b resolveWatcher) Resolve(ctx context.Context, src rootfs.Source) (*rootfs.Image, error) {
	select {
	case b.resolving <- struct{}{}:
	default:
	}
	return b.fakeBuilder.Resolve(ctx, src)
}

// TestProgressWritesAreOffTheBuildsPath: a build resolves its image and
// runs the Builder while its progress reports wait to be committed; they
// all land, in order, before its terminal report.
func TestProgressWritesAreOffTheBuildsPath(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sp, err := spool.Open(ctx, filepath.Join(dir, "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	fb := &fakeBuilder{store: rootfs.Store(filepath.Join(dir, "store")), release: make(chan struct{})}
	b := resolveWatcher{fakeBuilder: fb, resolving: make(chan struct{}, 1)}
	q := gatedQueue{Spool: sp, open: make(chan struct{})}
	logger := slog.New(slog.DiscardHandler)
	settings := config.Build{MaxConcurrentBuilds: 1, HeartbeatInterval: time.Hour, Timeout: time.Minute, MaxAttempts: 3}
	e := New(Options{Jobs: q, Artifacts: artifacts.New(artifacts.Options{Index: sp, Store: fb.store, Logger: logger}), Builder: b,
		Reporter: nopWaker{}, Settings: func() config.Build { return settings }, Logger: logger})
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go e.Dispatch(dctx)
	x := &testExecutor{Executor: e, spool: sp, builder: fb}
	x.submit(t, "job-1", "registry.test/app:1")

	// The PULLING report is held, yet the image is resolved and the
	// Builder runs (its BUILDING_EXT4 report held too).
	wait.For(t, "the image to be resolved while the PULLING report waits", func() bool {
		select {
		case <-b.resolving:
			return true
		default:
			return false
		}
	})
	wait.For(t, "the Builder to run while the progress reports wait", func() bool { return fb.buildCount() == 1 })
	if reps, err := sp.Reports(ctx, "job-1"); err != nil || len(reps) != 0 {
		t.Fatalf("reports committed while the gate is shut: %d, %v", len(reps), err)
	}
	// The build ends, and its flight's context with it, before any of
	// its progress commits: they land all the same.
	close(fb.release)
	wait.For(t, "the build to end", func() bool { _, builds := x.Busy(); return builds == 0 })
	close(q.open)
	if j := x.finished(t, "job-1"); j.State != spool.StateBuilt {
		t.Fatalf("job = %s (%q), want built", j.State, j.Error)
	}
	reps, err := sp.Reports(ctx, "job-1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range reps {
		var body struct{ Phase string }
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Kind+":"+body.Phase)
	}
	want := []string{spool.KindPhase + ":" + api.PhasePulling, spool.KindPhase + ":" + api.PhaseUnpacking, spool.KindFingerprint + ":",
		spool.KindPhase + ":" + api.PhaseBuildingExt4, spool.KindTerminal + ":" + api.PhaseReady}
	if !slices.Equal(got, want) {
		t.Errorf("reports = %v, want %v", got, want)
	}
	cancel()
	if err := e.Wait(ctx); err != nil {
		t.Error(err)
	}
}
