package rootfs

import (
	"math"
	"testing"
	"time"
)

// TestMemoryPacer follows the limit through two overlapping builds.
func TestMemoryPacer(t *testing.T) {
	const ceiling = 4 << 30
	limit := int64(ceiling)
	var calls int
	p := newMemoryPacer(func(l int64) int64 {
		old := limit
		if l >= 0 {
			limit = l
			calls++
		}
		return old
	})
	share := func(sum float64) int64 { return int64(paceBase + paceShare*sum) }
	check := func(step string, want int64) {
		t.Helper()
		if limit != want {
			t.Errorf("%s: limit %d, want %d", step, limit, want)
		}
	}
	a := p.start()
	a.grow(paceFloor - 1)
	check("small tree", ceiling)
	if calls != 0 {
		t.Errorf("small tree: %d calls of SetMemoryLimit, want 0", calls)
	}
	a.grow(1 << 30)
	check("large tree", share(1<<30)+paceBuild)
	b := p.start()
	b.grow(1 << 30)
	check("two large trees", share(2<<30)+2*paceBuild)
	b.grow(8 << 30)
	check("trees above the ceiling", ceiling)
	b.done()
	b.done()
	b.grow(8 << 30) // after done: ignored
	check("one build done", share(1<<30)+paceBuild)
	a.done()
	check("all done", ceiling)
}

// TestMemoryPacerNoLimit checks that the default (no GOMEMLIMIT) is what
// the pacer restores.
func TestMemoryPacerNoLimit(t *testing.T) {
	limit := int64(math.MaxInt64)
	p := newMemoryPacer(func(l int64) int64 {
		old := limit
		if l >= 0 {
			limit = l
		}
		return old
	})
	a := p.start()
	a.grow(1 << 30)
	if limit == math.MaxInt64 {
		t.Fatalf("large tree: no limit set")
	}
	a.done()
	if limit != math.MaxInt64 {
		t.Errorf("all done: limit %d, want none (%d)", limit, int64(math.MaxInt64))
	}
}

// TestMemoryReturn checks that memory goes back once the last of
// overlapping builds ends, after each of builds one after another, and
// not when a build starts within the idle time.
func TestMemoryReturn(t *testing.T) {
	released := make(chan struct{}, 4)
	r := &memoryReturn{release: func() { released <- struct{}{} }}
	pending := func(step string, want int) {
		t.Helper()
		if want > 0 {
			select {
			case <-released:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: no release", step)
			}
		}
		select {
		case <-released:
			t.Errorf("%s: one release more than %d", step, want)
		default:
		}
	}
	r.begin()
	r.begin()
	r.end()
	pending("one of two builds ended", 0)
	r.end()
	pending("both ended", 1)
	r.begin()
	r.end()
	pending("a third build ended", 1)
	r.idle = 300 * time.Millisecond
	r.begin()
	r.end()
	r.begin() // within the idle time
	time.Sleep(2 * r.idle)
	pending("a build started within the idle time", 0)
	r.end()
	pending("idle after the last build", 1)
}

// TestNilMemoryPacer checks that a Builder without a pacer (Options.Pacer
// nil) paces nothing and does not fail.
func TestNilMemoryPacer(t *testing.T) {
	var p *MemoryPacer
	b := p.start()
	if b != nil {
		t.Fatalf("nil pacer start() = %v, want nil", b)
	}
	b.grow(1 << 40)
	b.done()
}
