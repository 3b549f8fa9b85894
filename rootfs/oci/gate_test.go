package oci

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// acquireAsync starts an acquire and returns a channel with its result.
func acquireAsync(ctx context.Context, g *streamGate, lane *blobLane, want func() bool) <-chan bool {
	ch := make(chan bool, 1)
	go func() {
		ok, _ := g.acquire(ctx, lane, want)
		ch <- ok
	}()
	return ch
}

func always() bool { return true }

// granted reports whether ch delivers true soon; waiting tells a grant
// that should not come yet from one that is late.
func granted(t *testing.T, ch <-chan bool, wait time.Duration) bool {
	t.Helper()
	select {
	case ok := <-ch:
		return ok
	case <-time.After(wait):
		return false
	}
}

// TestStreamGate: blobs get their first stream in manifest order, a blob
// at its per-blob cap lets a later one pass, the Puller's slots bound the
// streams of every gate together, and a waiting stream without work is
// sent away.
func TestStreamGate(t *testing.T) {
	ctx := context.Background()
	const soon, late = time.Second, 50 * time.Millisecond
	t.Run("Order", func(t *testing.T) {
		g := newStreamGate(make(chan struct{}, 8), 2, 8, 2)
		c1 := acquireAsync(ctx, g, g.lanes[1], always)
		if granted(t, c1, late) {
			t.Fatal("lane 1 granted before lane 0 had its first stream")
		}
		if !granted(t, acquireAsync(ctx, g, g.lanes[0], always), soon) || !granted(t, c1, soon) {
			t.Fatal("lanes 0 and 1 not granted once lane 0 came")
		}
	})
	t.Run("PerBlobCap", func(t *testing.T) {
		g := newStreamGate(make(chan struct{}, 8), 1, 8, 2)
		if !granted(t, acquireAsync(ctx, g, g.lanes[0], always), soon) {
			t.Fatal("lane 0 not granted")
		}
		c0 := acquireAsync(ctx, g, g.lanes[0], always)
		if !granted(t, acquireAsync(ctx, g, g.lanes[1], always), soon) {
			t.Fatal("lane 1 held back by lane 0 at its cap")
		}
		if granted(t, c0, late) {
			t.Fatal("lane 0 got a second stream past its cap of 1")
		}
		g.release(g.lanes[0])
		if !granted(t, c0, soon) {
			t.Fatal("lane 0's second stream not granted once its first ended")
		}
	})
	t.Run("PullerSlots", func(t *testing.T) {
		slots := make(chan struct{}, 2)
		g, other := newStreamGate(slots, 4, 8, 1), newStreamGate(slots, 4, 8, 1)
		for range 2 {
			if !granted(t, acquireAsync(ctx, g, g.lanes[0], always), soon) {
				t.Fatal("a stream within the slots not granted")
			}
		}
		co := acquireAsync(ctx, other, other.lanes[0], always)
		if granted(t, co, late) {
			t.Fatal("another Fetch's stream got past the Puller's two slots")
		}
		g.release(g.lanes[0])
		if !granted(t, co, soon) {
			t.Fatal("the released slot went to nobody")
		}
	})
	t.Run("Target", func(t *testing.T) {
		g := newStreamGate(make(chan struct{}, 8), 4, 1, 1)
		if !granted(t, acquireAsync(ctx, g, g.lanes[0], always), soon) {
			t.Fatal("the first stream not granted")
		}
		c := acquireAsync(ctx, g, g.lanes[0], always)
		if granted(t, c, late) {
			t.Fatal("a second stream granted at a target of 1")
		}
		if s := g.sample(time.Now(), 0); !s.demand || s.granted != 1 {
			t.Fatalf("sample %+v: want demand and one granted", s)
		}
		g.retarget(2, 0)
		if !granted(t, c, soon) {
			t.Fatal("the second stream not granted at a target of 2")
		}
	})
	t.Run("NoWork", func(t *testing.T) {
		g := newStreamGate(make(chan struct{}, 8), 4, 1, 1)
		if !granted(t, acquireAsync(ctx, g, g.lanes[0], always), soon) {
			t.Fatal("the first stream not granted")
		}
		var work atomic.Bool
		work.Store(true)
		c := acquireAsync(ctx, g, g.lanes[0], work.Load)
		time.Sleep(late)
		work.Store(false)
		g.poke()
		select {
		case ok := <-c:
			if ok {
				t.Fatal("a stream without work was granted")
			}
		case <-time.After(soon):
			t.Fatal("a stream without work kept waiting")
		}
	})
	t.Run("Cancel", func(t *testing.T) {
		g := newStreamGate(make(chan struct{}, 8), 4, 1, 1)
		if !granted(t, acquireAsync(ctx, g, g.lanes[0], always), soon) {
			t.Fatal("the first stream not granted")
		}
		cctx, cancel := context.WithCancel(ctx)
		c := acquireAsync(cctx, g, g.lanes[0], always)
		cancel()
		if granted(t, c, soon) {
			t.Fatal("a cancelled wait was granted")
		}
		if s := g.sample(time.Now(), 0); s.demand || s.granted != 1 {
			t.Fatalf("sample %+v after the cancelled wait: want no demand, one granted", s)
		}
	})
}
