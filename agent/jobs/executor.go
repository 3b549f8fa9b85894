// Package jobs runs the build jobs the spool holds: it claims them
// oldest first on a bounded set of workers, runs one build per
// fingerprint however many jobs want it (single flight), cancels and
// times jobs out, and turns each job's progress into heartbeats and status
// reports. A flight asks the artifacts package once for its artifact
// (artifacts.Obtain): which one can be reused, the build lock shared with
// other replicas and the publication are decided there.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/artifacts"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// Builder is what the executor needs from the rootfs builder.
type Builder interface {
	// Resolve reads an image's manifest and configuration.
	Resolve(ctx context.Context, src rootfs.Source) (*rootfs.Image, error)
	// LoadCA reads the egress CA to bake into images.
	LoadCA(ctx context.Context) (*rootfs.CA, error)
	// Build produces and publishes the artifact of spec.
	Build(ctx context.Context, spec rootfs.Spec, progress rootfs.ProgressFunc) (*rootfs.Artifact, error)
}

// jobQueue is the part of the spool that holds the executor's jobs.
type jobQueue interface {
	Job(ctx context.Context, id string) (spool.Job, error)
	ClaimNext(ctx context.Context) (spool.Job, bool, error)
	SetFingerprint(ctx context.Context, id, fingerprint, artifactID string) error
	SetProgress(ctx context.Context, id, phase string, progress int, report *spool.Report) error
	AddReport(ctx context.Context, id string, r spool.Report) error
	Finish(ctx context.Context, id string, state spool.State, phase, errMsg string, report spool.Report) error
	Requeue(ctx context.Context, id string) error
}

// LiveProgress publishes jobs' pull progress where CubeMaster overlays it
// on job polls. It must never block.
type LiveProgress interface {
	// Update records a job's latest pull progress.
	Update(jobID string, p api.Pull)
	// Finish sends the job's last progress and removes it.
	Finish(jobID string)
}

// waker is told that reports were queued.
type waker interface {
	Wake()
}

var (
	_ jobQueue = (*spool.Spool)(nil)
	_ Builder  = (*rootfs.Builder)(nil)
)

// Options are the executor's collaborators.
type Options struct {
	Jobs jobQueue
	// Artifacts obtains each flight's artifact: reused, or built by
	// Builder and published.
	Artifacts *artifacts.Artifacts
	Builder   Builder
	// Reporter is woken when a report is queued.
	Reporter waker
	// Settings is read at each use, so a reload takes effect at once.
	Settings func() config.Build
	Logger   *slog.Logger
	// Live receives jobs' pull progress for CubeMaster's Redis; nil for
	// none.
	Live LiveProgress
	// Tracer starts each run's span; the phases' spans are its children.
	// Nil makes none.
	Tracer trace.Tracer
	// Metrics registers the series; names are relative to the daemon's
	// namespace.
	Metrics prometheus.Registerer
	// Beat is called at each round of Dispatch, for a liveness probe; nil
	// for none.
	Beat func()
}

// errStopping marks work abandoned because the agent is stopping, or a
// shared build every job waiting for it left.
var errStopping = errors.New("agent is stopping")

// errCancelled is the cause of a job context ended by a cancel request; the
// job's terminal report is committed before it is used.
var errCancelled = errors.New("cancelled")

// cancelMessage is the error_message of a cancelled job's FAILED report.
const cancelMessage = "cancelled"

// buildTimeout is the cause of a job's (or a shared build's) context whose
// build.timeout expired, and the error its jobs fail with.
type buildTimeout struct{ limit time.Duration }

func (t buildTimeout) Error() string {
	return fmt.Sprintf("build exceeded build.timeout (%s)", t.limit)
}

// Executor runs queued jobs on a bounded set of workers, oldest first, and
// runs one build per fingerprint however many jobs want it.
type Executor struct {
	jobs      jobQueue
	artifacts *artifacts.Artifacts
	builder   Builder
	reporter  waker
	settings  func() config.Build
	logger    *slog.Logger
	live      LiveProgress
	tracer    trace.Tracer
	metrics   metrics
	beat      func()

	// claimMu orders claiming a job against cancelling one: a job is in
	// running as soon as its claim is committed, so a cancel finds it.
	claimMu sync.Mutex
	mu      sync.Mutex
	// running maps job ids to their runs.
	running map[string]*jobRun
	// flights maps fingerprints to the build in progress for them.
	flights map[string]*flight
	wake    chan struct{}
	wg      sync.WaitGroup
}

// flight is one build shared by every job with the same fingerprint. It
// runs under its own context, bounded by build.timeout, so it goes on when
// the job that started it is cancelled while others still wait for it.
type flight struct {
	done chan struct{}
	ctx  context.Context
	// cancel ends the build; called when the last waiting job leaves.
	cancel context.CancelFunc
	// members counts the jobs waiting for the flight, under executor.mu.
	members int
	built   *api.Built
	// reused says built was an existing artifact, not a new build.
	reused bool
	err    error
	phase  string
	// hold keeps deletes and uploads of the artifact out until it lands.
	hold *artifacts.Holding
}

// New returns an executor; Dispatch runs it.
func New(o Options) *Executor {
	e := &Executor{
		jobs: o.Jobs, artifacts: o.Artifacts, builder: o.Builder, reporter: o.Reporter, settings: o.Settings,
		logger: o.Logger, live: o.Live, tracer: o.Tracer,
		metrics: newMetrics(), beat: o.Beat,
		running: map[string]*jobRun{},
		flights: map[string]*flight{},
		wake:    make(chan struct{}, 1),
	}
	if e.tracer == nil {
		e.tracer = noop.NewTracerProvider().Tracer(tracing.Scope)
	}
	if e.beat == nil {
		e.beat = func() {}
	}
	reg := o.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	e.metrics.register(reg)
	return e
}

// Wake tells the dispatcher a job was queued or a slot freed.
func (e *Executor) Wake() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Busy returns how many jobs run and how many builds are in flight; a
// build may go on after the jobs that wanted it were cancelled, until it
// stops.
func (e *Executor) Busy() (jobs, builds int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.running), len(e.flights)
}

func (e *Executor) runningCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.running)
}

// Dispatch starts queued jobs while slots are free, until ctx ends. Builds
// run under ctx too: cancelling it interrupts them.
func (e *Executor) Dispatch(ctx context.Context) {
	for {
		e.beat()
		for ctx.Err() == nil && e.runningCount() < e.settings().MaxConcurrentBuilds {
			ok, err := e.claim(ctx)
			if err != nil {
				if ctx.Err() == nil {
					e.logger.Error("claim next job", "err", err)
				}
				break
			}
			if !ok {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-time.After(5 * time.Second):
		}
	}
}

// claim starts the oldest queued job, reporting false when none waits.
func (e *Executor) claim(ctx context.Context) (bool, error) {
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	job, ok, err := e.jobs.ClaimNext(ctx)
	if err != nil || !ok {
		return false, err
	}
	e.start(ctx, job)
	return true, nil
}

// start runs job under a context cancelled by a stop (ctx), a cancel
// request, or build.timeout.
func (e *Executor) start(ctx context.Context, job spool.Job) {
	limit := e.settings().Timeout
	cancelCtx, cancel := context.WithCancelCause(ctx)
	jobCtx, stopTimer := context.WithTimeoutCause(cancelCtx, limit, buildTimeout{limit})
	r := e.newRun(job, ctx, limit, cancel)
	e.mu.Lock()
	e.running[job.ID] = r
	e.mu.Unlock()
	e.metrics.running.Inc()
	e.metrics.observeQueueWait(job)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() {
			stopTimer()
			cancel(nil)
			e.mu.Lock()
			delete(e.running, job.ID)
			e.mu.Unlock()
			e.metrics.running.Dec()
			e.Wake()
		}()
		r.run(jobCtx)
	}()
}

// Cancel ends a queued or running job FAILED "cancelled". The terminal
// state and report are committed first, so the job is never resumed, even
// after a crash; then a running build is told to stop. It returns the job
// as it was before, spool.ErrNotFound, or spool.ErrFinished with the job
// when it had already ended.
func (e *Executor) Cancel(ctx context.Context, id string) (spool.Job, error) {
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	j, err := e.jobs.Job(ctx, id)
	if err != nil {
		return spool.Job{}, err
	}
	if j.State.Terminal() {
		return j, fmt.Errorf("cancel job %s: %w", id, spool.ErrFinished)
	}
	phase := j.Phase
	e.mu.Lock()
	run := e.running[id]
	e.mu.Unlock()
	if run != nil {
		// The phase the build is in, and its progress reports queued
		// before the FAILED one: the spool's may lag behind them.
		run.lane.flush()
		phase = run.phaseNow()
	}
	if phase == "" {
		phase = api.PhasePulling
	}
	body, err := api.FailedReport(phase, cancelMessage).Encode()
	if err != nil {
		return j, fmt.Errorf("cancel job %s: %w", id, err)
	}
	if err := e.jobs.Finish(ctx, id, spool.StateFailed, phase, cancelMessage,
		spool.Report{Kind: spool.KindTerminal, Body: body}); err != nil {
		if errors.Is(err, spool.ErrFinished) {
			// The build ended meanwhile, before the cancel.
			if now, rerr := e.jobs.Job(ctx, id); rerr == nil {
				j = now
			}
		}
		return j, fmt.Errorf("cancel job %s: %w", id, err)
	}
	e.metrics.observeFinished(spool.StateFailed, phase)
	e.metrics.observeTurnaround(spool.StateFailed, j.CreatedAt)
	e.metrics.cancelled.Inc()
	e.reporter.Wake()
	e.mu.Lock()
	run = e.running[id]
	e.mu.Unlock()
	if run != nil {
		run.cancel(errCancelled)
	}
	e.logger.Info("job cancelled", "job_id", id, "was", j.State, "phase", phase)
	return j, nil
}

// Wait blocks until every running job has returned or ctx ends.
func (e *Executor) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for builds to stop: %w", ctx.Err())
	}
}

// join returns the flight for fp and counts the job as waiting for it
// (joined). When none is in progress it creates one (leader), to run under
// agentCtx within limit. A flight every job left is winding down: the job
// is not counted, and waits for it to land before trying again.
func (e *Executor) join(agentCtx context.Context, limit time.Duration, fp, artifactID string) (fl *flight, leader, joined bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fl, ok := e.flights[fp]; ok {
		if fl.members == 0 {
			return fl, false, false
		}
		fl.members++
		return fl, false, true
	}
	ctx, cancel := context.WithTimeoutCause(agentCtx, limit, buildTimeout{limit})
	fl = &flight{done: make(chan struct{}), ctx: ctx, cancel: cancel, members: 1}
	e.flights[fp] = fl
	// Under e.mu: a delete running now finishes first.
	fl.hold = e.artifacts.Hold(artifactID)
	return fl, true, true
}

// leave uncounts a job that stops waiting for fl before it lands; the last
// one to leave cancels the build.
func (e *Executor) leave(fl *flight) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fl.members--
	if fl.members == 0 {
		fl.cancel()
	}
}

// land ends a flight and wakes the jobs waiting for it.
func (e *Executor) land(fp string, fl *flight, built *api.Built, reused bool, err error, phase string) {
	fl.cancel()
	e.mu.Lock()
	delete(e.flights, fp)
	fl.hold.Release()
	e.mu.Unlock()
	fl.built, fl.reused, fl.err, fl.phase = built, reused, err, phase
	close(fl.done)
}
