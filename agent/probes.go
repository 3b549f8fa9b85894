package agent

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

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

// probeResult is one round of readiness checks.
type probeResult struct {
	at       time.Time
	checks   map[string]bool
	problems map[string]string
}

// guardedCheck runs one check at a time: a round whose check is still
// running from an earlier round (a driver that ignores its deadline) waits
// on that attempt instead of piling up another.
type guardedCheck struct {
	mu       sync.Mutex
	inflight *attempt
}

// attempt is one run of a check; err is set before done closes.
type attempt struct {
	since time.Time
	done  chan struct{}
	err   error
}

// run runs check in its own goroutine, unless an attempt is still running,
// and waits up to timeout for the attempt to end.
func (g *guardedCheck) run(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
	g.mu.Lock()
	at := g.inflight
	if at == nil {
		at = &attempt{since: time.Now(), done: make(chan struct{})}
		g.inflight = at
		go func() {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			at.err = check(cctx)
			cancel()
			g.mu.Lock()
			g.inflight = nil
			g.mu.Unlock()
			close(at.done)
		}()
	}
	g.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-at.done:
		return at.err
	case <-t.C:
		return fmt.Errorf("no answer after %s", time.Since(at.since).Round(100*time.Millisecond))
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checker keeps the last round of readiness checks for /readyz.
type checker struct {
	guards  sync.Map // check name → *guardedCheck
	result  atomic.Pointer[probeResult]
	started atomic.Pointer[time.Time]
}

func (c *checker) guard(name string) *guardedCheck {
	g, _ := c.guards.LoadOrStore(name, &guardedCheck{})
	return g.(*guardedCheck)
}

// readinessChecks are the checks behind /readyz, by name.
func (a *Agent) readinessChecks() map[string]func(context.Context) error {
	cfg := a.config()
	checks := map[string]func(context.Context) error{
		"spool": a.spool.Ping,
		"spool_writes": func(context.Context) error {
			if err := a.recentRefusal(); err != nil {
				return err
			}
			dir := filepath.Dir(cfg.Spool.Path)
			if err := unix.Access(dir, unix.W_OK); err != nil {
				return fmt.Errorf("spool directory %s is not writable: %w", dir, err)
			}
			return nil
		},
		"store": func(context.Context) error { return storeWritable(cfg.Store.Dir) },
	}
	for _, v := range volumes(cfg) {
		checks[v.name+"_space"] = func(context.Context) error {
			sp, err := v.space()
			if err != nil {
				return err
			}
			return v.belowReserve(sp)
		}
	}
	// An S3 bucket that fails falls back to local artifacts: not a reason
	// to take the replica out of service. A local artifact root is.
	if a.objects != nil && !a.objects.Abilities().LocalFallback {
		checks["blobstore"] = a.objects.Check
	}
	if a.db != nil {
		// Every submit reads CubeMaster's database.
		checks["database"] = a.db.Ping
	}
	return checks
}

// checkRound runs every readiness check at once and keeps the result.
func (a *Agent) checkRound(ctx context.Context) {
	checks := a.readinessChecks()
	r := &probeResult{checks: map[string]bool{}, problems: map[string]string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, check := range checks {
		wg.Go(func() {
			err := a.checker.guard(name).run(ctx, checkTimeout, check)
			mu.Lock()
			defer mu.Unlock()
			r.checks[name] = err == nil
			if err != nil {
				r.problems[name] = err.Error()
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	r.at = time.Now()
	a.checker.result.Store(r)
}

// checkLoop refreshes the readiness checks every checkEvery until ctx ends.
func (a *Agent) checkLoop(ctx context.Context) {
	for {
		a.beats.beat(loopChecker, time.Now())
		a.checkRound(ctx)
		a.beats.beat(loopChecker, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-time.After(checkEvery):
		}
	}
}

// startBeats marks the watched loops as started now.
func (a *Agent) startBeats() {
	now := time.Now()
	a.checker.started.Store(&now)
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
	if s := a.checker.started.Load(); s != nil {
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

// handleReadyz answers the last round of readiness checks: 200 when all
// passed, 503 with the reasons otherwise, when the agent stops, or when
// the last round is too old.
func (a *Agent) handleReadyz(w http.ResponseWriter, _ *http.Request) {
	r := a.checker.result.Load()
	problems := map[string]string{}
	body := map[string]any{}
	switch {
	case r == nil:
		problems["checks"] = "readiness checks have not completed yet"
	default:
		maps.Copy(problems, r.problems)
		body["checks"] = r.checks
		body["checked_at"] = r.at.UTC().Format(time.RFC3339Nano)
		if age := time.Since(r.at); age > resultStale {
			problems["checks"] = fmt.Sprintf("the last readiness checks ran %s ago", age.Round(time.Second))
		}
	}
	if a.stopping.Load() {
		problems["accepting"] = "shutting down"
	}
	if len(problems) > 0 {
		body["status"], body["errors"] = "not_ready", problems
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	body["status"] = "ok"
	writeJSON(w, http.StatusOK, body)
}
