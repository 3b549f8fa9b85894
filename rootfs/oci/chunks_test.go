package oci

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/blobcache"
)

// FuzzChunkPlan runs claims, give-backs and lookups on a plan and checks
// it against a map of the blob's bytes: claims are free bytes and only
// those, nothing is lost or counted twice, free ranges stay sorted and
// apart, and chunk sizes keep their bounds.
func FuzzChunkPlan(f *testing.F) {
	f.Add(uint16(1000), []byte{0, 10, 1, 50, 2, 0, 3, 200, 1, 7})
	f.Add(uint16(64), []byte{1, 0, 1, 1, 1, 2, 2, 0, 2, 1, 0, 64})
	f.Add(uint16(5000), []byte{4, 100, 0, 255, 0, 255, 2, 0, 1, 30, 3, 0})
	f.Fuzz(func(t *testing.T, size16 uint16, ops []byte) {
		size := int64(size16%4096) + 1
		const (
			free = iota
			claimed
			held
		)
		state := make([]int, size)
		// Some bytes held already, as after a run that failed.
		var plan chunkPlan
		var start []blobcache.Range
		for pos := int64(0); pos < size; {
			n := min(int64(len(ops)%7+1)*size/8+1, size-pos)
			if (pos/n)%3 == 1 {
				for i := pos; i < pos+n; i++ {
					state[i] = held
				}
			} else if k := len(start) - 1; k >= 0 && start[k].End == pos {
				start[k].End = pos + n
			} else {
				start = append(start, blobcache.Range{Off: pos, End: pos + n})
			}
			pos += n
		}
		plan.free = start
		var claims []blobcache.Range
		c := chunking{minBlob: 1, first: 17, minChunk: 5, maxChunk: 40, chunkTime: time.Second, roundTrips: 8, tail: 3}
		for len(ops) >= 2 {
			op, arg := ops[0]%4, int64(ops[1])
			ops = ops[2:]
			switch op {
			case 0, 1:
				left := plan.left()
				n := c.size(left, int(arg%5), float64(arg), time.Duration(arg)*time.Millisecond)
				if left > 0 && (n < 1 || n > left || n > c.maxChunk || n < min(left, c.tail)) {
					t.Fatalf("size(%d, %d, %d) = %d out of bounds", left, arg%5, arg, n)
				}
				var r blobcache.Range
				var ok bool
				if op == 0 {
					r, ok = plan.claimFirst(n)
				} else {
					r, ok = plan.claimAt(arg*size/256, n)
				}
				if !ok {
					continue
				}
				if r.Len() <= 0 || r.Len() > n {
					t.Fatalf("claimed %v, asked for %d", r, n)
				}
				for i := r.Off; i < r.End; i++ {
					if state[i] != free {
						t.Fatalf("claimed %v: byte %d is not free", r, i)
					}
					state[i] = claimed
				}
				claims = append(claims, r)
			case 2:
				if len(claims) == 0 {
					continue
				}
				k := int(arg) % len(claims)
				r := claims[k]
				claims = append(claims[:k], claims[k+1:]...)
				// Part written, the rest given back.
				mid := r.Off + (r.Len()*(arg%3))/2
				for i := r.Off; i < mid; i++ {
					state[i] = held
				}
				for i := mid; i < r.End; i++ {
					state[i] = free
				}
				plan.giveBack(blobcache.Range{Off: mid, End: r.End})
			case 3:
				pos := arg * size / 256
				got, ok := plan.nextFree(pos)
				want := int64(-1)
				for i := pos; i < size; i++ {
					if state[i] == free {
						want = i
						break
					}
				}
				if ok != (want >= 0) || ok && got != want {
					t.Fatalf("nextFree(%d) = %d, %v; want %d", pos, got, ok, want)
				}
			}
			var freeBytes int64
			for i, r := range plan.free {
				if r.Len() <= 0 || i > 0 && plan.free[i-1].End >= r.Off {
					t.Fatalf("free ranges %v not sorted, apart and non-empty", plan.free)
				}
				for j := r.Off; j < r.End; j++ {
					if state[j] != free {
						t.Fatalf("free range %v holds byte %d in state %d", r, j, state[j])
					}
				}
				freeBytes += r.Len()
			}
			for _, st := range state {
				if st == free {
					freeBytes--
				}
			}
			if freeBytes != 0 {
				t.Fatalf("free ranges %v miss or add %d bytes", plan.free, freeBytes)
			}
		}
	})
}

// TestChunkSizes checks the sizes of real settings: the first chunk
// before a rate is known, one from a measured rate (150 ms of transfer,
// longer when requests take long to answer), the end of a blob shared
// among its streams.
func TestChunkSizes(t *testing.T) {
	c := defaultChunking
	for _, tc := range []struct {
		free    int64
		streams int
		rate    float64
		ttfb    time.Duration
		want    int64
	}{
		{100 << 20, 1, 0, 0, 4 << 20},
		{100 << 20, 4, 25e6, time.Millisecond, 3_750_000},
		{100 << 20, 4, 25e6, 50 * time.Millisecond, 10_000_000},
		{100 << 20, 4, 1e6, time.Millisecond, 1 << 20},
		{1 << 30, 4, 1e9, time.Millisecond, 32 << 20},
		{10 << 20, 4, 25e6, time.Millisecond, 10 << 18},
		{2 << 20, 4, 25e6, time.Millisecond, 1 << 20},
		{100, 4, 25e6, time.Millisecond, 100},
	} {
		if got := c.size(tc.free, tc.streams, tc.rate, tc.ttfb); got != tc.want {
			t.Errorf("size(%d, %d, %g, %v) = %d, want %d", tc.free, tc.streams, tc.rate, tc.ttfb, got, tc.want)
		}
	}
	if c.helps(4<<20, 4<<20) || !c.helps(64<<20, 16<<20) || c.helps(64<<20, 1<<20) {
		t.Error("helps: small blobs or tails get extra streams, or large ones none")
	}
}

// simLink models n streams on a link: each brings at most perStream
// bytes per second, all together at most link; a stream added starts
// bringing bytes ttfb after it is granted; work streams at most have
// something to fetch.
type simLink struct {
	perStream, link float64
	ttfb            time.Duration
	work            int
	// from then on, the link carries perStream and link of later.
	then  time.Duration
	later *simLink
}

// run feeds the probe 10 ms samples for d and returns the targets it
// set and when, from the start.
func (m simLink) run(r *rateProbe, d time.Duration) ([]int, []time.Duration) {
	start := time.Unix(1000, 0)
	var bytes float64
	var granted []time.Time // when each granted stream was granted
	targets, at := []int{r.target}, []time.Duration{0}
	for now := start; now.Sub(start) < d; now = now.Add(probeTick) {
		for len(granted) < min(r.target, m.work) {
			granted = append(granted, now)
		}
		// A step taken back ends the streams beyond the target.
		granted = granted[:min(len(granted), r.target)]
		flowing := 0
		for _, g := range granted {
			if now.Sub(g) >= m.ttfb {
				flowing++
			}
		}
		perStream, link := m.perStream, m.link
		if m.later != nil && now.Sub(start) >= m.then {
			perStream, link = m.later.perStream, m.later.link
		}
		bytes += min(float64(flowing)*perStream, link) * probeTick.Seconds()
		target := r.observe(probeSample{now: now, bytes: int64(bytes), flowing: flowing, granted: len(granted),
			demand: m.work > len(granted), ttfb: m.ttfb})
		if target != targets[len(targets)-1] {
			targets, at = append(targets, target), append(at, now.Sub(start))
		}
	}
	return targets, at
}

// TestRateProbe: streams capped per connection double up to the limit;
// on a link one stream fills, the first doubling is taken back; with no
// stream waiting the target stays; on a link three streams fill, the
// doubling to eight is taken back. (Within 900 ms, before a step taken
// back is tried again; 2 s where a new stream's first byte takes 200 ms.)
func TestRateProbe(t *testing.T) {
	for _, tc := range []struct {
		name  string
		link  simLink
		limit int
		want  []int
		// within is how long the rule runs: 900 ms unless set.
		within time.Duration
	}{
		{"PerConnectionCap", simLink{perStream: 25e6, link: 1e12, ttfb: 20 * time.Millisecond, work: 100}, 8, []int{1, 2, 4, 8}, 0},
		{"LinkFull", simLink{perStream: 125e6, link: 125e6, ttfb: 20 * time.Millisecond, work: 100}, 8, []int{1, 2, 1}, 0},
		{"ThreeFill", simLink{perStream: 25e6, link: 75e6, ttfb: 20 * time.Millisecond, work: 100}, 8, []int{1, 2, 4, 8, 4}, 0},
		{"NoDemand", simLink{perStream: 25e6, link: 1e12, ttfb: 20 * time.Millisecond, work: 1}, 8, []int{1}, 0},
		{"SlowStart", simLink{perStream: 25e6, link: 1e12, ttfb: 200 * time.Millisecond, work: 100}, 4, []int{1, 2, 4}, 2 * time.Second},
		{"One", simLink{perStream: 25e6, link: 1e12, ttfb: 20 * time.Millisecond, work: 100}, 1, []int{1}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRateProbe(tc.limit, 1, time.Unix(1000, 0))
			got, _ := tc.link.run(r, cmp.Or(tc.within, 900*time.Millisecond))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("targets %v, want %v", got, tc.want)
			}
			settled := tc.want[len(tc.want)-1] == tc.limit || tc.name == "NoDemand"
			if r.done() != (tc.want[len(tc.want)-1] == tc.limit) {
				t.Errorf("probe done: %v at target %d of %d", r.done(), r.target, tc.limit)
			}
			if !settled && r.phase != probeHold {
				t.Errorf("a step taken back: phase %d, want it held (probeHold)", r.phase)
			}
		})
	}
}

// TestRateProbeTriesAgain: a step taken back is tried again once
// probeRetry passed, and no sooner: on a link one stream fills the target
// goes back to one after each try; when the link later caps each
// connection (the layers that shared it ended), the next try finds the
// gain and the streams double up to the limit.
func TestRateProbeTriesAgain(t *testing.T) {
	full := simLink{perStream: 125e6, link: 125e6, ttfb: 20 * time.Millisecond, work: 100}
	targets, at := full.run(newRateProbe(8, 1, time.Unix(1000, 0)), 5*time.Second)
	var tries []time.Duration
	for i, n := range targets {
		if n > 2 {
			t.Fatalf("targets %v: above 2 on a link one stream fills", targets)
		}
		if n == 2 {
			tries = append(tries, at[i])
		}
	}
	if len(tries) < 3 {
		t.Fatalf("targets %v at %v: want a try about every %v", targets, at, probeRetry)
	}
	for i := 1; i < len(tries); i++ {
		if gap := tries[i] - tries[i-1]; gap < probeRetry {
			t.Errorf("tries at %v: %v apart, want at least %v", tries, gap, probeRetry)
		}
	}
	capped := full
	capped.then, capped.later = 1500*time.Millisecond, &simLink{perStream: 25e6, link: 1e12}
	r := newRateProbe(8, 1, time.Unix(1000, 0))
	targets, _ = capped.run(r, 5*time.Second)
	if targets[len(targets)-1] != 8 || !r.done() {
		t.Errorf("targets %v once the link capped each connection, want 8 in the end", targets)
	}
}

// TestRateProbeQuick bounds the time the doubling takes on a capped link
// with 20 ms to a new stream's first byte: the eight streams run within
// half a second.
func TestRateProbeQuick(t *testing.T) {
	m := simLink{perStream: 25e6, link: 1e12, ttfb: 20 * time.Millisecond, work: 100}
	targets, at := m.run(newRateProbe(8, 1, time.Unix(1000, 0)), 2*time.Second)
	t.Logf("targets %v at %v", targets, at)
	if last := len(targets) - 1; targets[last] != 8 || at[last] > 500*time.Millisecond {
		t.Errorf("targets %v at %v, want 8 within 500ms", targets, at)
	}
}
