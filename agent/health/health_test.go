package health

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRound: every check is in Passed; a failing Fail check makes the
// round not ready and shows in Failed, a failing Degrade check only in
// Degraded.
func TestRound(t *testing.T) {
	c := New(func() []Check {
		return []Check{
			{Name: "ok", Run: func(context.Context) error { return nil }},
			{Name: "store", Run: func(context.Context) error { return errors.New("store /x is not writable") }},
			{Name: "redis", Severity: Degrade, Run: func(context.Context) error { return errors.New("redis: refused") }},
		}
	}, time.Second)
	if c.Last() != nil {
		t.Fatal("Last before any round is not nil")
	}
	r := c.Round(context.Background())
	if r != c.Last() {
		t.Error("Last is not the round just run")
	}
	if !r.Passed["ok"] || r.Passed["store"] || r.Passed["redis"] || len(r.Passed) != 3 {
		t.Errorf("Passed = %v", r.Passed)
	}
	if r.Ready() || r.Failed["store"] != "store /x is not writable" || len(r.Failed) != 1 {
		t.Errorf("Failed = %v (ready %v), want only store", r.Failed, r.Ready())
	}
	if r.Degraded["redis"] != "redis: refused" || len(r.Degraded) != 1 {
		t.Errorf("Degraded = %v, want only redis", r.Degraded)
	}
	if got := r.FailedNames(); len(got) != 1 || got[0] != "store" {
		t.Errorf("FailedNames = %v", got)
	}
}

// TestReadersNeverWait: while a check hangs, Last answers the previous
// round at once, and the next round waits on the running attempt instead
// of starting another one.
func TestReadersNeverWait(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	hang := atomic.Bool{}
	c := New(func() []Check {
		return []Check{{Name: "database", Run: func(ctx context.Context) error {
			calls.Add(1)
			if hang.Load() {
				<-release // ignores ctx, as a stuck driver does
			}
			return nil
		}}}
	}, 50*time.Millisecond)
	first := c.Round(context.Background())
	hang.Store(true)
	done := make(chan *Round)
	go func() { done <- c.Round(context.Background()) }()
	for calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	// The check is blocked on release: a reader that waited on it would
	// never return.
	if got := c.Last(); got != first {
		t.Errorf("Last during a hanging check = %+v, want the first round", got)
	}
	r := <-done
	if r.Passed["database"] || !strings.Contains(r.Failed["database"], "no answer after") {
		t.Errorf("round with a hanging check = %+v, want database failing with no answer", r)
	}
	c.Round(context.Background())
	if n := calls.Load(); n != 2 {
		t.Errorf("the check ran %d times; a round must wait on the attempt still running, not start another", n)
	}
	close(release)
}

// TestSuccessSeries: check_success has one series per check of the last
// round, 1 or 0; a check no longer in the list loses its series.
func TestSuccessSeries(t *testing.T) {
	withRedis := true
	c := New(func() []Check {
		cs := []Check{{Name: "store", Run: func(context.Context) error { return errors.New("gone") }}}
		if withRedis {
			cs = append(cs, Check{Name: "redis", Severity: Degrade, Run: func(context.Context) error { return nil }})
		}
		return cs
	}, time.Second)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c.Collectors()...)
	c.Round(context.Background())
	want := `
# HELP health_check_success Whether each readiness check passed in the last round (1) or failed (0), by check; /health and /readyz show the same round.
# TYPE health_check_success gauge
health_check_success{check="redis"} 1
health_check_success{check="store"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "health_check_success"); err != nil {
		t.Error(err)
	}
	withRedis = false
	c.Round(context.Background())
	if n := testutil.CollectAndCount(c.success); n != 1 {
		t.Errorf("%d series after redis left the list, want 1", n)
	}
}

// TestRoundCancelled: a round cut short by its context is not kept.
func TestRoundCancelled(t *testing.T) {
	c := New(func() []Check {
		return []Check{{Name: "slow", Run: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}}
	}, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r := c.Round(ctx); r != nil || c.Last() != nil {
		t.Errorf("a cancelled round was kept: %+v", r)
	}
}

// TestVerdict: before the first round the node is not ready; after it,
// the failing Fail checks are problems and the Degrade ones warnings; a
// round older than the bound is a problem of its own.
func TestVerdict(t *testing.T) {
	c := New(func() []Check {
		return []Check{
			{Name: "store", Run: func(context.Context) error { return errors.New("store /x is not writable") }},
			{Name: "redis", Severity: Degrade, Run: func(context.Context) error { return errors.New("redis: refused") }},
		}
	}, time.Second)
	if v := c.Verdict(time.Now(), time.Minute); v.Round != nil || v.Problems["checks"] != "readiness checks have not completed yet" {
		t.Errorf("verdict before any round = %+v", v)
	}
	r := c.Round(context.Background())
	v := c.Verdict(r.At.Add(time.Minute), time.Minute)
	if v.Round != r || len(v.Problems) != 1 || v.Problems["store"] == "" || len(v.Warnings) != 1 || v.Warnings["redis"] == "" {
		t.Errorf("verdict at the bound = %+v, want store a problem and redis a warning", v)
	}
	v = c.Verdict(r.At.Add(90*time.Second), time.Minute)
	if got := v.Problems["checks"]; got != "the last readiness checks ran 1m30s ago" || v.Problems["store"] == "" {
		t.Errorf("verdict past the bound = %+v, want the stale round named besides store", v)
	}
	v.Problems["accepting"] = "shutting down"
	if _, ok := c.Last().Failed["accepting"]; ok {
		t.Error("a verdict's problems alias the round's")
	}
}
