package rootfs

import (
	"runtime/debug"
	"sync"
	"time"
)

// Pacing of the Go collector for builds of large trees.
const (
	// paceFloor is the tree estimate (flatten's, garbage collector's
	// slack included) the builds in flight must hold together before the
	// pacer sets a memory limit: below it the default pacing costs little.
	paceFloor = 64 << 20
	// paceBase is what the limit leaves for everything but the trees:
	// the agent itself, plus paceBuild per build in flight (read-ahead
	// chunks, the writer's buffers).
	paceBase  = 32 << 20
	paceBuild = 32 << 20
	// paceShare is the share of the trees' estimate the limit allows.
	// The estimate counts the collector's default slack (the heap grows
	// to about twice what the last collection found live); a million-file
	// build peaked at 310-360 bytes of live heap an entry against an
	// estimate of about 700. Measured on that build: 0.5 gave 411 B of
	// resident memory an entry for about 5 % more time than no limit,
	// 0.48 gave 398 B for 10-15 %, 0.45 377 B for 30 %. Since then the
	// 112-byte ext4.Node took about 45 B an entry off the live heap and 48
	// off the estimate (now about 656).
	paceShare = 0.48
)

// MemoryPacer paces the Go collector to the trees of the builds in
// flight; a Builder uses the one in its Options. With the default GOGC the heap grows to about twice what was live
// at the last collection before the next one runs, so a large tree cost
// twice its size in resident memory. While the builds' tree estimates
// together pass paceFloor, the pacer sets the runtime's soft memory limit
// (debug.SetMemoryLimit: process-wide, hence one pacer per Builder and
// builds adding up in it) to paceBase, plus paceBuild a build, plus
// paceShare of their estimates; never above the limit in force when the
// Builder was made (GOMEMLIMIT, or none), which it restores once no build
// needs a lower one. A limit under the live heap costs collector CPU, which
// the runtime caps at about half, never a failed allocation.
type MemoryPacer struct {
	mu      sync.Mutex
	ceiling int64
	set     func(int64) int64 // debug.SetMemoryLimit
	builds  map[*pacedBuild]int64
	current int64 // the limit last set
}

// pacedBuild is one build's share of a MemoryPacer.
type pacedBuild struct{ p *MemoryPacer }

func newMemoryPacer(set func(int64) int64) *MemoryPacer {
	c := set(-1)
	return &MemoryPacer{ceiling: c, set: set, builds: make(map[*pacedBuild]int64), current: c}
}

// NewMemoryPacer returns a pacer of the Go runtime's soft memory limit,
// which is process-wide: make one per process, in main, and give it to
// every Builder.
func NewMemoryPacer() *MemoryPacer { return newMemoryPacer(debug.SetMemoryLimit) }

// start registers a build holding an empty tree; with a nil p, it returns
// a nil build, which paces nothing.
func (p *MemoryPacer) start() *pacedBuild {
	if p == nil {
		return nil
	}
	b := &pacedBuild{p: p}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.builds[b] = 0
	p.apply()
	return b
}

// grow records the build's tree estimate.
func (b *pacedBuild) grow(estimate int64) {
	if b == nil {
		return
	}
	p := b.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.builds[b]; !ok {
		return
	}
	p.builds[b] = estimate
	p.apply()
}

// done removes the build; it is safe to call more than once.
func (b *pacedBuild) done() {
	if b == nil {
		return
	}
	p := b.p
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.builds, b)
	p.apply()
}

// apply sets the limit the builds in flight call for; p.mu is held.
func (p *MemoryPacer) apply() {
	var sum int64
	for _, e := range p.builds {
		sum += e
	}
	limit := p.ceiling
	if sum >= paceFloor {
		want := float64(paceBase) + float64(paceBuild)*float64(len(p.builds)) + paceShare*float64(sum)
		if want < float64(limit) {
			limit = int64(want)
		}
	}
	if limit != p.current {
		p.set(limit)
		p.current = limit
	}
}

// memoryReturn gives the heap's free pages back to the operating system
// once no build has run for a while. The runtime keeps what a build's
// garbage freed until its background scavenger returns it over the next
// minutes, so the next build (a rebuild submitted at once, or a job that
// waited) started with the last one's high-water mark resident and grew
// from there; an idle agent should not hold what its largest build used.
// But memory given back is touched again by the next build, and on a VM
// that reports free pages to its hypervisor that costs: released at the
// end of every build, it added 80 ms to the next one's ext4 metadata
// (docs/performance.md). So the release waits for idle to pass with no
// build in flight.
type memoryReturn struct {
	mu      sync.Mutex
	builds  int
	idle    time.Duration
	pending *time.Timer
	release func() // debug.FreeOSMemory, run on a goroutine of its own
}

// memoryReturnIdle is how long the agent goes without a build before it
// gives the memory builds used back.
const memoryReturnIdle = 10 * time.Second

// begin counts a build in flight, calling off a release not yet started.
func (r *memoryReturn) begin() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.builds++
	if r.pending != nil {
		r.pending.Stop()
		r.pending = nil
	}
}

// end uncounts a build and, if it was the last, schedules the release
// after the idle time (a full collection: milliseconds of CPU for the
// heap of a build, off any build's path).
func (r *memoryReturn) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.builds--
	if r.builds == 0 {
		r.pending = time.AfterFunc(r.idle, r.release)
	}
}
