package oci

import (
	"sort"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/blobcache"
)

// chunking sizes the ranged requests a blob is fetched in
// (docs/performance.md, "Parallel ranged chunks").
type chunking struct {
	// minBlob: smaller blobs are fetched by one stream.
	minBlob int64
	// first is the chunk size before a stream's rate is known.
	first int64
	// minChunk and maxChunk bound the chunk size a measured rate gives:
	// chunkTime of transfer at one stream's rate, or roundTrips times a
	// request's time to its first byte when that is longer. Chunks are
	// short because a build reads a blob's contiguous prefix: a chunk's
	// bytes become readable only once every chunk before it is in, so
	// the build trails the download by about a chunk's time. The round
	// trips keep each request's wait a small share of its transfer.
	minChunk, maxChunk int64
	chunkTime          time.Duration
	roundTrips         int
	// tail is the smallest chunk the end of a blob is split into, so that
	// its last bytes come over several streams rather than one.
	tail int64
}

// defaultChunking is the chunking of a Puller.
var defaultChunking = chunking{
	minBlob:    8 << 20,
	first:      4 << 20,
	minChunk:   1 << 20,
	maxChunk:   32 << 20,
	chunkTime:  150 * time.Millisecond,
	roundTrips: 8,
	tail:       1 << 20,
}

// size returns the length of the next chunk to claim: free bytes are left
// to claim, streams fetch the blob, rate is one stream's bytes per second
// (0 when not measured yet) and ttfb a request's time to its first byte.
// The end of a blob is shared among its
// streams (each claim at most a streams-th of what is left), so that its
// last bytes do not come over one stream while the others idle. It is at
// least 1 and at most free (free > 0), at most maxChunk, and at least
// min(free, tail).
func (c chunking) size(free int64, streams int, rate float64, ttfb time.Duration) int64 {
	if free <= 0 {
		return 0
	}
	n := c.first
	if rate > 0 {
		d := max(c.chunkTime, time.Duration(c.roundTrips)*ttfb)
		n = min(max(int64(rate*d.Seconds()), c.minChunk), c.maxChunk)
	}
	k := int64(max(streams, 1))
	n = min(n, max((free+k-1)/k, c.tail))
	return max(min(n, free, c.maxChunk), 1)
}

// helps reports whether another stream is worth starting on a blob of
// size bytes with free bytes left to claim.
func (c chunking) helps(size, free int64) bool {
	return size >= c.minBlob && free >= 2*c.tail
}

// chunkPlan is the bytes of one blob no stream has claimed yet, in order;
// streams claim them, and give back what they could not fetch. It is not
// safe for concurrent use (blobRun guards it).
type chunkPlan struct {
	free blobcache.RangeSet
}

// left returns the bytes not claimed.
func (p *chunkPlan) left() int64 { return p.free.Bytes() }

// claimFirst claims up to n bytes from the first free byte on.
func (p *chunkPlan) claimFirst(n int64) (blobcache.Range, bool) {
	if len(p.free) == 0 || n <= 0 {
		return blobcache.Range{}, false
	}
	return p.claimAt(p.free[0].Off, n)
}

// claimAt claims up to n bytes from pos on, if pos is free; the claim
// ends where the free range holding pos ends.
func (p *chunkPlan) claimAt(pos, n int64) (blobcache.Range, bool) {
	i := sort.Search(len(p.free), func(i int) bool { return p.free[i].End > pos })
	if i == len(p.free) || p.free[i].Off > pos || n <= 0 {
		return blobcache.Range{}, false
	}
	c := blobcache.Range{Off: pos, End: min(pos+n, p.free[i].End)}
	p.free.Remove(c)
	return c, true
}

// nextFree returns the first free byte at or after pos.
func (p *chunkPlan) nextFree(pos int64) (int64, bool) { return p.free.Next(pos) }

// giveBack returns claimed bytes not fetched.
func (p *chunkPlan) giveBack(r blobcache.Range) { p.free.Add(r) }
