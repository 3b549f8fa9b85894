package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// SystemdNotifier returns a Notifier speaking sd_notify(3) to NOTIFY_SOCKET;
// it does nothing when the variable is unset.
func SystemdNotifier(logger *slog.Logger) Notifier {
	return func(state string) {
		if _, err := daemon.SdNotify(false, state); err != nil {
			logger.Debug("sd_notify", "state", state, "err", err)
		}
	}
}

// watchdog pings systemd at half the watchdog interval, but only after the
// spool proves it answers: a wedged agent stops pinging and gets restarted.
func (a *Agent) watchdog(ctx context.Context) {
	if a.watchdogInterval <= 0 {
		return
	}
	period := a.watchdogInterval / 2
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		if err := a.probe(ctx, period/2); err != nil {
			if ctx.Err() != nil {
				return
			}
			a.logger.Error("health probe failed, withholding watchdog ping", "err", err)
		} else {
			a.notify("WATCHDOG=1")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// probe pings the spool, giving up after limit even if the driver does not.
func (a *Agent) probe(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.spool.Ping(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("spool did not answer within %s", limit)
	}
}

// Reload re-reads the configuration and applies what can change live (log
// level, concurrency, queue size, heartbeat, build timeout, CubeMaster
// address, callback tuning). An invalid file is refused and the running configuration stays.
func (a *Agent) Reload() error {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	if !a.ready.Load() || a.stopping.Load() {
		a.logger.Warn("configuration reload ignored: the agent is not serving")
		return nil
	}
	// SdNotifyMonotonicUsec returns the whole "MONOTONIC_USEC=...\n" line.
	a.notify("RELOADING=1\n" + daemon.SdNotifyMonotonicUsec())
	defer a.notify("READY=1")
	next, err := a.load()
	if err != nil {
		a.metrics.observeReload(false)
		a.logger.Error("configuration reload refused, keeping the running configuration", "outcome", "refused", "err", err)
		return err
	}
	a.metrics.observeReload(true)
	next, keys := a.config().Reload(next)
	if len(keys) > 0 {
		a.logger.Warn("configuration changes that need a restart were not applied", "keys", keys)
	}
	level, _ := config.ParseLevel(next.Log.Level)
	a.level.Set(level)
	a.cfg.Store(next)
	a.exec.Wake()
	a.reporter.CheckTransport() // master.addr may have changed
	a.reporter.Wake()
	a.logger.Info("configuration reloaded", "log_level", next.Log.Level, "max_concurrent_builds", next.Build.MaxConcurrentBuilds,
		"queue_size", next.Build.QueueSize, "heartbeat_interval", next.Build.HeartbeatInterval, "master", safetext.URL(next.Master.Addr),
		"outcome", "applied")
	return nil
}
