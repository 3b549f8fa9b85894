package agent

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/health"
	"golang.org/x/sys/unix"
)

// Kubernetes' probes. /livez says the process serves and its loops go
// round; it never looks past the node, so an outage of the database, S3,
// Redis or CubeMaster never restarts a pod. /readyz says this replica can
// take builds: the spool and the store are writable with room, and the
// configured database answers. Both handlers only read what a background
// checker found, so a check that hangs never makes a probe time out.

const (
	// checkEvery is the pause between two rounds of readiness checks.
	checkEvery = 2 * time.Second
	// checkTimeout bounds each check of a round; a check still running
	// when the next round comes is not started twice.
	checkTimeout = 2 * time.Second
	// resultStale is the age past which /readyz no longer trusts the last
	// round: the checker itself is stuck.
	resultStale = 30 * time.Second
	// localLoopBound is how long a loop that only touches this node's
	// disks (dispatcher, status, checker) may go without a round.
	localLoopBound = 2 * time.Minute
)

// Loop names, as /livez shows them.
const (
	loopDispatcher = "dispatcher"
	loopReporter   = "reporter"
	loopStatus     = "status"
	loopChecker    = "checker"
)

// heartbeats records when each of the agent's loops last went round.
type heartbeats struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// beat records that loop went round at now.
func (h *heartbeats) beat(loop string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		h.last = map[string]time.Time{}
	}
	h.last[loop] = now
}

// reset marks every loop in loops as just started.
func (h *heartbeats) reset(loops []string, now time.Time) {
	for _, l := range loops {
		h.beat(l, now)
	}
}

// snapshot copies the last beats.
func (h *heartbeats) snapshot() map[string]time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.last)
}

// staleLoops returns, by loop, why each loop whose last beat is older than
// its bound at now is stale; a loop that never beat counts as beating at
// start.
func staleLoops(now, start time.Time, last map[string]time.Time, bounds map[string]time.Duration) map[string]string {
	stale := map[string]string{}
	for loop, bound := range bounds {
		at, ok := last[loop]
		if !ok {
			at = start
		}
		if age := now.Sub(at); age > bound {
			stale[loop] = fmt.Sprintf("%s loop has not gone round for %s (bound %s)", loop, age.Round(time.Second), bound)
		}
	}
	return stale
}

// loopBounds are how long each watched loop may go without a round. The
// reporter may wait a minute between looks, back off up to
// master.retry_max, and wait on callbacks bounded by
// master.callback_timeout. The bounds set in the agent (tests) win.
func (a *Agent) loopBounds() map[string]time.Duration {
	m := a.config().Master
	b := map[string]time.Duration{
		loopDispatcher: localLoopBound,
		loopReporter:   localLoopBound + m.RetryMax + 2*m.CallbackTimeout,
		loopStatus:     localLoopBound,
		loopChecker:    localLoopBound,
	}
	maps.Copy(b, a.boundOverride)
	return b
}

// readinessChecks are the checks of a round: the one list behind /health,
// /readyz, the status line and health_check_success.
func (a *Agent) readinessChecks() []health.Check {
	cfg := a.config()
	checks := []health.Check{
		{Name: "spool", Run: a.spool.Ping},
		{Name: "spool_writes", Run: func(context.Context) error {
			// A spool that answers may still refuse commits (read-only
			// filesystem, I/O errors, full below any reserve): every
			// submit would get 503.
			if err := a.recentRefusal(); err != nil {
				return err
			}
			dir := filepath.Dir(cfg.Spool.Path)
			if err := unix.Access(dir, unix.W_OK); err != nil {
				return fmt.Errorf("spool directory %s is not writable: %w", dir, err)
			}
			return nil
		}},
		{Name: "store", Run: func(context.Context) error { return storeWritable(cfg.Store.Dir) }},
	}
	for _, v := range volumes(cfg) {
		// Below its reserve every build (store, work_dir) or every
		// submit (spool) would fail.
		checks = append(checks, health.Check{Name: v.name + "_space", Run: func(context.Context) error {
			sp, err := v.space()
			if err != nil {
				return err
			}
			return v.belowReserve(sp)
		}})
	}
	if a.objects != nil {
		// An S3 bucket that fails falls back to local artifacts: a
		// warning, not a reason to take the replica out of service. A
		// local artifact root is.
		sev := health.Fail
		if a.objects.Abilities().LocalFallback {
			sev = health.Degrade
		}
		checks = append(checks, health.Check{Name: "blobstore", Severity: sev, Run: a.objects.Check})
	}
	if a.db != nil {
		// Every submit reads CubeMaster's database.
		checks = append(checks, health.Check{Name: "database", Run: a.db.Ping})
	}
	if a.live != nil {
		// Live progress is best effort (the callbacks carry the same
		// numbers): a warning, never not ready.
		checks = append(checks, health.Check{Name: "redis", Severity: health.Degrade, Run: a.live.Ping})
	}
	return checks
}

// checkLoop refreshes the readiness checks every checkEvery until ctx ends.
func (a *Agent) checkLoop(ctx context.Context) {
	a.health.Run(ctx, checkEvery, func() { a.beats.beat(loopChecker, time.Now()) })
}

// startBeats marks the watched loops as started now.
func (a *Agent) startBeats() {
	now := time.Now()
	a.started.Store(&now)
	a.beats.reset([]string{loopDispatcher, loopReporter, loopStatus, loopChecker}, now)
}

// handleLivez answers 200 while every watched loop goes round within its
// bound, and while the agent stops (its loops end then, and a restart
// would only cut the drain short).
func (a *Agent) handleLivez(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	if a.stopping.Load() {
		writeJSON(w, http.StatusOK, map[string]any{"status": "stopping"})
		return
	}
	start := now
	if s := a.started.Load(); s != nil {
		start = *s
	}
	last, bounds := a.beats.snapshot(), a.loopBounds()
	loops := map[string]float64{}
	for l := range bounds {
		at, ok := last[l]
		if !ok {
			at = start
		}
		loops[l] = now.Sub(at).Seconds()
	}
	body := map[string]any{"status": "ok", "loops_seconds_since_round": loops}
	if stale := staleLoops(now, start, last, bounds); len(stale) > 0 {
		body["status"], body["errors"] = "stalled", stale
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// handleReadyz answers the last round of readiness checks: 200 when no
// check that makes the node not ready failed, 503 otherwise, when the
// agent stops, or when the last round is too old. The reasons (paths,
// raw errors) go only to a caller with the token.
func (a *Agent) handleReadyz(w http.ResponseWriter, r *http.Request) {
	verbose, ok := a.verbose(w, r)
	if !ok {
		return
	}
	code, body := a.readiness(verbose)
	writeJSON(w, code, body)
}

// readiness is the answer to /readyz and /health: the status and each
// check of the last round, and with verbose the errors and warnings.
func (a *Agent) readiness(verbose bool) (code int, body map[string]any) {
	r := a.health.Last()
	problems, warnings := map[string]string{}, map[string]string{}
	body = map[string]any{}
	switch {
	case r == nil:
		problems["checks"] = "readiness checks have not completed yet"
	default:
		maps.Copy(problems, r.Failed)
		maps.Copy(warnings, r.Degraded)
		body["checks"] = r.Passed
		body["checked_at"] = r.At.UTC().Format(time.RFC3339Nano)
		if age := time.Since(r.At); age > resultStale {
			problems["checks"] = fmt.Sprintf("the last readiness checks ran %s ago", age.Round(time.Second))
		}
	}
	if a.stopping.Load() {
		problems["accepting"] = "shutting down"
	}
	code = http.StatusOK
	body["status"] = "ok"
	if len(problems) > 0 {
		code = http.StatusServiceUnavailable
		body["status"] = "not_ready"
	}
	if verbose {
		if len(problems) > 0 {
			body["errors"] = problems
		}
		if len(warnings) > 0 {
			body["warnings"] = warnings
		}
	}
	return code, body
}

// verbose reports whether a probe's caller asked for the details (paths,
// sizes, raw errors) and may see them: a caller that sends the token, or
// asks with ?verbose, must pass the token rule; ok is false when it did
// not and the answer is already written.
func (a *Agent) verbose(w http.ResponseWriter, r *http.Request) (verbose, ok bool) {
	_, asked := r.URL.Query()["verbose"]
	if !asked && r.Header.Get(api.TokenHeader) == "" {
		return false, true
	}
	if !a.admit(w, r) {
		return false, false
	}
	return true, true
}
