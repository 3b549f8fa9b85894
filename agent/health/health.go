package health

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Severity says what a failing check means for the node.
type Severity int

// The severities.
const (
	// Fail makes the node not ready: it cannot take builds.
	Fail Severity = iota
	// Degrade is a warning: builds go on, with less (no live progress,
	// artifacts kept locally).
	Degrade
)

// Check is one readiness check.
type Check struct {
	Name     string
	Severity Severity
	// Run answers nil when the check passes; it must honour ctx.
	Run func(ctx context.Context) error
}

// Round is one round of checks, as every reader sees it.
type Round struct {
	// At is when the round ended.
	At time.Time
	// Passed holds every check of the round by name: whether it passed.
	Passed map[string]bool
	// Failed holds the errors of the failing Fail checks, by name.
	Failed map[string]string
	// Degraded holds the errors of the failing Degrade checks, by name.
	Degraded map[string]string
}

// Ready reports whether no Fail check failed.
func (r *Round) Ready() bool { return len(r.Failed) == 0 }

// FailedNames lists the failing Fail checks, sorted.
func (r *Round) FailedNames() []string { return slices.Sorted(maps.Keys(r.Failed)) }

// Verdict is the last round as the probes judge it at one moment.
type Verdict struct {
	// Round is the last round; nil before the first.
	Round *Round
	// Problems make the node not ready, by name: the failing Fail checks,
	// and "checks" when no round has finished yet or the last one is too
	// old to trust (the checker itself is stuck).
	Problems map[string]string
	// Warnings are the failing Degrade checks, by name.
	Warnings map[string]string
}

// Checker runs rounds of checks and keeps the last one.
type Checker struct {
	// Checks returns the checks of a round; it is called at every round,
	// so a reloaded configuration takes effect at the next one.
	checks func() []Check
	// timeout bounds each check of a round; a check still running when
	// the next round comes is waited on, never started twice.
	timeout time.Duration

	guards  sync.Map // check name → *guard
	last    atomic.Pointer[Round]
	success *prometheus.GaugeVec
}

// New returns a Checker of the checks that checks returns, each bounded
// by timeout per round.
func New(checks func() []Check, timeout time.Duration) *Checker {
	return &Checker{
		checks:  checks,
		timeout: timeout,
		success: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: "health", Name: "check_success",
			Help: "Whether each readiness check passed in the last round (1) or failed (0), by check; /health and /readyz show the same round.",
		}, []string{"check"}),
	}
}

// Collectors are the checker's series.
func (c *Checker) Collectors() []prometheus.Collector { return []prometheus.Collector{c.success} }

// Last returns the last finished round, nil before the first.
func (c *Checker) Last() *Round { return c.last.Load() }

// Verdict judges the last round at now: a round older than stale says
// nothing about the node any more.
func (c *Checker) Verdict(now time.Time, stale time.Duration) Verdict {
	v := Verdict{Round: c.Last(), Problems: map[string]string{}, Warnings: map[string]string{}}
	if v.Round == nil {
		v.Problems["checks"] = "readiness checks have not completed yet"
		return v
	}
	maps.Copy(v.Problems, v.Round.Failed)
	maps.Copy(v.Warnings, v.Round.Degraded)
	if age := now.Sub(v.Round.At); age > stale {
		v.Problems["checks"] = fmt.Sprintf("the last readiness checks ran %s ago", age.Round(time.Second))
	}
	return v
}

// Run runs a round every interval until ctx ends, calling beat before
// and after each round (the agent's loop watch).
func (c *Checker) Run(ctx context.Context, interval time.Duration, beat func()) {
	for {
		beat()
		c.Round(ctx)
		beat()
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// Round runs every check at once and keeps the result, unless ctx ended
// meanwhile (a round cut short says nothing about the node).
func (c *Checker) Round(ctx context.Context) *Round {
	checks := c.checks()
	r := &Round{Passed: map[string]bool{}, Failed: map[string]string{}, Degraded: map[string]string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ch := range checks {
		wg.Go(func() {
			err := c.guard(ch.Name).run(ctx, c.timeout, ch.Run)
			mu.Lock()
			defer mu.Unlock()
			r.Passed[ch.Name] = err == nil
			switch {
			case err == nil:
			case ch.Severity == Degrade:
				r.Degraded[ch.Name] = err.Error()
			default:
				r.Failed[ch.Name] = err.Error()
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	r.At = time.Now()
	prev := c.last.Swap(r)
	for name, ok := range r.Passed {
		v := 0.0
		if ok {
			v = 1
		}
		c.success.WithLabelValues(name).Set(v)
	}
	if prev != nil {
		// A check a reload removed is no longer a series.
		for name := range prev.Passed {
			if _, ok := r.Passed[name]; !ok {
				c.success.DeleteLabelValues(name)
			}
		}
	}
	return r
}

func (c *Checker) guard(name string) *guard {
	g, _ := c.guards.LoadOrStore(name, &guard{})
	return g.(*guard)
}

// guard runs one check at a time: a round whose check is still running
// from an earlier round (a driver that ignores its deadline) waits on
// that attempt instead of piling up another.
type guard struct {
	mu       sync.Mutex
	inflight *attempt
}

// attempt is one run of a check; err is set before done closes.
type attempt struct {
	since time.Time
	done  chan struct{}
	err   error
}

// run runs check in its own goroutine with a deadline of timeout, unless
// an attempt is still running, and waits a quarter past timeout for the
// attempt to end.
func (g *guard) run(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
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
	// A check that honours its deadline says why it gave up (its own
	// error, not ours): wait a little past it.
	t := time.NewTimer(timeout + timeout/4)
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
