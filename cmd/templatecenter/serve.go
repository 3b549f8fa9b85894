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
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// noStoreFallback says why the agent stops when it cannot create its
// store, where upstream would go on in a directory of its own.
const noStoreFallback = "TC does not fall back to $TMPDIR/cubemaster-rootfs-artifacts-store as upstream does: " +
	"CubeMaster serves the artifacts from this directory, and one only TC sees would lose them"

// createDirs creates the store and the work directory, or says which
// directory failed, the key and the variables that set it, where its value
// came from and, for the store, why there is no fallback.
func createDirs(cfg *config.Config, report *config.Report) error {
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
	// The configuration's warnings are held until it says which format
	// to write them in.
	var held heldRecords
	cfg, report, err := config.Read(os.LookupEnv, loadOpts)
	report.Log(held.logger(), true)
	if err != nil {
		held.replay(ctx, newLogger(stderr, "text", level).Handler())
		return fmt.Errorf("load configuration: %w", err)
	}
	lv, _ := config.ParseLevel(cfg.Log.Level)
	level.Set(lv)
	logger := newLogger(stderr, cfg.Log.Format, level)
	held.replay(ctx, logger.Handler())
	gz, whyNotISAL := gzipInflater(os.Getenv)
	start := []any{"version", Version, "revision", revision(), "pid", os.Getpid(), "gzip_inflate", gz.Backend()}
	if why := whyNotISAL; why != "" {
		start = append(start, "gzip_inflate_reason", why) // why not ISA-L
	}
	logger.Info("templatecenter", start...)

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
	watchdog, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		logger.Warn("read systemd watchdog settings", "err", err)
	}
	objects, err := openObjectStore(ctx, cfg, os.Getenv)
	if err != nil {
		if cfg.ArtifactStore.Enabled() == config.BackendFS {
			// The root comes from the configuration: say where to fix it.
			return fmt.Errorf("open artifact store (root set by artifact_store.fs_root or CUBE_ARTIFACT_STORE_FS_ROOT, default store.dir): %w", err)
		}
		return fmt.Errorf("open artifact store: %w", err)
	}
	if objects != nil {
		attrs := []any{"backend", objects.Backend(), "keep_local", cfg.ArtifactStore.KeepLocal}
		if src := credentialsSource(objects); src != "" {
			attrs = append(attrs, "credentials", src)
		}
		logger.Info("artifacts kept in the blob store", attrs...)
	}
	tp, err := setupTracing(ctx, stderr, logger)
	if err != nil {
		return err
	}
	defer shutdownTracing(tp, logger)
	// A reload reads exactly as the start did (and as check-config does);
	// the environment's warnings were logged at start and cannot change.
	load := func() (*config.Config, error) {
		cfg, report, err := config.Read(os.LookupEnv, loadOpts)
		report.Log(logger, false)
		return cfg, err
	}
	opts := agent.Options{Config: cfg, Load: load, Spool: sp, Builder: builder, Objects: objects,
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
		logger.Info("build submits checked against CubeMaster's database", "driver", cfg.InstanceDB.Driver,
			"addr", cfg.InstanceDB.Addr, "db_name", cfg.InstanceDB.DBName)
		// Open has tried once already; this only tells the operator,
		// bounded like /health's check.
		pingCtx, cancel := context.WithTimeout(ctx, time.Second)
		err := db.Ping(pingCtx)
		cancel()
		if err != nil {
			logger.Warn("CubeMaster's database does not answer yet; builds get 503 until it does", "err", err)
		}
	}
	live, err := openLiveProgress(cfg, logger)
	if err != nil {
		return fmt.Errorf("open CubeMaster's Redis (redis): %w", err)
	}
	if live != nil {
		opts.LiveProgress = live
		defer func() {
			closeCtx, cancel := context.WithTimeout(context.Background(), liveCloseTimeout)
			defer cancel()
			if err := live.Close(closeCtx); err != nil {
				logger.Warn("close live progress publisher", "err", err)
			}
		}()
		logger.Info("live pull progress sent to CubeMaster's Redis", "nodes", cfg.Redis.Nodes, "db_no", cfg.Redis.DBNo)
	}
	a := agent.New(opts)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(signals)
	// The loop outlives stop(), since a second signal aborts the drain Run
	// does after it; it ends when Run returns, and serve waits for it, so
	// no reload or abort reaches a stopped agent.
	var loops sync.WaitGroup
	runDone := make(chan struct{})
	loops.Go(func() {
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
	})
	var watcher *config.Watcher
	if path := report.Path; path != "" {
		watcher, err = config.Watch(runCtx, path, logger, func() {
			logger.Info("configuration file changed, reloading", "path", path)
			a.Reload()
		})
		if err != nil {
			logger.Warn("configuration file will not be watched; SIGHUP still reloads", "err", err)
		}
	}
	err = a.Run(runCtx, ln)
	close(runDone)
	loops.Wait()
	if watcher != nil {
		if cerr := watcher.Close(); cerr != nil {
			logger.Warn("stop watching the configuration file", "err", cerr)
		}
	}
	return err
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
