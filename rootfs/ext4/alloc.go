package ext4

import (
	"fmt"
	"math/bits"
)

const (
	blocksPerGroup = 32768
	// chunkBlocks is the granularity of the allocator's free-count summary.
	chunkBlocks = 4096
	chunkWords  = chunkBlocks / 64
	groupWords  = blocksPerGroup / 64
)

// hasSuper reports whether group g carries a superblock backup under
// sparse_super: groups 0 and 1 and powers of 3, 5 and 7.
func hasSuper(g uint64) bool {
	if g <= 1 {
		return true
	}
	for _, p := range []uint64{3, 5, 7} {
		n := p
		for n < g {
			n *= p
		}
		if n == g {
			return true
		}
	}
	return false
}

// run is a contiguous range of physical blocks.
type run struct {
	start, count uint64
}

// allocator is a first-fit block allocator over a bitmap that grows one
// block group at a time. The head of every group that may carry a backup
// superblock (superblock plus a group descriptor table sized for MaxSize)
// is pre-marked as used so nothing is ever placed there.
type allocator struct {
	words   []uint64
	free    []uint32 // free blocks per chunk
	size    uint64   // blocks covered by words
	limit   uint64   // no block at or beyond limit is ever handed out
	reserve uint64   // blocks at the head of backup groups
	hint    uint64   // no free block below hint
	top     uint64   // 1 + highest block allocated or marked
}

func newAllocator(limit, reserve uint64) *allocator {
	return &allocator{limit: limit, reserve: reserve}
}

func (a *allocator) clone() *allocator {
	c := *a
	c.words = append([]uint64(nil), a.words...)
	c.free = append([]uint32(nil), a.free...)
	return &c
}

// grow adds one block group to the bitmap.
func (a *allocator) grow() {
	g := a.size / blocksPerGroup
	a.words = append(a.words, make([]uint64, groupWords)...)
	for i := 0; i < blocksPerGroup/chunkBlocks; i++ {
		a.free = append(a.free, chunkBlocks)
	}
	start := a.size
	a.size += blocksPerGroup
	if hasSuper(g) {
		a.setBits(start, start+a.reserve)
	}
	if a.size > a.limit {
		a.setBits(max(a.limit, start), a.size)
	}
}

func (a *allocator) ensure(end uint64) {
	for a.size < end && a.size < a.limit {
		a.grow()
	}
}

// setBits marks [s, e) used and returns how many were free before.
func (a *allocator) setBits(s, e uint64) uint64 {
	var n uint64
	eachWord(s, e, func(w, mask uint64) {
		c := uint64(bits.OnesCount64(mask &^ a.words[w]))
		a.words[w] |= mask
		a.free[w/chunkWords] -= uint32(c)
		n += c
	})
	return n
}

// clearBits marks [s, e) free.
func (a *allocator) clearBits(s, e uint64) {
	eachWord(s, e, func(w, mask uint64) {
		c := bits.OnesCount64(mask & a.words[w])
		a.words[w] &^= mask
		a.free[w/chunkWords] += uint32(c)
	})
}

// eachWord calls fn with the index of every bitmap word the bit range
// [s, e) touches and the mask of the range's bits in it.
func eachWord(s, e uint64, fn func(w, mask uint64)) {
	for s < e {
		w := s / 64
		hi := uint64(64)
		if e-w*64 < 64 {
			hi = e - w*64
		}
		fn(w, maskRange(s%64, hi))
		s = w*64 + hi
	}
}

func maskRange(lo, hi uint64) uint64 {
	if hi-lo == 64 {
		return ^uint64(0)
	}
	return ((uint64(1) << (hi - lo)) - 1) << lo
}

// findFree returns the first free block at or after pos.
func (a *allocator) findFree(pos uint64) (uint64, bool) {
	for {
		if pos >= a.size {
			if a.size >= a.limit {
				return 0, false
			}
			a.grow()
			continue
		}
		c := pos / chunkBlocks
		if a.free[c] == 0 {
			pos = (c + 1) * chunkBlocks
			continue
		}
		cend := (c + 1) * chunkWords
		for w := pos / 64; w < cend; w++ {
			x := ^a.words[w]
			if w == pos/64 {
				x &= ^uint64(0) << (pos % 64)
			}
			if x != 0 {
				b := w*64 + uint64(bits.TrailingZeros64(x))
				if b >= a.limit {
					return 0, false
				}
				return b, true
			}
		}
		pos = (c + 1) * chunkBlocks
	}
}

// findUsed returns the first used block in [s, e), or e (capped to the
// limit) when the whole range is free.
func (a *allocator) findUsed(s, e uint64) uint64 {
	a.ensure(e)
	if e > a.size {
		e = a.size
	}
	for s < e {
		w := s / 64
		x := a.words[w] & (^uint64(0) << (s % 64))
		if x != 0 {
			b := w*64 + uint64(bits.TrailingZeros64(x))
			return min(b, e)
		}
		s = (w + 1) * 64
	}
	return e
}

func (a *allocator) take(s, e uint64) {
	a.setBits(s, e)
	if e > a.top {
		a.top = e
	}
}

// alloc hands out n blocks first-fit, as few or as many runs as the free
// space dictates, lowest addresses first.
func (a *allocator) alloc(n uint64) ([]run, error) {
	var runs []run
	pos := a.hint
	first := true
	for n > 0 {
		s, ok := a.findFree(pos)
		if !ok {
			for _, r := range runs {
				a.clearBits(r.start, r.start+r.count)
			}
			return nil, fmt.Errorf("allocate %d blocks: %w", n, ErrTooLarge)
		}
		e := a.findUsed(s, s+n)
		a.take(s, e)
		if first {
			a.hint = e
			first = false
		}
		runs = append(runs, run{s, e - s})
		n -= e - s
		pos = e
	}
	return runs, nil
}

// allocContig hands out n contiguous blocks, first fit.
func (a *allocator) allocContig(n uint64) (uint64, error) {
	pos := a.hint
	first := true
	for {
		s, ok := a.findFree(pos)
		if !ok {
			return 0, fmt.Errorf("allocate %d contiguous blocks: %w", n, ErrTooLarge)
		}
		if first {
			a.hint = s
			first = false
		}
		e := a.findUsed(s, s+n)
		if e-s == n {
			a.take(s, e)
			if a.hint == s {
				a.hint = e
			}
			return s, nil
		}
		// Too short: e is used or the limit; search on from there.
		pos = e
	}
}

// release frees blocks previously allocated.
func (a *allocator) release(s, n uint64) {
	if s >= a.size {
		return
	}
	e := min(s+n, a.size)
	a.clearBits(s, e)
	if s < a.hint {
		a.hint = s
	}
}

// mark claims [s, s+n) and fails if any of it is already in use.
func (a *allocator) mark(s, n uint64) error {
	if s+n > a.limit {
		return fmt.Errorf("claim blocks %d-%d: %w", s, s+n-1, ErrTooLarge)
	}
	a.ensure(s + n)
	if used := a.findUsed(s, s+n); used != s+n {
		return fmt.Errorf("block %d is claimed twice", used)
	}
	a.take(s, s+n)
	return nil
}
