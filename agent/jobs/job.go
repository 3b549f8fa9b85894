package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/artifacts"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// jobRun is the state of one running job.
type jobRun struct {
	e     *Executor
	job   spool.Job
	build *api.Build
	log   *slog.Logger
	// agentCtx ends when the agent stops: a build shared by several jobs
	// runs under it rather than under the context of the job leading it.
	agentCtx context.Context
	// limit is the build.timeout the job runs under.
	limit time.Duration
	// cancel ends the job's context, with the cause a build reports.
	cancel context.CancelCauseFunc

	mu         sync.Mutex
	phase      string
	phaseSince time.Time
	progress   int
	pull       *rootfs.PullProgress
	pullSent   *rootfs.PullProgress
	pullSentAt time.Time
	flush      chan struct{}
	// lane commits the job's progress off the build's path.
	lane *progressLane
}

// newRun makes the state of job, run under limit until agentCtx ends or
// cancel is called.
func (e *Executor) newRun(job spool.Job, agentCtx context.Context, limit time.Duration, cancel context.CancelCauseFunc) *jobRun {
	return &jobRun{e: e, job: job, log: e.logger.With("job_id", job.ID, "attempt", job.Attempts),
		agentCtx: agentCtx, limit: limit, cancel: cancel, phase: api.PhasePulling, flush: make(chan struct{}, 1),
		lane: newProgressLane()}
}

// run drives the job, under ctx, to a terminal report, or back to the
// queue when the agent stops (agentCtx ends) under it.
func (r *jobRun) run(ctx context.Context) {
	e, job := r.e, r.job
	defer r.lane.close()
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
	spec, phase, err := r.plan(ctx)
	if err != nil {
		return nil, phase, err
	}
	fp := spec.Fingerprint
	for {
		// Reuses run in the flight too, so that a delete of the artifact
		// (refused while the flight holds it) waits for them as it waits for
		// builds.
		fl, leader, joined := r.e.join(r.agentCtx, r.limit, fp, spec.ArtifactID)
		switch {
		case leader:
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				// The flight's build is traced under the run that leads it.
				built, reused, err := r.produce(trace.ContextWithSpan(fl.ctx, trace.SpanFromContext(ctx)), spec)
				var timeout buildTimeout
				if err != nil && errors.As(context.Cause(fl.ctx), &timeout) {
					// Whichever step it stopped in (image, upload).
					err = timeout
				}
				e.land(fp, fl, built, reused, err, api.PhaseBuildingExt4)
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
			if err := e.checkReused(fl.built); err != nil {
				return nil, api.PhaseBuildingExt4, err
			}
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

// plan follows the build recipe up to the build: the image resolved
// (PULLING), then the egress CA loaded and the build named (UNPACKING,
// rootfs.Plan), and reports the names. On error it returns the phase that
// failed.
func (r *jobRun) plan(ctx context.Context) (rootfs.Spec, string, error) {
	e := r.e
	t := &r.build.Template

	r.setPhase(ctx, api.PhasePulling, api.ProgressPulling)
	img, err := tracing.Run(ctx, tracing.SpanPrepareSource, func(ctx context.Context) (*rootfs.Image, error) {
		return e.builder.Resolve(ctx, rootfs.Source{Ref: t.SourceImageRef, Username: t.RegistryUsername, Password: t.RegistryPassword})
	})
	if err != nil {
		return rootfs.Spec{}, api.PhasePulling, fmt.Errorf("resolve image %s: %w", t.SourceImageRef, err)
	}
	// Refused before any layer is fetched: the BUILT report could never
	// be registered.
	if cfg, err := json.Marshal(img.Config); err != nil || len(cfg) > api.MaxImageConfigJSON {
		return rootfs.Spec{}, api.PhasePulling, fmt.Errorf("image %s: its configuration (Entrypoint, Cmd, Env, WorkingDir, User) is %d bytes "+
			"as image_config_json, over the %d bytes CubeMaster can store", safetext.Name(t.SourceImageRef), len(cfg), api.MaxImageConfigJSON)
	}

	r.setPhase(ctx, api.PhaseUnpacking, api.ProgressUnpacking)
	spec, err := rootfs.Plan(ctx, e.builder, img, t.WantsCA(), r.build.Name)
	if err != nil {
		return rootfs.Spec{}, api.PhaseUnpacking, err
	}
	r.log = r.log.With("artifact_id", spec.ArtifactID)
	if err := e.jobs.SetFingerprint(ctx, r.job.ID, spec.Fingerprint, spec.ArtifactID); err != nil {
		return rootfs.Spec{}, api.PhaseUnpacking, err
	}
	r.report(ctx, spool.KindFingerprint, api.FingerprintReport(spec.ArtifactID, spec.Fingerprint, img.Digest))
	return spec, "", nil
}

// produce makes the artifact of a flight r leads: artifacts.Obtain reuses
// one or builds it (buildArtifact); reused says it found one. It touches r
// only in memory (progress, log) and through the phase reports, never its
// job's state in the spool: r may have been cancelled while the build goes
// on for other jobs.
func (r *jobRun) produce(ctx context.Context, spec rootfs.Spec) (*api.Built, bool, error) {
	built, src, err := r.e.artifacts.Obtain(ctx, artifacts.Request{Fingerprint: spec.Fingerprint, ArtifactID: spec.ArtifactID,
		Image: spec.Image, CA: spec.CA, Log: r.log,
		Build: func(ctx context.Context) (*rootfs.Artifact, error) {
			r.setPhase(ctx, api.PhaseBuildingExt4, api.ProgressBuilding)
			return r.buildArtifact(ctx, spec)
		},
		Publishing: r.publishing,
		Progress: func(share float64) {
			r.onProgress(rootfs.Progress{Percent: api.ProgressUploadStart + int(share*(api.ProgressUploadEnd-api.ProgressUploadStart))})
		}})
	if err != nil && ctx.Err() != nil {
		return nil, false, errStopping
	}
	return built, src != artifacts.SourceBuilt, err
}

// buildArtifact runs the image build of a flight r leads, under the
// flight's context, and publishes the image in the local store. The start
// check's mode is the one configured when the build starts.
func (r *jobRun) buildArtifact(ctx context.Context, spec rootfs.Spec) (*rootfs.Artifact, error) {
	e := r.e
	began := time.Now()
	spec.Envd, spec.Start = r.build.EnvdData, startOverrides(r.build.Template.ContainerOverrides)
	spec.StartCheck = rootfs.StartCheckMode(e.settings().StartCheck)
	art, err := tracing.Run(ctx, tracing.SpanRootfs, func(ctx context.Context) (*rootfs.Artifact, error) {
		return e.builder.Build(ctx, spec, r.onProgress)
	})
	var failedCheck *rootfs.StartCheckError
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, errStopping
	case errors.As(err, &failedCheck):
		// Its message is the job's error_message as it stands.
		e.metrics.startChecks.WithLabelValues(failedCheck.Result.Result).Inc()
		return nil, failedCheck
	case err != nil:
		return nil, fmt.Errorf("build image: %w", err)
	case art.StartCheck != nil:
		e.metrics.startChecks.WithLabelValues(art.StartCheck.Result).Inc()
	}
	r.log.Info("artifact published", "path", art.Path, "size", art.Size, "sha256", art.SHA256, "took", time.Since(began).Round(time.Millisecond))
	return art, nil
}

// publishing enters the upload to the blob store: the job's phase stays
// BUILDING_EXT4 meanwhile, with progress towards 99 and heartbeats as
// usual; a job interrupted here finds its artifact published when it
// resumes and only uploads.
func (r *jobRun) publishing(ctx context.Context) {
	if r.phaseNow() != api.PhaseBuildingExt4 {
		r.setPhase(ctx, api.PhaseBuildingExt4, api.ProgressUploadStart)
	}
	r.onProgress(rootfs.Progress{Percent: api.ProgressUploadStart})
}

// setPhase records a phase change and queues its report on the job's
// lane; the report is never superseded, so CubeMaster sees every phase,
// however brief.
func (r *jobRun) setPhase(ctx context.Context, phase string, progress int) {
	r.mu.Lock()
	r.enterPhaseLocked(phase, time.Now())
	r.phase, r.progress = phase, progress
	r.mu.Unlock()
	r.persistProgress(ctx, spool.KindPhase)
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
			r.persistProgress(ctx, spool.KindStatus)
			r.persistPull(ctx, false)
		}
	}
}

// persistProgress has the job's lane store the current phase/progress and
// queue it as a RUNNING report of kind: spool.KindPhase for a change of
// phase, spool.KindStatus for a heartbeat.
func (r *jobRun) persistProgress(ctx context.Context, kind string) {
	r.mu.Lock()
	phase, progress := r.phase, r.progress
	r.mu.Unlock()
	body, err := api.RunningReport(phase, progress).Encode()
	if err != nil {
		r.log.Warn("record progress", "err", err)
		return
	}
	rep := &spool.Report{Kind: kind, Body: body}
	// The lane commits it once the writes before it have, maybe after
	// ctx (a flight's, a heartbeat's) ended: the report stands all the
	// same, as it would have had it been committed at once.
	ctx = context.WithoutCancel(ctx)
	key := keyOrdered
	if kind == spool.KindStatus {
		key = keyHeartbeat
	}
	r.lane.add(key, func() {
		if err := r.e.jobs.SetProgress(ctx, r.job.ID, phase, progress, rep); err != nil {
			if !errors.Is(err, spool.ErrFinished) {
				r.log.Warn("record progress", "err", err)
			}
			return
		}
		r.e.reporter.Wake()
	})
}

// persistPull queues the latest download progress when it changed since
// the last one sent; between heartbeats at most every half interval unless
// final. Progress counts as sent once it is on the lane: the lane commits
// it even when the heartbeat that queued it has ended.
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
	r.report(ctx, spool.KindPull, api.PullReport(wirePull(sent)))
}

// wirePull is the builder's pull progress as CubeMaster receives it, in
// the callbacks and in Redis.
func wirePull(p rootfs.PullProgress) api.Pull {
	return api.Pull{TotalBytes: p.TotalBytes, DownloadedBytes: p.DownloadedBytes, TotalLayers: p.TotalLayers,
		CompletedLayers: p.CompletedLayers, SpeedBPS: p.SpeedBPS}
}

// report has the job's lane queue a non-terminal report.
func (r *jobRun) report(ctx context.Context, kind string, rep api.Report) {
	body, err := rep.Encode()
	if err != nil {
		r.log.Warn("queue report", "kind", kind, "err", err)
		return
	}
	ctx = context.WithoutCancel(ctx) // as in persistProgress
	key := keyOrdered
	if kind == spool.KindPull {
		key = keyPull
	}
	r.lane.add(key, func() {
		if err := r.e.jobs.AddReport(ctx, r.job.ID, spool.Report{Kind: kind, Body: body}); err != nil {
			if !errors.Is(err, spool.ErrFinished) {
				r.log.Warn("queue report", "kind", kind, "err", err)
			}
			return
		}
		r.e.reporter.Wake()
	})
}

// succeed ends the job with a BUILT report carrying this job's download
// base URL.
func (r *jobRun) succeed(ctx context.Context, built *api.Built) {
	b := *built
	b.MasterNodeIP = api.NormalizeBaseURL(r.build.DownloadBaseURL)
	r.finish(ctx, spool.StateBuilt, api.PhaseReady, "", api.BuiltReport(b))
}

// fail ends the job with a FAILED report. Every failure becomes a report
// here: its message, which an image can shape (a registry's answer, a
// file name, the start check), is cut to safetext.MessageMax for the
// report, the spool and the log line alike. CubeMaster stores it in a
// TEXT column, and an insert that does not fit loses the report.
func (r *jobRun) fail(ctx context.Context, phase, message string) {
	if phase == "" {
		phase = api.PhasePulling
	}
	message = safetext.Clip(message, safetext.MessageMax)
	r.log.Error("build failed", "phase", phase, "err", message)
	r.finish(ctx, spool.StateFailed, phase, message, api.FailedReport(phase, message))
}

func (r *jobRun) finish(ctx context.Context, state spool.State, phase, errMsg string, rep api.Report) {
	e := r.e
	// Every progress report goes before the terminal one: a finished job
	// takes no more.
	r.lane.close()
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
	e.metrics.observeFinished(state, phase)
	r.observeEnd(state)
	e.reporter.Wake()
	if state == spool.StateBuilt {
		r.log.Info("build finished", "took", time.Since(r.job.StartedAt).Round(time.Millisecond))
	}
}

// interrupted puts the job back in the queue for the next start.
func (r *jobRun) interrupted() {
	e := r.e
	r.lane.close()
	if err := e.jobs.Requeue(context.Background(), r.job.ID); err != nil {
		r.log.Error("requeue interrupted job", "err", err)
		return
	}
	e.metrics.interrupted.Inc()
	r.log.Info("build interrupted by shutdown, job requeued", "phase", r.phaseNow())
}
