// Package agent is the CubeTemplateCenter daemon shell: the HTTP API
// CubeMaster calls, the run loop that starts and stops the executor
// (package jobs), the artifacts' sweeps (package artifacts) and the
// reporter (package report), the metrics registry, the list of readiness
// checks (run by package health), and the systemd integration (readiness,
// watchdog, status, reload). Durable state lives in the spool; the image
// work in rootfs.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/artifacts"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/collect"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/health"
	"github.com/cubesandbox/cubetemplatecenter/agent/httpobs"
	"github.com/cubesandbox/cubetemplatecenter/agent/jobs"
	"github.com/cubesandbox/cubetemplatecenter/agent/liveprogress"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/agent/report"
	"github.com/cubesandbox/cubetemplatecenter/agent/space"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// Agent is one running TemplateCenter.
type Agent struct {
	cfg              atomic.Pointer[config.Config]
	load             ConfigLoader
	spool            *spool.Spool
	store            rootfs.Store
	blobs            blobstore.Store
	artifacts        *artifacts.Artifacts
	db               Database
	live             LiveProgress
	logger           *slog.Logger
	level            *slog.LevelVar
	metrics          *metrics
	http             *httpobs.Observer
	tracer           trace.Tracer
	exec             *jobs.Executor
	reporter         *report.Reporter
	notify           Notifier
	watchdogInterval time.Duration
	stopReserve      time.Duration

	// ready is set once the agent serves; stopping once it stops.
	ready    atomic.Bool
	stopping atomic.Bool
	// uploads counts artifact uploads in progress.
	uploads atomic.Int64
	// spoolRefused is the last submit commit the spool's storage refused,
	// shown by /health until a commit succeeds or it grows old.
	spoolRefused atomic.Pointer[refusal]
	// abort cuts a graceful stop short (second SIGTERM).
	abortOnce sync.Once
	abort     chan struct{}
	reloadMu  sync.Mutex
	// purgeEvery is how often finished jobs past retention are forgotten.
	purgeEvery time.Duration
	// loops are the watched loops' last rounds, for /livez; health keeps
	// the readiness checks' last round.
	loops  health.Loops
	health *health.Checker
	// boundOverride replaces loops' liveness bounds (tests).
	boundOverride map[string]time.Duration
}

// Database is what the agent needs of CubeMaster's database: the job row
// a build submit is checked against, the build lock and READY rows shared
// with other replicas, the artifact rows deletes claim, and a probe for
// the readiness checks. *masterdb.DB is one.
type Database interface {
	JobForSubmit(ctx context.Context, jobID string) (masterdb.JobRow, error)
	Ping(ctx context.Context) error
	artifacts.Rows
}

var _ Database = (*masterdb.DB)(nil)

// LiveProgress publishes jobs' pull progress where CubeMaster overlays it
// on job polls. It must never block: *liveprogress.Writer is one.
type LiveProgress interface {
	jobs.LiveProgress
	// Ping checks the destination answers, for the readiness checks.
	Ping(ctx context.Context) error
}

var _ LiveProgress = (*liveprogress.Writer)(nil)

// ConfigLoader reads the configuration from where main found it.
type ConfigLoader func() (*config.Config, error)

// Notifier sends sd_notify(3) state strings; a no-op outside systemd.
type Notifier func(state string)

// Options are the agent's collaborators.
type Options struct {
	Config *config.Config
	// Load reads the configuration again, for a reload, as main read
	// Config (nil: a reload keeps the running configuration).
	Load    ConfigLoader
	Spool   *spool.Spool
	Builder jobs.Builder
	Logger  *slog.Logger
	// Level is the logger's level, adjusted on reload.
	Level  *slog.LevelVar
	Notify Notifier
	// Watchdog is systemd's WatchdogSec; zero disables the pings.
	Watchdog time.Duration
	// BlobStore is the blob store keeping the durable copy of each artifact
	// (opened by main); nil keeps artifacts on the local store only.
	BlobStore blobstore.Store
	// Database is CubeMaster's database (opened by main): every submit is
	// checked against it, builds and deletes are shared with other
	// replicas through it. Nil: TC works alone.
	Database Database
	// LiveProgress receives each job's pull progress for CubeMaster's
	// Redis; nil sends none.
	LiveProgress LiveProgress
	// BuildInfo names the running binary in build_info.
	BuildInfo BuildInfo
	// TracerProvider makes the spans of builds and callbacks (set up by
	// main from OTEL_*); nil makes none, and callbacks carry the trace
	// context CubeMaster sent with the build.
	TracerProvider trace.TracerProvider
	// StopReserve is how long main's own flushes may take once Run
	// returns: the drain gets shutdown.timeout less it (at least half),
	// so that the whole stop fits shutdown.timeout.
	StopReserve time.Duration
}

// defaultPurgeEvery is how often finished jobs past spool.retention are
// forgotten.
const defaultPurgeEvery = time.Hour

// New assembles an agent; Run starts it.
func New(o Options) *Agent {
	a := &Agent{
		load:             o.Load,
		spool:            o.Spool,
		store:            rootfs.Store(o.Config.Store.Dir),
		blobs:            o.BlobStore,
		db:               o.Database,
		live:             o.LiveProgress,
		logger:           o.Logger,
		level:            o.Level,
		notify:           o.Notify,
		watchdogInterval: o.Watchdog,
		stopReserve:      o.StopReserve,
		abort:            make(chan struct{}),
		purgeEvery:       defaultPurgeEvery,
	}
	tp := o.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	a.tracer = tp.Tracer(tracing.Scope)
	if a.level == nil {
		a.level = new(slog.LevelVar)
	}
	if a.notify == nil {
		a.notify = func(string) {}
	}
	if a.load == nil {
		a.load = func() (*config.Config, error) { return a.config(), nil }
	}
	a.cfg.Store(o.Config)
	a.metrics = newMetrics(o.Spool, o.Logger)
	a.http = httpobs.New(o.Logger, probeRoutes...)
	a.health = health.New(a.readinessChecks, checkTimeout)
	reg := a.metrics.scoped()
	reg.MustRegister(append(a.http.Collectors(), newBuildInfo(o.BuildInfo), space.NewCollector(a.config, o.Logger))...)
	reg.MustRegister(a.health.Collectors()...)
	if c, ok := o.Builder.(collect.LayerCache); ok {
		reg.MustRegister(collect.Layers(c))
	}
	a.reporter = report.New(o.Spool, a.reportSettings, o.Logger.With("component", "reporter"), a.metrics.observeCallback, o.TracerProvider)
	a.reporter.Beat = func() { a.loops.Beat(loopReporter, time.Now()) }
	for _, part := range []any{o.LiveProgress, o.TracerProvider} {
		if c, ok := part.(interface{ Collectors() []prometheus.Collector }); ok {
			a.metrics.register(c.Collectors()...)
		}
	}
	replicas := func() config.Replicas { return a.config().Replicas }
	as := o.Config.ArtifactStore
	artOpts := artifacts.Options{Index: o.Spool, Store: a.store, BlobStore: o.BlobStore, Prefix: as.S3.Prefix,
		PresignTTL: as.PresignTTL, KeepLocal: as.KeepLocal, RecordSecret: as.RecordSecret.Reveal(),
		Replicas: replicas, AbandonAfter: func() time.Duration { return a.config().Build.Timeout },
		Logger: o.Logger, Metrics: reg}
	execOpts := jobs.Options{Jobs: o.Spool, Builder: o.Builder, Reporter: a.reporter,
		Settings: func() config.Build { return a.config().Build },
		Logger:   o.Logger, Tracer: a.tracer, Metrics: reg,
		Beat: func() { a.loops.Beat(loopDispatcher, time.Now()) }}
	// Typed nils would pass for a database or a publisher that is there.
	if o.Database != nil {
		artOpts.Rows = o.Database
	}
	if o.LiveProgress != nil {
		execOpts.Live = o.LiveProgress
	}
	a.artifacts = artifacts.New(artOpts)
	execOpts.Artifacts = a.artifacts
	a.exec = jobs.New(execOpts)
	return a
}

func (a *Agent) config() *config.Config { return a.cfg.Load() }

func (a *Agent) reportSettings() report.Settings {
	c := a.config()
	return report.Settings{BaseURL: c.Master.Addr, Token: c.Master.Token, Timeout: c.Master.CallbackTimeout,
		RetryInitial: c.Master.RetryInitial, RetryMax: c.Master.RetryMax, ProgressAttempts: c.Master.ProgressAttempts}
}

// Abort makes a graceful stop in progress give up waiting.
func (a *Agent) Abort() { a.abortOnce.Do(func() { close(a.abort) }) }

// Run recovers what a previous run left, serves ln and runs builds until ctx
// ends, then stops gracefully: it refuses new work, interrupts builds (they
// go back to the queue, never FAILED), delivers what reports it can within
// shutdown.timeout, and returns.
func (a *Agent) Run(ctx context.Context, ln net.Listener) error {
	cfg := a.config()
	a.logStart(cfg, ln)
	if err := a.recover(ctx); err != nil {
		return err
	}
	buildCtx, cancelBuilds := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBuilds()
	reportCtx, cancelReports := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReports()
	a.loops.Start(watchedLoops, time.Now())
	r := &running{cancelBuilds: cancelBuilds, cancelReports: cancelReports, serveErr: make(chan error, 1)}
	r.background.Add(2)
	go func() { defer r.background.Done(); a.reporter.Run(reportCtx) }()
	go func() { defer r.background.Done(); a.exec.Dispatch(buildCtx) }()

	r.srv = &http.Server{
		Handler:           a.Handler(),
		ReadHeaderTimeout: cfg.Common.ReadHeaderTimeout,
		ReadTimeout:       cfg.Common.ReadTimeout,
		WriteTimeout:      cfg.Common.WriteTimeout,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(a.logger.Handler(), slog.LevelWarn),
	}
	// The first answer of /health already rests on a round of checks.
	a.health.Round(ctx)
	go func() { r.serveErr <- r.srv.Serve(ln) }()

	stopLoops := a.startLoops(ctx)
	defer stopLoops()
	a.ready.Store(true)
	a.notify("READY=1")
	a.logger.Info("ready")

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-r.serveErr:
		runErr = fmt.Errorf("serve HTTP: %w", err)
	}
	a.stopping.Store(true)
	// Joined before STOPPING=1, so no WATCHDOG or STATUS line follows it.
	stopLoops()
	a.notify("STOPPING=1")
	a.drain(cfg, r, runErr != nil)
	a.logger.Info("stopped")
	return runErr
}

// logStart logs what the agent starts with and warns of settings that
// leave it open or make replicas build twice.
func (a *Agent) logStart(cfg *config.Config, ln net.Listener) {
	a.logger.Info("starting", "listen", ln.Addr().String(), "store", cfg.Store.Dir, "spool", a.spool.Path(),
		"master", safetext.URL(cfg.Master.Addr), "max_concurrent_builds", cfg.Build.MaxConcurrentBuilds, "queue_size", cfg.Build.QueueSize)
	if cfg.Master.Token == "" && cfg.Master.InsecureNoToken {
		a.logger.Warn("running WITHOUT the shared token (" + api.InsecureNoToken + "=true): any local process can submit builds")
	} else if cfg.Master.Token == "" {
		a.logger.Warn(api.TokenEnv + " is not set: build requests are refused with 503 until it is")
	}
	if a.db != nil && a.blobs != nil && !a.artifacts.Signed() {
		a.logger.Warn("artifact_store.record_secret is not set: replicas do not adopt each other's uploads before CubeMaster " +
			"registers them, and may build the same artifact twice; set the same secret on every replica")
	}
}

// running is what Run started and a stop ends: the HTTP server, the build
// dispatcher and the reporter.
type running struct {
	srv           *http.Server
	serveErr      chan error
	cancelBuilds  context.CancelFunc
	cancelReports context.CancelFunc
	background    sync.WaitGroup
}

// drain stops what r runs within the shutdown budget, in order: requests in
// flight are answered, builds stop (to resume at the next start), due
// reports are delivered. A second stop signal (Abort) cuts it short.
// serveFailed says the server already returned.
func (a *Agent) drain(cfg *config.Config, r *running, serveFailed bool) {
	drain := drainBudget(cfg.Shutdown.Timeout, a.stopReserve)
	a.logger.Info("stopping", "drain", drain)

	stopCtx, cancelStop := context.WithTimeout(context.Background(), drain)
	var abortWatch sync.WaitGroup
	defer abortWatch.Wait()
	defer cancelStop()
	abortWatch.Go(func() {
		select {
		case <-a.abort:
			a.logger.Warn("second stop signal: abandoning graceful shutdown")
			cancelStop()
		case <-stopCtx.Done():
		}
	})
	// Answer requests already in flight; new ones are refused by the
	// closed listener (and by the stopping flag until then).
	httpCtx, cancelHTTP := context.WithTimeout(stopCtx, drain/4)
	if err := r.srv.Shutdown(httpCtx); err != nil {
		a.logger.Warn("HTTP shutdown", "err", err)
	}
	cancelHTTP()
	if !serveFailed {
		<-r.serveErr // http.ErrServerClosed, at once after Shutdown began
	}
	r.cancelBuilds()
	if err := a.exec.Wait(stopCtx); err != nil {
		a.logger.Error("builds did not stop in time; they resume at next start", "err", err)
	}
	r.cancelReports()
	r.background.Wait()
	if err := a.reporter.DeliverDue(stopCtx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		a.logger.Warn("final report delivery", "err", err)
	}
	if n, err := a.spool.OutboxDepth(context.Background()); err == nil && n > 0 {
		a.logger.Info("undelivered reports kept for the next start", "count", n)
	}
}

// drainBudget is the part of a stop bounded by timeout that Run may take:
// timeout less what main flushes after it, but never under half of it, so
// a short timeout still leaves requests and reports their time.
func drainBudget(timeout, reserve time.Duration) time.Duration {
	return max(timeout-reserve, timeout/2)
}

// startLoops runs the watchdog, status, purge, reconcile and readiness check loops until ctx ends or
// stop is called; stop cancels them and returns once all have returned.
// Calling stop again returns at once.
func (a *Agent) startLoops(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var loops sync.WaitGroup
	for _, loop := range []func(context.Context){a.watchdog, a.statusLoop, a.purgeLoop, a.artifacts.Reconcile, a.checkLoop} {
		loops.Go(func() { loop(ctx) })
	}
	return func() {
		cancel()
		loops.Wait()
	}
}

// recover resumes what a previous run left: running jobs go back to the
// queue, crash leftovers in the store are removed, old finished jobs purged.
func (a *Agent) recover(ctx context.Context) error {
	n, err := a.spool.RequeueRunning(ctx)
	if err != nil {
		return err
	}
	if n > 0 {
		a.logger.Info("resuming jobs interrupted by the last stop", "count", n)
	}
	removed, err := a.store.CleanLeftovers()
	for _, p := range removed {
		a.logger.Info("removed leftover of an interrupted build", "path", p)
	}
	if err != nil {
		a.logger.Warn("clean store leftovers", "err", err)
	}
	return a.purge(ctx)
}

// purge forgets finished jobs older than spool.retention whose reports
// were all delivered.
func (a *Agent) purge(ctx context.Context) error {
	purged, err := a.spool.PurgeFinished(ctx, time.Now().Add(-a.config().Spool.Retention))
	if err != nil {
		return err
	}
	if purged > 0 {
		a.logger.Info("purged finished jobs past retention", "count", purged)
	}
	return nil
}

// purgeLoop purges at every purgeEvery while the agent runs.
func (a *Agent) purgeLoop(ctx context.Context) {
	tick := time.NewTicker(a.purgeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := a.purge(ctx); err != nil && ctx.Err() == nil {
				a.logger.Warn("purge finished jobs", "err", err)
			}
		}
	}
}

// statusLoop keeps systemd's STATUS= line current.
func (a *Agent) statusLoop(ctx context.Context) {
	last := ""
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		a.loops.Beat(loopStatus, time.Now())
		q, r, err := a.spool.Counts(ctx)
		if err == nil {
			o, _ := a.spool.OutboxDepth(ctx)
			// Jobs of one fingerprint share a build: builds <= running.
			_, builds := a.exec.Busy()
			s := fmt.Sprintf("STATUS=%d queued, %d running, %d builds, %d reports pending", q, r, builds, o)
			if round := a.health.Last(); round != nil && !round.Ready() {
				s += "; not ready: " + strings.Join(round.FailedNames(), ", ")
			}
			if s != last {
				a.notify(s)
				last = s
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
