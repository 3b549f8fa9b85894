package agent

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/health"
	"github.com/cubesandbox/cubetemplatecenter/agent/space"
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

// watchedLoops are the loops /livez watches.
var watchedLoops = []string{loopDispatcher, loopReporter, loopStatus, loopChecker}

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
		{Name: "store", Run: func(context.Context) error { return space.Named(cfg, space.Store).Writable() }},
	}
	for _, v := range space.Volumes(cfg) {
		// Below its reserve every build (store, work_dir) or every
		// submit (spool) would fail.
		checks = append(checks, health.Check{Name: v.Name + "_space", Run: func(context.Context) error { return v.Check() }})
	}
	if a.blobs != nil {
		// An S3 bucket that fails falls back to local artifacts: a
		// warning, not a reason to take the replica out of service. A
		// local artifact root is.
		sev := health.Fail
		if a.blobs.Abilities().LocalFallback {
			sev = health.Degrade
		}
		checks = append(checks, health.Check{Name: "blobstore", Severity: sev, Run: a.blobs.Check})
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
	a.health.Run(ctx, checkEvery, func() { a.loops.Beat(loopChecker, time.Now()) })
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
	loops, stale := a.loops.Liveness(now, a.loopBounds())
	body := map[string]any{"status": "ok", "loops_seconds_since_round": loops}
	if len(stale) > 0 {
		body["status"], body["errors"] = "stalled", stale
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// handleHealth answers upstream's shape ({"status", "checks"}) from the
// last round of readiness checks, never running one itself. A caller with
// the token also gets the errors, the volumes' space and the blob store's
// credentials source.
func (a *Agent) handleHealth(w http.ResponseWriter, r *http.Request) {
	verbose, ok := a.verbose(w, r)
	if !ok {
		return
	}
	code, body := a.readiness(verbose)
	if !verbose {
		writeJSON(w, code, map[string]any{"status": body["status"], "checks": body["checks"]})
		return
	}
	body["space"] = space.Views(a.config())
	if c, ok := a.blobs.(interface{ CredentialsSource() string }); ok {
		// Which source signs S3 requests (static, env_aws, web_identity,
		// ...), never the keys: a wrong role shows here.
		body["blobstore_credentials"] = c.CredentialsSource()
	}
	writeJSON(w, code, body)
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
	v := a.health.Verdict(time.Now(), resultStale)
	if a.stopping.Load() {
		v.Problems["accepting"] = "shutting down"
	}
	code, body = http.StatusOK, map[string]any{"status": "ok"}
	if v.Round != nil {
		body["checks"], body["checked_at"] = v.Round.Passed, v.Round.At.UTC().Format(time.RFC3339Nano)
	}
	if len(v.Problems) > 0 {
		code, body["status"] = http.StatusServiceUnavailable, "not_ready"
	}
	if verbose && len(v.Problems) > 0 {
		body["errors"] = v.Problems
	}
	if verbose && len(v.Warnings) > 0 {
		body["warnings"] = v.Warnings
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
