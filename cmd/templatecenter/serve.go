package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/cubesandbox/cubetemplatecenter/agent"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/liveprogress"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// noStoreFallback says why the agent stops when it cannot create its
// store, where upstream would go on in a directory of its own.
const noStoreFallback = "TC does not fall back to $TMPDIR/cubemaster-rootfs-artifacts-store as upstream does: " +
	"CubeMaster serves the artifacts from this directory, and one only TC sees would lose them"

// createDirs creates the store and the work directory, or says which
// directory failed, the key and the variables that set it, where its value
// came from and, for the store, why there is no fallback.
func createDirs(cfg *config.Config, report *config.Provenance) error {
	for _, d := range []struct{ what, key, dir, why string }{
		{"artifact store", "store.dir", cfg.Store.Dir, noStoreFallback},
		{"work directory", "store.work_dir", cfg.Store.WorkDir, ""},
	} {
		if err := os.MkdirAll(d.dir, 0o755); err != nil {
			err = fmt.Errorf("create the %s %s (%s, or %s; set by %s): %w", d.what, d.dir, d.key,
				strings.Join(config.EnvNames(d.key), " or "), report.Source(d.key), err)
			if d.why != "" {
				err = fmt.Errorf("%w; %s", err, d.why)
			}
			return err
		}
	}
	return nil
}

// serve runs the agent with the configuration loadOpts reads.
func serve(ctx context.Context, loadOpts config.Options, stderr io.Writer) error {
	level := new(slog.LevelVar)
	cfg, report, logger, err := loadConfig(ctx, loadOpts, stderr, level)
	if err != nil {
		return err
	}
	gz := logStart(logger)
	ln, err := listener(cfg, logger)
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := createDirs(cfg, report); err != nil {
		return err
	}
	sp, err := spool.Open(ctx, cfg.Spool.Path)
	if err != nil {
		return err
	}
	defer sp.Close()
	builder, err := newBuilder(cfg, logger, gz, rootfs.NewMemoryPacer())
	if err != nil {
		return err
	}
	defer builder.Close()
	watchdog := systemdWatchdog(logger)
	objects, err := openArtifactStore(ctx, cfg, logger)
	if err != nil {
		return err
	}
	tp, err := setupTracing(ctx, stderr, logger)
	if err != nil {
		return err
	}
	defer shutdownTracing(tp, logger)
	opts := agent.Options{Config: cfg, Load: reloader(loadOpts, logger), Spool: sp, Builder: builder, BlobStore: objects,
		Logger: logger, Level: level, Notify: agent.SystemdNotifier(logger), Watchdog: watchdog,
		BuildInfo: agent.BuildInfo{Version: Version, Revision: revision()}, TracerProvider: tp,
		StopReserve: liveCloseTimeout + traceFlushTimeout}
	db, err := openDatabase(ctx, cfg)
	if err != nil {
		return fmt.Errorf("open CubeMaster's database (instance_db_config): %w", err)
	}
	if db != nil {
		defer db.Close()
		opts.Database = db
		announceDatabase(ctx, db, cfg.InstanceDB, logger)
	}
	live, err := openLiveProgress(cfg, logger)
	if err != nil {
		return fmt.Errorf("open CubeMaster's Redis (redis): %w", err)
	}
	if live != nil {
		opts.LiveProgress = live
		defer closeLiveProgress(live, logger)
		logger.Info("live pull progress sent to CubeMaster's Redis", "nodes", cfg.Redis.Nodes, "db_no", cfg.Redis.DBNo)
	}
	return runAgent(ctx, agent.New(opts), ln, report.Path, logger)
}

// loadConfig reads the configuration as loadOpts says and makes the
// logger it configures, at level. The configuration's warnings are held
// until it says which format to write them in; when it is invalid, they
// go out as text.
func loadConfig(ctx context.Context, loadOpts config.Options, stderr io.Writer, level *slog.LevelVar) (*config.Config, *config.Provenance, *slog.Logger, error) {
	var held heldRecords
	cfg, report, err := config.Read(os.LookupEnv, loadOpts)
	report.Log(held.logger(), true)
	if err != nil {
		held.replay(ctx, newLogger(stderr, "text", level).Handler())
		return nil, nil, nil, fmt.Errorf("load configuration: %w", err)
	}
	lv, _ := config.ParseLevel(cfg.Log.Level)
	level.Set(lv)
	logger := newLogger(stderr, cfg.Log.Format, level)
	held.replay(ctx, logger.Handler())
	return cfg, report, logger, nil
}

// reloader reads the configuration for a reload exactly as the start did
// (and as check-config does); the environment's warnings were logged at
// start and cannot change.
func reloader(loadOpts config.Options, logger *slog.Logger) func() (*config.Config, error) {
	return func() (*config.Config, error) {
		cfg, report, err := config.Read(os.LookupEnv, loadOpts)
		report.Log(logger, false)
		return cfg, err
	}
}

// logStart logs what starts (version, revision, pid) and the gzip
// inflater its builds use, which it returns.
func logStart(logger *slog.Logger) *layercodec.GzipInflater {
	gz, whyNotISAL := gzipInflater(os.Getenv)
	start := []any{"version", Version, "revision", revision(), "pid", os.Getpid(), "gzip_inflate", gz.Backend()}
	if why := whyNotISAL; why != "" {
		start = append(start, "gzip_inflate_reason", why) // why not ISA-L
	}
	logger.Info("templatecenter", start...)
	return gz
}

// systemdWatchdog is the interval of systemd's watchdog, 0 when it is off.
func systemdWatchdog(logger *slog.Logger) time.Duration {
	watchdog, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		logger.Warn("read systemd watchdog settings", "err", err)
	}
	return watchdog
}

// openArtifactStore opens the blob store the configuration names, if any,
// and says where the artifacts are kept and with which credentials.
func openArtifactStore(ctx context.Context, cfg *config.Config, logger *slog.Logger) (blobstore.Store, error) {
	objects, err := openObjectStore(ctx, cfg, os.Getenv)
	if err != nil {
		if cfg.ArtifactStore.Enabled() == config.BackendFS {
			// The root comes from the configuration: say where to fix it.
			return nil, fmt.Errorf("open artifact store (root set by artifact_store.fs_root or CUBE_ARTIFACT_STORE_FS_ROOT, default store.dir): %w", err)
		}
		return nil, fmt.Errorf("open artifact store: %w", err)
	}
	if objects != nil {
		attrs := []any{"backend", objects.Backend(), "keep_local", cfg.ArtifactStore.KeepLocal}
		if src := credentialsSource(objects); src != "" {
			attrs = append(attrs, "credentials", src)
		}
		logger.Info("artifacts kept in the blob store", attrs...)
	}
	return objects, nil
}

// announceDatabase says which CubeMaster database checks the submits, and
// warns when it does not answer yet.
func announceDatabase(ctx context.Context, db *masterdb.DB, d config.InstanceDB, logger *slog.Logger) {
	logger.Info("build submits checked against CubeMaster's database", "driver", d.Driver, "addr", d.Addr, "db_name", d.DBName)
	// Open has tried once already; this only tells the operator, bounded
	// like /health's check.
	pingCtx, cancel := context.WithTimeout(ctx, time.Second)
	err := db.Ping(pingCtx)
	cancel()
	if err != nil {
		logger.Warn("CubeMaster's database does not answer yet; builds get 503 until it does", "err", err)
	}
}

// closeLiveProgress sends the last live progress at exit, within
// liveCloseTimeout.
func closeLiveProgress(live *liveprogress.Writer, logger *slog.Logger) {
	closeCtx, cancel := context.WithTimeout(context.Background(), liveCloseTimeout)
	defer cancel()
	if err := live.Close(closeCtx); err != nil {
		logger.Warn("close live progress publisher", "err", err)
	}
}

// runAgent runs a on ln until ctx ends or a signal stops it: SIGHUP, and a
// change of the configuration file at path (when there is one), reload
// it; SIGTERM or SIGINT stops it, and a second one aborts the drain.
func runAgent(ctx context.Context, a *agent.Agent, ln net.Listener, path string, logger *slog.Logger) error {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(signals)
	// The loop outlives stop(), since a second signal aborts the drain Run
	// does after it; it ends when Run returns, and runAgent waits for it,
	// so no reload or abort reaches a stopped agent.
	var loops sync.WaitGroup
	runDone := make(chan struct{})
	loops.Go(func() { handleSignals(signals, runDone, a, stop, logger) })
	var watcher *config.Watcher
	if path != "" {
		var err error
		watcher, err = config.Watch(runCtx, path, logger, func() {
			logger.Info("configuration file changed, reloading", "path", path)
			a.Reload()
		})
		if err != nil {
			logger.Warn("configuration file will not be watched; SIGHUP still reloads", "err", err)
		}
	}
	err := a.Run(runCtx, ln)
	close(runDone)
	loops.Wait()
	if watcher != nil {
		if cerr := watcher.Close(); cerr != nil {
			logger.Warn("stop watching the configuration file", "err", cerr)
		}
	}
	return err
}

// handleSignals acts on the signals a receives until runDone closes:
// SIGHUP reloads, the first other signal stops (stop), the next ones
// abort.
func handleSignals(signals <-chan os.Signal, runDone <-chan struct{}, a *agent.Agent, stop func(), logger *slog.Logger) {
	stopping := false
	for {
		var s os.Signal
		select {
		case <-runDone:
			return
		case s = <-signals:
		}
		switch {
		case s == syscall.SIGHUP:
			logger.Info("SIGHUP: reloading configuration")
			a.Reload()
		case !stopping:
			stopping = true
			logger.Info("signal received, stopping", "signal", s.String())
			stop()
		default:
			a.Abort()
		}
	}
}

// listener takes the socket systemd passed (socket activation) or listens
// on common.http_bind:common.http_port.
func listener(cfg *config.Config, logger *slog.Logger) (net.Listener, error) {
	named, err := activation.ListenersWithNames()
	if err != nil {
		return nil, fmt.Errorf("take systemd sockets: %w", err)
	}
	var inherited []net.Listener
	for name, lns := range named {
		for _, ln := range lns {
			if ln == nil {
				continue
			}
			logger.Info("using socket passed by systemd", "name", name, "addr", ln.Addr().String())
			inherited = append(inherited, ln)
		}
	}
	switch len(inherited) {
	case 0:
	case 1:
		return inherited[0], nil
	default:
		for _, ln := range inherited {
			ln.Close()
		}
		return nil, fmt.Errorf("systemd passed %d listening sockets, want one", len(inherited))
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr())
	if err != nil {
		return nil, fmt.Errorf("listen on %s (common.http_bind/common.http_port): %w", cfg.ListenAddr(), err)
	}
	return ln, nil
}

// liveCloseTimeout bounds the last live progress writes at exit; with
// traceFlushTimeout it is what serve does once the agent has stopped,
// within shutdown.timeout.
const liveCloseTimeout = 2 * time.Second
