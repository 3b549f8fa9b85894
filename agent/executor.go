package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
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

// artifactIndex is the part of the spool that records published artifacts.
type artifactIndex interface {
	ArtifactByFingerprint(ctx context.Context, fingerprint string) (spool.Artifact, error)
	PutArtifact(ctx context.Context, a spool.Artifact) error
	DeleteArtifact(ctx context.Context, id string) error
}

// waker is told that reports were queued.
type waker interface {
	Wake()
}

var (
	_ jobQueue      = (*spool.Spool)(nil)
	_ artifactIndex = (*spool.Spool)(nil)
)

// execMetrics are the series the executor updates.
type execMetrics struct {
	running       prometheus.Gauge
	phaseDuration *prometheus.HistogramVec
	dedup         *prometheus.CounterVec
	finished      *prometheus.CounterVec
	interrupted   prometheus.Counter
	cancelled     prometheus.Counter
	timedOut      prometheus.Counter
	replicaMetrics
}

// executorDeps are the executor's collaborators.
type executorDeps struct {
	jobs      jobQueue
	artifacts artifactIndex
	builder   Builder
	// reporter is woken when a report is queued.
	reporter waker
	// settings is read at each use, so a reload takes effect at once.
	settings func() config.Build
	logger   *slog.Logger
	metrics  execMetrics
	// tracer starts each run's span; the phases' spans are its children.
	tracer trace.Tracer
	// objects keeps the durable copy in the blob store; nil for none.
	objects *objectPublisher
	// shared is CubeMaster's database, through which replicas share
	// builds; nil when TC works alone.
	shared replicaDB
	// replicaSettings is read at each use, as settings.
	replicaSettings func() config.Replicas
	// live receives jobs' pull progress for CubeMaster's Redis; nil for
	// none.
	live LiveProgress
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

// executor runs queued jobs on a bounded set of workers, oldest first, and
// runs one build per fingerprint however many jobs want it.
type executor struct {
	executorDeps

	// claimMu orders claiming a job against cancelling one: a job is in
	// running as soon as its claim is committed, so a cancel finds it.
	claimMu sync.Mutex
	mu      sync.Mutex
	// running maps job ids to their cancel functions.
	running map[string]context.CancelCauseFunc
	// flights maps fingerprints to the build in progress for them.
	flights map[string]*flight
	// building holds the artifact ids being written, so a delete of the
	// same artifact waits its turn.
	building map[string]bool
	wake     chan struct{}
	wg       sync.WaitGroup
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
}

func newExecutor(d executorDeps) *executor {
	return &executor{
		executorDeps: d,
		running:      map[string]context.CancelCauseFunc{},
		flights:      map[string]*flight{},
		building:     map[string]bool{},
		wake:         make(chan struct{}, 1),
	}
}

// Wake tells the dispatcher a job was queued or a slot freed.
func (e *executor) Wake() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *executor) runningCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.running)
}

// dispatch starts queued jobs while slots are free, until ctx ends. Builds
// run under ctx too: cancelling it interrupts them.
func (e *executor) dispatch(ctx context.Context) {
	for {
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
func (e *executor) claim(ctx context.Context) (bool, error) {
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
func (e *executor) start(ctx context.Context, job spool.Job) {
	limit := e.settings().Timeout
	cancelCtx, cancel := context.WithCancelCause(ctx)
	jobCtx, stopTimer := context.WithTimeoutCause(cancelCtx, limit, buildTimeout{limit})
	e.mu.Lock()
	e.running[job.ID] = cancel
	e.mu.Unlock()
	e.metrics.running.Inc()
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
		e.run(jobCtx, ctx, job, limit)
	}()
}

// cancelJob ends a queued or running job FAILED "cancelled". The terminal
// state and report are committed first, so the job is never resumed, even
// after a crash; then a running build is told to stop. It returns the job
// as it was before, spool.ErrNotFound, or spool.ErrFinished with the job
// when it had already ended.
func (e *executor) cancelJob(ctx context.Context, id string) (spool.Job, error) {
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
	e.metrics.finished.WithLabelValues(string(spool.StateFailed)).Inc()
	e.metrics.cancelled.Inc()
	e.reporter.Wake()
	e.mu.Lock()
	stop := e.running[id]
	e.mu.Unlock()
	if stop != nil {
		stop(errCancelled)
	}
	e.logger.Info("job cancelled", "job_id", id, "was", j.State, "phase", phase)
	return j, nil
}

// wait blocks until every running job has returned or ctx ends.
func (e *executor) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for builds to stop: %w", ctx.Err())
	}
}

// jobRun is the state of one running job.
type jobRun struct {
	e     *executor
	job   spool.Job
	build *api.Build
	log   *slog.Logger
	// agentCtx ends when the agent stops: a build shared by several jobs
	// runs under it rather than under the context of the job leading it.
	agentCtx context.Context
	// limit is the build.timeout the job runs under.
	limit time.Duration

	mu         sync.Mutex
	phase      string
	progress   int
	pull       *rootfs.PullProgress
	pullSent   *rootfs.PullProgress
	pullSentAt time.Time
	flush      chan struct{}
}

// run drives one job, under ctx, to a terminal report, or back to the
// queue when the agent stops (agentCtx ends) under it.
func (e *executor) run(ctx, agentCtx context.Context, job spool.Job, limit time.Duration) {
	r := &jobRun{e: e, job: job, log: e.logger.With("job_id", job.ID, "attempt", job.Attempts),
		agentCtx: agentCtx, limit: limit, phase: api.PhasePulling, flush: make(chan struct{}, 1)}
	if job.Attempts > e.settings().MaxAttempts {
		r.fail(ctx, job.Phase, fmt.Sprintf("build interrupted %d times (agent stopped or crashed during it); giving up", job.Attempts-1))
		return
	}
	b, err := api.ParseBuild(job.Request)
	if err != nil {
		r.fail(ctx, api.PhasePulling, fmt.Sprintf("stored request is invalid: %v", err))
		return
	}
	r.build = b
	r.log = r.log.With("image", b.Template.SourceImageRef)
	r.log.Info("build started")
	ctx, span := r.startBuild(ctx)
	defer span.End()

	if e.live != nil {
		// However the job ends (or is requeued), its live progress goes:
		// CubeMaster reads the job row once it is not RUNNING.
		defer e.live.Finish(job.ID)
	}
	hbCtx, stopHeartbeat := context.WithCancel(ctx)
	hbDone := make(chan struct{})
	go func() { defer close(hbDone); r.heartbeat(hbCtx) }()
	built, phase, err := r.execute(ctx)
	endBuild(ctx, span, built, err)
	stopHeartbeat()
	<-hbDone
	var timeout buildTimeout
	switch {
	case errors.Is(context.Cause(ctx), errCancelled):
		// The cancel committed the FAILED report before it ended ctx.
		r.log.Info("build stopped: job cancelled", "phase", phase)
	case err == nil:
		r.persistPull(ctx, true)
		r.succeed(ctx, built)
	case errors.As(context.Cause(ctx), &timeout) || errors.As(err, &timeout):
		r.e.metrics.timedOut.Inc()
		r.fail(ctx, phase, timeout.Error())
	case ctx.Err() != nil || errors.Is(err, errStopping):
		r.interrupted()
	default:
		r.persistPull(ctx, true)
		r.fail(ctx, phase, err.Error())
	}
}

// execute runs the phases up to a published (or reused) artifact; on error
// it returns the phase that failed.
func (r *jobRun) execute(ctx context.Context) (*api.Built, string, error) {
	e := r.e
	t := &r.build.Template

	r.setPhase(ctx, api.PhasePulling, api.ProgressPulling)
	began := time.Now()
	img, err := traced(ctx, spanPrepareSource, func(ctx context.Context) (*rootfs.Image, error) {
		return e.builder.Resolve(ctx, rootfs.Source{Ref: t.SourceImageRef, Username: t.RegistryUsername, Password: t.RegistryPassword})
	})
	if err != nil {
		return nil, api.PhasePulling, fmt.Errorf("resolve image %s: %w", t.SourceImageRef, err)
	}
	e.metrics.phaseDuration.WithLabelValues("resolve").Observe(time.Since(began).Seconds())

	r.setPhase(ctx, api.PhaseUnpacking, api.ProgressUnpacking)
	var ca *rootfs.CA
	if t.WantsCA() {
		if ca, err = e.builder.LoadCA(ctx); err != nil {
			return nil, api.PhaseUnpacking, fmt.Errorf("load cube egress CA: %w", err)
		}
	}
	caFP := ""
	if ca != nil {
		caFP = ca.Fingerprint
	}
	fp, err := api.Fingerprint(t, img.Digest, caFP, r.build.EnvdSHA)
	if err != nil {
		return nil, api.PhaseUnpacking, err
	}
	artifactID := api.ArtifactID(fp)
	r.log = r.log.With("artifact_id", artifactID)
	if err := e.jobs.SetFingerprint(ctx, r.job.ID, fp, artifactID); err != nil {
		return nil, api.PhaseUnpacking, err
	}
	r.report(ctx, spool.KindFingerprint, api.FingerprintReport(artifactID, fp, img.Digest))

	for {
		// Reuses run in the flight too, so that a delete of the artifact
		// (withArtifactIdle) waits for them as it waits for builds.
		fl, leader, joined := r.e.join(r.agentCtx, r.limit, fp, artifactID)
		switch {
		case leader:
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				// The flight's build is traced under the run that leads it.
				built, reused, err := r.produce(trace.ContextWithSpan(fl.ctx, trace.SpanFromContext(ctx)), img, ca, fp, artifactID)
				var timeout buildTimeout
				if err != nil && errors.As(context.Cause(fl.ctx), &timeout) {
					// Whichever step it stopped in (image, upload).
					err = timeout
				}
				e.land(fp, artifactID, fl, built, reused, err, api.PhaseBuildingExt4)
			}()
		case joined:
			r.log.Info("identical build in flight, waiting for it", "fingerprint", fp)
		}
		select {
		case <-ctx.Done():
			if joined {
				e.leave(fl)
			}
			return nil, r.phaseNow(), errStopping
		case <-fl.done:
		}
		if fl.err == nil {
			markReused(ctx, !leader || fl.reused)
			switch {
			case !leader:
				e.metrics.dedup.WithLabelValues("inflight").Inc()
			case fl.reused:
				e.metrics.dedup.WithLabelValues("reuse").Inc()
			}
			return fl.built, api.PhaseReady, nil
		}
		if !errors.Is(fl.err, errStopping) && !errors.Is(fl.err, context.Canceled) {
			return nil, fl.phase, fl.err
		}
		if ctx.Err() != nil {
			return nil, r.phaseNow(), errStopping
		}
		// The build was abandoned or interrupted while this job goes on:
		// lead a retry.
	}
}

// buildArtifact runs the image build of a flight r leads, under the
// flight's context, and records the local artifact. It touches r only in memory
// (progress, log), never its job in the spool: r may have been cancelled
// while the build goes on for other jobs.
func (r *jobRun) buildArtifact(ctx context.Context, img *rootfs.Image, ca *rootfs.CA, fp, artifactID string) (*api.Built, error) {
	e := r.e
	began := time.Now()
	art, err := traced(ctx, spanRootfs, func(ctx context.Context) (*rootfs.Artifact, error) {
		return e.builder.Build(ctx, rootfs.Spec{Image: img, ArtifactID: artifactID, Fingerprint: fp,
			Envd: r.build.EnvdData, CA: ca}, r.onProgress)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, errStopping
		}
		return nil, fmt.Errorf("build image: %w", err)
	}
	e.metrics.phaseDuration.WithLabelValues("build").Observe(time.Since(began).Seconds())
	cfgJSON, err := json.Marshal(img.Config)
	if err != nil {
		return nil, fmt.Errorf("encode image config: %w", err)
	}
	built := &api.Built{
		ArtifactID: art.ID, Fingerprint: fp, SourceDigest: img.Digest,
		Ext4Path: art.Path, Ext4SHA256: art.SHA256, Ext4SizeBytes: art.Size,
		ImageConfigJSON: string(cfgJSON), CABaked: art.CABaked, CATargets: art.CATargets,
	}
	if ca != nil {
		built.CAFingerprint = ca.Fingerprint
	}
	record, err := json.Marshal(built)
	if err != nil {
		return nil, fmt.Errorf("encode artifact record: %w", err)
	}
	if err := e.artifacts.PutArtifact(context.WithoutCancel(ctx), spool.Artifact{ID: art.ID, Fingerprint: fp, Path: art.Path,
		SHA256: art.SHA256, Size: art.Size, ModTime: art.ModTime, Result: record}); err != nil {
		return nil, fmt.Errorf("record artifact: %w", err)
	}
	r.log.Info("artifact published", "path", art.Path, "size", art.Size, "sha256", art.SHA256, "took", time.Since(began).Round(time.Millisecond))
	return built, nil
}

// Progress of the upload to the blob store, after the image build's 95.
const (
	progressUploadStart = 96
	progressUploadEnd   = 99
)

// publishObject puts the artifact in the blob store, when there is one,
// and records its blob fields with it. The job's phase stays BUILDING_EXT4
// meanwhile, with progress towards 99 and heartbeats as usual; a job
// interrupted here finds its artifact published when it resumes and only
// uploads.
func (r *jobRun) publishObject(ctx context.Context, built *api.Built) (*api.Built, error) {
	e := r.e
	if e.objects == nil {
		return built, nil
	}
	if r.phaseNow() != api.PhaseBuildingExt4 {
		r.setPhase(ctx, api.PhaseBuildingExt4, progressUploadStart)
	}
	r.onProgress(rootfs.Progress{Percent: progressUploadStart})
	pctx, endPublish := publishSpan(ctx)
	out, err := e.objects.ensure(pctx, built, func(share float64) {
		r.onProgress(rootfs.Progress{Percent: progressUploadStart + int(share*(progressUploadEnd-progressUploadStart))})
	})
	endPublish(out, err)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errStopping
		}
		return nil, err
	}
	if out.ObjectKey != built.ObjectKey || out.StorageBackend != built.StorageBackend {
		if err := e.recordBlobFields(context.WithoutCancel(ctx), out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// join returns the flight for fp and counts the job as waiting for it
// (joined). When none is in progress it creates one (leader), to run under
// agentCtx within limit. A flight every job left is winding down: the job
// is not counted, and waits for it to land before trying again.
func (e *executor) join(agentCtx context.Context, limit time.Duration, fp, artifactID string) (fl *flight, leader, joined bool) {
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
	e.building[artifactID] = true
	return fl, true, true
}

// leave uncounts a job that stops waiting for fl before it lands; the last
// one to leave cancels the build.
func (e *executor) leave(fl *flight) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fl.members--
	if fl.members == 0 {
		fl.cancel()
	}
}

// land ends a flight and wakes the jobs waiting for it.
func (e *executor) land(fp, artifactID string, fl *flight, built *api.Built, reused bool, err error, phase string) {
	fl.cancel()
	e.mu.Lock()
	delete(e.flights, fp)
	delete(e.building, artifactID)
	e.mu.Unlock()
	fl.built, fl.reused, fl.err, fl.phase = built, reused, err, phase
	close(fl.done)
}

// withArtifactIdle runs fn unless artifactID is being built; it reports
// whether fn ran. Builds of that artifact cannot start while fn runs.
func (e *executor) withArtifactIdle(artifactID string, fn func()) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.building[artifactID] {
		return false
	}
	fn()
	return true
}

// reusable returns the recorded artifact for fp when its file is still the
// one published: same size and modification time, or failing that the same
// SHA-256.
func (e *executor) reusable(ctx context.Context, fp string, log *slog.Logger) (*api.Built, bool) {
	sp := e.artifacts
	rec, err := sp.ArtifactByFingerprint(ctx, fp)
	if err != nil {
		if !errors.Is(err, spool.ErrNotFound) {
			log.Warn("look up published artifact", "err", err)
		}
		return nil, false
	}
	var built api.Built
	if err := json.Unmarshal(rec.Result, &built); err != nil {
		log.Warn("recorded artifact is unreadable, rebuilding", "err", err)
		return nil, false
	}
	fi, err := os.Stat(rec.Path)
	if err == nil && fi.Mode().IsRegular() && fi.Size() == rec.Size && fi.ModTime().Equal(rec.ModTime) {
		return &built, true
	}
	if errors.Is(err, os.ErrNotExist) && e.objects != nil && built.ObjectKey != "" {
		// The local copy was dropped after a verified upload
		// (artifact_store.keep_local off): the object alone stands for
		// the artifact, checked by publishObject.
		return &built, true
	}
	if err == nil && fi.Mode().IsRegular() && fi.Size() == rec.Size {
		if sum, herr := rootfs.FileSHA256(ctx, rec.Path); herr == nil && sum == rec.SHA256 {
			rec.ModTime = fi.ModTime()
			if err := sp.PutArtifact(ctx, rec); err != nil {
				log.Warn("refresh artifact record", "err", err)
			}
			return &built, true
		}
	}
	log.Warn("published artifact changed or vanished, rebuilding", "path", rec.Path)
	if err := sp.DeleteArtifact(ctx, rec.ID); err != nil {
		log.Warn("forget stale artifact", "err", err)
	}
	return nil, false
}

// setPhase records a phase change and reports it.
func (r *jobRun) setPhase(ctx context.Context, phase string, progress int) {
	r.mu.Lock()
	r.phase, r.progress = phase, progress
	r.mu.Unlock()
	r.persistProgress(ctx, true)
}

func (r *jobRun) phaseNow() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.phase
}

// onProgress receives builder progress; it only records it and never blocks.
func (r *jobRun) onProgress(p rootfs.Progress) {
	r.mu.Lock()
	if p.Percent > r.progress && p.Percent < api.ProgressDone {
		r.progress = p.Percent
	}
	final := false
	if p.Pull != nil {
		pull := *p.Pull
		r.pull = &pull
		final = pull.Done()
	}
	r.mu.Unlock()
	if p.Pull != nil && r.e.live != nil {
		r.e.live.Update(r.job.ID, wirePull(*p.Pull))
	}
	if final {
		select {
		case r.flush <- struct{}{}:
		default:
		}
	}
}

// heartbeat re-sends the job's phase and progress at the configured interval
// so CubeMaster's stale-job reaper sees a live build, and forwards download
// progress.
func (r *jobRun) heartbeat(ctx context.Context) {
	for {
		interval := r.e.settings().HeartbeatInterval
		timer := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-r.flush:
			timer.Stop()
			r.persistPull(ctx, true)
		case <-timer.C:
			r.persistProgress(ctx, true)
			r.persistPull(ctx, false)
		}
	}
}

// persistProgress stores the current phase/progress and, when send is set,
// queues it as a RUNNING report.
func (r *jobRun) persistProgress(ctx context.Context, send bool) {
	r.mu.Lock()
	phase, progress := r.phase, r.progress
	r.mu.Unlock()
	var rep *spool.Report
	if send {
		body, err := api.RunningReport(phase, progress).Encode()
		if err != nil {
			r.log.Warn("record progress", "err", err)
			return
		}
		rep = &spool.Report{Kind: spool.KindStatus, Body: body}
	}
	if err := r.e.jobs.SetProgress(ctx, r.job.ID, phase, progress, rep); err != nil {
		if ctx.Err() == nil && !errors.Is(err, spool.ErrFinished) {
			r.log.Warn("record progress", "err", err)
		}
		return
	}
	r.e.reporter.Wake()
}

// persistPull queues the latest download progress when it changed since
// the last one sent; between heartbeats at most every half interval unless
// final.
func (r *jobRun) persistPull(ctx context.Context, final bool) {
	r.mu.Lock()
	p := r.pull
	if p == nil || (r.pullSent != nil && *r.pullSent == *p) ||
		(!final && !p.Done() && time.Since(r.pullSentAt) < r.e.settings().HeartbeatInterval/2) {
		r.mu.Unlock()
		return
	}
	sent := *p
	r.pullSent, r.pullSentAt = &sent, time.Now()
	r.mu.Unlock()
	r.report(ctx, spool.KindPull, api.PullReport(wirePull(*p)))
}

// wirePull is the builder's pull progress as CubeMaster receives it, in
// the callbacks and in Redis.
func wirePull(p rootfs.PullProgress) api.Pull {
	return api.Pull{TotalBytes: p.TotalBytes, DownloadedBytes: p.DownloadedBytes, TotalLayers: p.TotalLayers,
		CompletedLayers: p.CompletedLayers, SpeedBPS: p.SpeedBPS}
}

// report queues a non-terminal report.
func (r *jobRun) report(ctx context.Context, kind string, rep api.Report) {
	body, err := rep.Encode()
	if err != nil {
		r.log.Warn("queue report", "kind", kind, "err", err)
		return
	}
	if err := r.e.jobs.AddReport(ctx, r.job.ID, spool.Report{Kind: kind, Body: body}); err != nil {
		if ctx.Err() == nil && !errors.Is(err, spool.ErrFinished) {
			r.log.Warn("queue report", "kind", kind, "err", err)
		}
		return
	}
	r.e.reporter.Wake()
}

// succeed ends the job with a BUILT report carrying this job's download
// base URL.
func (r *jobRun) succeed(ctx context.Context, built *api.Built) {
	b := *built
	b.MasterNodeIP = api.NormalizeBaseURL(r.build.DownloadBaseURL)
	r.finish(ctx, spool.StateBuilt, api.PhaseReady, "", api.BuiltReport(b))
}

// fail ends the job with a FAILED report.
func (r *jobRun) fail(ctx context.Context, phase, message string) {
	if phase == "" {
		phase = api.PhasePulling
	}
	r.log.Error("build failed", "phase", phase, "err", message)
	r.finish(ctx, spool.StateFailed, phase, message, api.FailedReport(phase, message))
}

func (r *jobRun) finish(ctx context.Context, state spool.State, phase, errMsg string, rep api.Report) {
	e := r.e
	// The terminal report must be recorded even when the job context ends.
	ctx = context.WithoutCancel(ctx)
	body, err := rep.Encode()
	if err != nil {
		r.log.Error("record job result", "err", err)
		return
	}
	tc := callbackContext(ctx, r.job.ID, state)
	if err := e.jobs.Finish(ctx, r.job.ID, state, phase, errMsg, spool.Report{Kind: spool.KindTerminal, Body: body,
		TraceParent: tc.Traceparent, TraceState: tc.Tracestate}); err != nil {
		if errors.Is(err, spool.ErrFinished) {
			// A cancel ended the job first; its report stands.
			r.log.Info("job ended before its build did; result not recorded", "state", state)
			return
		}
		// The job stays "running" in the spool and is resumed at the next
		// start, so the terminal report is produced then.
		r.log.Error("record job result", "err", err)
		return
	}
	e.metrics.finished.WithLabelValues(string(state)).Inc()
	e.reporter.Wake()
	if state == spool.StateBuilt {
		r.log.Info("build finished", "took", time.Since(r.job.StartedAt).Round(time.Millisecond))
	}
}

// interrupted puts the job back in the queue for the next start.
func (r *jobRun) interrupted() {
	e := r.e
	if err := e.jobs.Requeue(context.Background(), r.job.ID); err != nil {
		r.log.Error("requeue interrupted job", "err", err)
		return
	}
	e.metrics.interrupted.Inc()
	r.log.Info("build interrupted by shutdown, job requeued", "phase", r.phaseNow())
}

// recordBlobFields stores built, with its blob fields, as the artifact's
// record, so a reuse after a restart reports them too.
func (e *executor) recordBlobFields(ctx context.Context, built *api.Built) error {
	rec, err := e.artifacts.ArtifactByFingerprint(ctx, built.Fingerprint)
	if err != nil {
		return fmt.Errorf("record blob fields of %s: %w", built.ArtifactID, err)
	}
	if rec.Result, err = json.Marshal(built); err != nil {
		return fmt.Errorf("encode artifact record: %w", err)
	}
	if err := e.artifacts.PutArtifact(ctx, rec); err != nil {
		return fmt.Errorf("record blob fields of %s: %w", built.ArtifactID, err)
	}
	return nil
}
