package oci

import (
	"context"
	"time"
)

// Constants of the rule that sizes a Fetch's streams
// (docs/performance.md, "Parallel ranged chunks").
const (
	// probeTick is how often the rule samples a Fetch's streams.
	probeTick = 10 * time.Millisecond
	// probeWindow is the shortest window a rate is measured over; a
	// window also lasts at least twice the time a new stream takes to
	// bring its first byte.
	probeWindow = 50 * time.Millisecond
	// probeGain is how much more the streams must bring after a step for
	// the next one to be tried.
	probeGain = 0.125
	// probeSure is a gain that decides a step after probeEarly of its
	// window (and at least a first byte's time): a doubling held back by
	// a per-connection cap shows at once, one the link cannot carry
	// takes the whole window to be refused.
	probeSure  = 0.3
	probeEarly = 30 * time.Millisecond
	// probeSettleMax bounds the wait for the streams a step added to
	// bring bytes: a step without work for them is measured anyway.
	probeSettleMax = 500 * time.Millisecond
	// probeRetry is how long a target stays after a step was taken back
	// before the rule measures and steps again: what a step gains changes
	// as a build's layers end (the streams of the last one alone may fill
	// what it shared) and one window on two busy cores can misjudge it.
	probeRetry = time.Second
)

// probeSample is what the rule sees of a Fetch's streams at one moment.
type probeSample struct {
	now time.Time
	// bytes counts the layer bytes the Fetch received so far.
	bytes int64
	// flowing counts streams inside a response body; granted those
	// holding a grant (flowing, or between requests).
	flowing, granted int
	// demand tells that a stream waits for the target to grow.
	demand bool
	// ttfb is how long a request takes to bring its first body byte.
	ttfb time.Duration
}

type probePhase int

const (
	probeBase   probePhase = iota // measuring with the current target
	probeSettle                   // a step was taken: waiting for its streams
	probeRamp                     // their first bytes came: one ttfb more
	probeAfter                    // measuring the step
	probeHold                     // the last step did not pay: wait probeRetry
	probeDone                     // at the limit: no more
)

// rateProbe is the rule: a Fetch starts with one stream; while streams
// wait for one, the target doubles (up to limit) as long as the last
// doubling raised the throughput by more than probeGain; a doubling that
// did not is taken back, and the target stays for probeRetry before the
// rule measures and tries again. Throughput is
// compared as per-stream rate × target, the per-stream rate being the
// bytes of a window over the time streams spent inside bodies: the gaps
// between requests, and streams without work, do not count against a
// step. A step the link cannot carry halves the per-stream rate and ends
// the probing; one a per-connection cap held back doubles the throughput.
// It is a pure state machine fed by samples.
type rateProbe struct {
	limit  int
	target int

	phase  probePhase
	mark   time.Time // start of the phase or window
	last   probeSample
	bytes0 int64   // bytes at the window's start
	busy   float64 // seconds streams spent inside bodies in the window
	// before is the throughput (per-stream rate × target) before the
	// step being measured, from was the target then; perStream is the
	// last measured per-stream rate.
	before, perStream float64
	from              int
}

func newRateProbe(limit, first int, now time.Time) *rateProbe {
	r := &rateProbe{limit: max(limit, 1), mark: now, last: probeSample{now: now}}
	r.target = min(max(first, 1), r.limit)
	if r.target == r.limit {
		r.phase = probeDone
	}
	return r
}

// done reports that the target will not change any more.
func (r *rateProbe) done() bool { return r.phase == probeDone }

// observe takes a sample and returns the target number of streams.
func (r *rateProbe) observe(s probeSample) int {
	dt := s.now.Sub(r.last.now).Seconds()
	if dt > 0 {
		r.busy += float64(r.last.flowing) * dt
	}
	r.last = s
	switch r.phase {
	case probeBase, probeAfter:
		elapsed, window := s.now.Sub(r.mark), max(probeWindow, 2*s.ttfb)
		if elapsed < min(max(probeEarly, s.ttfb), window) || r.busy <= 0 {
			break
		}
		perStream := float64(s.bytes-r.bytes0) / r.busy
		through := perStream * float64(r.target)
		sure := r.phase == probeAfter && through > r.before*(1+probeSure)
		if elapsed < window && !sure {
			break
		}
		r.perStream = perStream
		if r.phase == probeAfter && through <= r.before*(1+probeGain) {
			r.target, r.phase, r.mark = r.from, probeHold, s.now
			break
		}
		if r.target >= r.limit {
			r.phase = probeDone
			break
		}
		if !s.demand {
			r.phase = probeBase
			r.window(s)
			break
		}
		r.before, r.from = through, r.target
		r.target = min(2*r.target, r.limit)
		r.phase, r.mark = probeSettle, s.now
	case probeSettle:
		if s.flowing >= s.granted || s.now.Sub(r.mark) >= probeSettleMax {
			r.phase, r.mark = probeRamp, s.now
		}
	case probeRamp:
		if s.now.Sub(r.mark) >= s.ttfb {
			r.phase = probeAfter
			r.window(s)
		}
	case probeHold:
		if s.now.Sub(r.mark) >= probeRetry {
			r.phase = probeBase
			r.window(s)
		}
	}
	return r.target
}

// resume measures afresh from s, after ticks the rule did not see.
func (r *rateProbe) resume(s probeSample) {
	r.last = s
	r.window(s)
}

// window starts a measuring window at s.
func (r *rateProbe) window(s probeSample) {
	r.mark, r.bytes0, r.busy = s.now, s.bytes, 0
}

// adapt runs the rule for g until it is done or ctx ends, reading the
// Fetch's received bytes from received.
func (g *streamGate) adapt(ctx context.Context, received func() int64) {
	g.mu.Lock()
	first := g.target
	g.mu.Unlock()
	r := newRateProbe(g.limit, first, time.Now())
	if r.done() {
		return
	}
	t := time.NewTicker(probeTick)
	defer t.Stop()
	measuring := false
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !g.starved.Load() {
				continue
			}
			s := g.sample(now, received())
			if !measuring {
				// The first window starts when the build first waited.
				measuring = true
				r.resume(s)
				continue
			}
			target := r.observe(s)
			g.retarget(target, r.perStream)
			if r.done() {
				return
			}
		}
	}
}
