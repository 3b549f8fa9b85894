package oci

import (
	"context"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// streamGate hands out the streams of one Start: the right to read a
// response body. Up to target streams run at once (rateProbe moves it,
// from 1 up to limit), at most perBlob on one blob, and each also takes a
// slot of the Puller's (Options.DownloadConnections across its Fetches).
// Waiting streams are served bottom layer first: a blob's streams (its
// first, and the extra ones that fetch its chunks) go before any of a
// later blob's, and blobs get their first stream in manifest order, so
// the layer a build applies first gets the link first, and the next ones
// get what it cannot use.
type streamGate struct {
	slots   chan struct{}
	limit   int
	perBlob int

	mu sync.Mutex
	// lanes are the Start's blobs in turn order.
	lanes   []*blobLane
	target  int
	granted int
	flowing int
	waiting []*streamTicket
	ttfb    time.Duration
	// rate is one stream's bytes per second, as last measured; read
	// without the lock (by runs holding theirs).
	rate atomic.Uint64 // math.Float64bits
	// starved is set once the build reading the blobs waited for bytes
	// of a download under way: only then can more streams make it end
	// sooner. Until then (a registry faster than the build applies) the
	// target stays where it started, and extra streams would only take
	// the build's CPU.
	starved atomic.Bool
}

// blobLane is one blob's place at the gate: its turn (manifest order
// among the Start's distinct blobs) and its streams; opened once its first
// stream was granted, ended once its download (or cache lookup) ended.
type blobLane struct {
	turn          int
	granted       int
	opened, ended bool
}

// streamTicket is a stream waiting at the gate. want, called under the
// gate's lock, tells whether the stream still has work; one without is
// sent away.
type streamTicket struct {
	lane    *blobLane
	want    func() bool
	done    chan struct{}
	granted bool
}

// newStreamGate makes the gate of a Start with n distinct blobs, whose
// lanes are g.lanes[turn].
func newStreamGate(slots chan struct{}, perBlob, first, n int) *streamGate {
	limit := cap(slots)
	g := &streamGate{slots: slots, limit: limit, perBlob: max(perBlob, 1), target: min(first, limit)}
	g.lanes = make([]*blobLane, n)
	for k := range g.lanes {
		g.lanes[k] = &blobLane{turn: k}
	}
	return g
}

// end records that lane's download (or cache lookup) ended: the blobs
// after it need not wait for its first stream.
func (g *streamGate) end(lane *blobLane) {
	g.mu.Lock()
	defer g.mu.Unlock()
	lane.ended = true
	g.dispatchLocked()
}

// inOrderLocked reports whether every blob before lane got its first
// stream or ended.
func (g *streamGate) inOrderLocked(lane *blobLane) bool {
	for _, l := range g.lanes[:lane.turn] {
		if !l.opened && !l.ended {
			return false
		}
	}
	return true
}

// acquire waits until a stream of lane may run, and takes a Puller slot.
// It returns false without an error when want says the stream has no work
// any more. A granted stream ends with release.
func (g *streamGate) acquire(ctx context.Context, lane *blobLane, want func() bool) (bool, error) {
	t := &streamTicket{lane: lane, want: want, done: make(chan struct{})}
	g.mu.Lock()
	i := sort.Search(len(g.waiting), func(i int) bool { return g.waiting[i].lane.turn > lane.turn })
	g.waiting = append(g.waiting[:i], append([]*streamTicket{t}, g.waiting[i:]...)...)
	g.dispatchLocked()
	g.mu.Unlock()
	select {
	case <-t.done:
	case <-ctx.Done():
		g.mu.Lock()
		select {
		case <-t.done:
		default:
			g.dropLocked(t)
			g.mu.Unlock()
			return false, ctx.Err()
		}
		g.mu.Unlock()
		if t.granted {
			g.unlock(lane)
		}
		return false, ctx.Err()
	}
	if !t.granted {
		return false, nil
	}
	select {
	case g.slots <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		g.unlock(lane)
		return false, ctx.Err()
	}
}

// release ends a stream acquire granted.
func (g *streamGate) release(lane *blobLane) {
	<-g.slots
	g.unlock(lane)
}

func (g *streamGate) unlock(lane *blobLane) {
	g.mu.Lock()
	g.granted--
	lane.granted--
	g.dispatchLocked()
	g.mu.Unlock()
}

// surplus reports whether more streams run than the target allows (the
// rule took a step back): an extra stream then ends after its chunk.
func (g *streamGate) surplus() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.granted > g.target
}

// poke lets waiting streams whose work went away leave.
func (g *streamGate) poke() {
	g.mu.Lock()
	g.dispatchLocked()
	g.mu.Unlock()
}

func (g *streamGate) dropLocked(t *streamTicket) {
	for i, w := range g.waiting {
		if w == t {
			g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
			return
		}
	}
}

// dispatchLocked sends away the waiting streams without work and grants
// the others in turn order while the target allows; a blob at its
// per-blob cap lets the later ones pass, a blob whose first stream has
// not come yet holds them.
func (g *streamGate) dispatchLocked() {
	kept := g.waiting[:0]
	for _, t := range g.waiting {
		switch {
		case !t.want():
			close(t.done)
		case g.granted < g.target && t.lane.granted < g.perBlob && (t.lane.opened || g.inOrderLocked(t.lane)):
			g.granted++
			t.lane.granted++
			t.lane.opened = true
			t.granted = true
			close(t.done)
		default:
			kept = append(kept, t)
		}
	}
	clear(g.waiting[len(kept):])
	g.waiting = kept
}

// flow counts a stream entering (+1) or leaving (-1) a response body;
// firstByte, when entering, is how long the request took to bring it.
func (g *streamGate) flow(delta int, firstByte time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.flowing += delta
	if delta > 0 {
		if g.ttfb == 0 {
			g.ttfb = firstByte
		} else {
			g.ttfb = (g.ttfb + firstByte) / 2
		}
	}
}

// sample reads the streams' state for the rule: a stream waiting only
// because its blob has perBlob streams is no demand for a higher target.
func (g *streamGate) sample(now time.Time, received int64) probeSample {
	g.mu.Lock()
	defer g.mu.Unlock()
	demand := false
	for _, t := range g.waiting {
		demand = demand || t.lane.granted < g.perBlob
	}
	return probeSample{now: now, bytes: received, flowing: g.flowing, granted: g.granted, demand: demand, ttfb: g.ttfb}
}

// retarget sets the number of streams and the measured per-stream rate.
func (g *streamGate) retarget(target int, rate float64) {
	g.rate.Store(math.Float64bits(rate))
	g.mu.Lock()
	defer g.mu.Unlock()
	if target != g.target {
		g.target = target
		g.dispatchLocked()
	}
}

// streamRate returns one stream's measured bytes per second (0 before
// a measurement) and a request's time to its first byte.
func (g *streamGate) streamRate() (float64, time.Duration) {
	g.mu.Lock()
	ttfb := g.ttfb
	g.mu.Unlock()
	return math.Float64frombits(g.rate.Load()), ttfb
}
