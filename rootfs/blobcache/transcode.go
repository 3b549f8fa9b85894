package blobcache

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fsutil"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
)

// maxExpansion bounds how much larger than the blob its uncompressed stream
// may be for the transcoder to take it on (beyond minTranscodeLimit): a
// layer that inflates more, legitimately or as a bomb, stays gzip.
const (
	maxExpansion      = 64
	minTranscodeLimit = 1 << 30
)

// transcodeSettle is how long the transcoder stays idle after a build
// released its blobs. The moments after a build belong to what follows
// it: the BUILT report, and a reuse or a rebuild CubeMaster submits as
// that report arrives. A reuse uses no blob, so it cannot hold the
// transcoder off as a build does; measured on a loaded 2-core machine, a
// reuse submitted at BUILT took 85 ms median and up to 210 ms with the
// re-encode starting at once (its reads, 17 MiB encoder, writes and their
// writeback), against 54 and 81 ms without it.
const transcodeSettle = time.Second

// errNotGzip marks a blob the transcoder leaves as it is.
var errNotGzip = errors.New("not gzip")

// errPreempted ends a transcode that a build interrupted; the blob is
// transcoded again from its start once builds leave the cache.
var errPreempted = errors.New("preempted by a build")

// transcoder re-encodes the cache's gzip blobs as zstd, one at a time, in the
// background after the build that fetched them: warm builds are bound by
// decompression, and zstd inflates two to three times faster than gzip.
// The uncompressed stream is unchanged, so images built from either form are
// identical. It runs on a thread of its own at the lowest CPU and I/O
// priority, and waits while any build uses the cache (a blob pinned or
// being acquired), and for transcodeSettle after a build released its
// blobs, before it starts a blob; a build that starts during a
// blob ends that blob's transcode (it starts over later), so the build
// shares neither a core nor the encoder's memory (17 MiB, which a paused
// encode kept through the build) with it. On a machine whose cores a
// build keeps busy even the lowest priority takes a share, and a rebuild
// submitted right after a first build must not pay for the first build's
// background work.
type transcoder struct {
	c      *Cache
	logger *slog.Logger
	gz     *layercodec.GzipInflater
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}
	// builds returns nil when no build uses the cache, else a channel
	// closed when none does (Cache.usersDone; tests replace it).
	builds func() <-chan struct{}
	// settle is transcodeSettle; now and after are the clock (tests
	// replace them).
	settle time.Duration
	now    func() time.Time
	after  func(time.Duration) <-chan time.Time

	mu         sync.Mutex
	released   time.Time // when a build last released blobs
	queue      []string
	queued     map[string]bool
	busy       bool
	paused     bool          // waiting for builds to release the cache
	idle       chan struct{} // closed when queue and busy both clear; nil while idle
	transcoded int64
	failed     int64
}

func newTranscoder(c *Cache, logger *slog.Logger, gz *layercodec.GzipInflater) *transcoder {
	ctx, cancel := context.WithCancel(context.Background())
	t := &transcoder{c: c, logger: logger, gz: gz, ctx: ctx, cancel: cancel, builds: c.usersDone,
		settle: transcodeSettle, now: time.Now, after: time.After,
		done: make(chan struct{}), wake: make(chan struct{}, 1), queued: make(map[string]bool)}
	go t.run()
	return t
}

// stop cancels the transcode in progress (its temp file is removed) and waits
// for the worker to exit. Blobs still queued stay gzip until their next use.
func (t *transcoder) stop() {
	t.cancel()
	<-t.done
}

// enqueue queues blobs for transcoding, each once, when a build releases
// them (none when all have a zstd form: the build's end still counts).
func (t *transcoder) enqueue(hexDigests []string) {
	t.mu.Lock()
	t.released = t.now()
	if len(hexDigests) == 0 {
		t.mu.Unlock()
		return
	}
	for _, h := range hexDigests {
		if !t.queued[h] {
			t.queued[h] = true
			t.queue = append(t.queue, h)
		}
	}
	if t.idle == nil && len(t.queue) > 0 {
		t.idle = make(chan struct{})
	}
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// waitIdle returns when nothing is queued or running, or when ctx ends.
func (t *transcoder) waitIdle(ctx context.Context) error {
	t.mu.Lock()
	idle := t.idle
	t.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for transcoding: %w", ctx.Err())
	case <-t.done:
		return nil
	}
}

// counts returns the queued-or-running, transcoded and failed counts, and
// whether the transcoder waits for builds.
func (t *transcoder) counts() (pending int, transcoded, failed int64, paused bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pending = len(t.queue)
	if t.busy {
		pending++
	}
	return pending, t.transcoded, t.failed, t.paused
}

// yield waits until no build uses the cache and none released blobs
// within t.settle, or ctx ends.
func (t *transcoder) yield() error {
	for {
		t.mu.Lock()
		wait := t.settle - t.now().Sub(t.released)
		t.mu.Unlock()
		if wait > 0 {
			t.setPaused(true)
			select {
			case <-t.after(wait):
				t.setPaused(false)
				continue
			case <-t.ctx.Done():
				t.setPaused(false)
				return t.ctx.Err()
			}
		}
		ch := t.builds()
		if ch == nil {
			return nil
		}
		t.setPaused(true)
		select {
		case <-ch:
			t.setPaused(false)
		case <-t.ctx.Done():
			t.setPaused(false)
			return t.ctx.Err()
		}
	}
}

// requeue puts h back at the head of the queue, for a transcode that
// starts over.
func (t *transcoder) requeue(h string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.queued[h] {
		t.queued[h] = true
		t.queue = append([]string{h}, t.queue...)
	}
}

func (t *transcoder) setPaused(p bool) {
	t.mu.Lock()
	t.paused = p
	t.mu.Unlock()
}

func (t *transcoder) run() {
	defer close(t.done)
	for {
		t.mu.Lock()
		if len(t.queue) == 0 {
			t.busy = false
			if t.idle != nil {
				close(t.idle)
				t.idle = nil
			}
			t.mu.Unlock()
			select {
			case <-t.wake:
				continue
			case <-t.ctx.Done():
				return
			}
		}
		h := t.queue[0]
		t.queue = t.queue[1:]
		delete(t.queued, h)
		t.busy = true
		t.mu.Unlock()
		if t.ctx.Err() != nil {
			return
		}
		var ok, failed bool
		onBackgroundThread(func() { ok, failed = t.transcode(h) })
		t.mu.Lock()
		if ok {
			t.transcoded++
		}
		if failed {
			t.failed++
		}
		t.mu.Unlock()
	}
}

// transcode replaces blob h's served form by a zstd form if it is a verified
// gzip blob without one. ok reports a new zstd form, failed an error other
// than a cancellation or a blob left as it is by design.
func (t *transcoder) transcode(h string) (ok, failed bool) {
	if t.yield() != nil {
		return false, false
	}
	c := t.c
	c.mu.Lock()
	e := c.entries[h]
	if e == nil || !e.verified || e.reverify || !e.served || e.zhex != "" || e.keep {
		c.mu.Unlock()
		return false, false
	}
	e.pins++ // neither evicted nor dropped while read
	size := e.size
	c.mu.Unlock()

	tmp, zhex, zsize, err := t.encode(h, size)
	if errors.Is(err, errPreempted) {
		t.requeue(h)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	e.pins--
	if err == nil {
		if err = os.Rename(tmp, c.zpath(h, zhex)); err != nil {
			os.Remove(tmp)
			err = fmt.Errorf("commit zstd blob: %w", err)
		}
	}
	switch {
	case err == nil:
	case t.ctx.Err() != nil, errors.Is(err, errPreempted):
		return false, false
	case errors.Is(err, errNotGzip):
		e.keep = true
		return false, false
	case errors.Is(err, ErrDigestMismatch):
		// The served file changed since it was verified: have the next
		// acquire verify it again (and download it if it is corrupt).
		e.reverify = true
		c.settleLocked(h, e)
		t.logger.Warn("layer cache: blob changed on disk", "digest", "sha256:"+h, "err", err)
		return false, true
	default:
		e.keep = true
		t.logger.Warn("layer cache: could not transcode blob to zstd; it stays gzip", "digest", "sha256:"+h, "err", err)
		return false, true
	}
	e.zhex, e.zsize = zhex, zsize
	c.total += zsize
	e.staleServed = true
	c.settleLocked(h, e)
	_ = os.Chtimes(c.zpath(h, zhex), e.lastUse, e.lastUse)
	c.evictLocked()
	t.logger.Debug("layer cache: blob transcoded to zstd", "digest", "sha256:"+h, "gzip_bytes", size, "zstd_bytes", zsize)
	return true, false
}

// encode writes the zstd form of served blob h (size bytes) to a temp file in
// the zstd directory, checking that the blob still has its digest, and
// returns the temp file's name, digest and size.
// A build that starts meanwhile ends it with errPreempted, whatever error
// the interrupted read then causes.
func (t *transcoder) encode(h string, size int64) (tmp, zhex string, zsize int64, err error) {
	c := t.c
	src, err := os.Open(c.path(h))
	if err != nil {
		return "", "", 0, fmt.Errorf("open blob: %w", err)
	}
	defer src.Close()
	var preempted bool
	defer func() {
		if preempted && err != nil {
			tmp, zhex, zsize, err = "", "", 0, errPreempted
		}
	}()
	inHash := sha256.New()
	counted := &countingReader{r: io.TeeReader(preemptedReader{fsutil.ContextReader(t.ctx, src), t, &preempted}, inHash)}
	in := bufio.NewReaderSize(counted, copyBufSize)
	if magic, _ := in.Peek(2); layercodec.Detect(magic) != layercodec.Gzip {
		return "", "", 0, errNotGzip
	}
	zr, err := layercodec.NewGzipReader(in, t.gz)
	if err != nil {
		return "", "", 0, err
	}
	defer zr.Close()

	out, err := os.CreateTemp(c.zdir, tmpPrefix+h+"-*")
	if err != nil {
		return "", "", 0, fmt.Errorf("create temp blob: %w", err)
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	outHash := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(out, outHash), copyBufSize)
	zw, err := zstd.NewWriter(bw, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return "", "", 0, fmt.Errorf("zstd: %w", err)
	}
	defer zw.Close()
	limit := max(maxExpansion*size, minTranscodeLimit)
	bp := c.bufs.Get().(*[]byte)
	defer c.bufs.Put(bp)
	// checkDigest reads the rest of the blob (what follows the gzip stream
	// is part of the digest too) and compares it with its name: a blob that
	// fails to inflate may just have rotted since it was verified.
	checkDigest := func() error {
		if _, err := io.Copy(io.Discard, in); err != nil {
			return fmt.Errorf("read blob: %w", err)
		}
		if got := hex.EncodeToString(inHash.Sum(nil)); counted.n != size || got != h {
			return fmt.Errorf("%w: sha256:%s now reads as sha256:%s (%d bytes)", ErrDigestMismatch, h, got, counted.n)
		}
		return nil
	}
	n, err := io.CopyBuffer(zw, io.LimitReader(zr, limit+1), *bp)
	if err != nil {
		if t.ctx.Err() != nil {
			return "", "", 0, t.ctx.Err()
		}
		if derr := checkDigest(); derr != nil {
			return "", "", 0, derr
		}
		return "", "", 0, fmt.Errorf("recompress: %w", err)
	}
	if n > limit {
		return "", "", 0, fmt.Errorf("%w: inflates beyond %d bytes", errNotGzip, limit)
	}
	if err := zw.Close(); err != nil {
		return "", "", 0, fmt.Errorf("zstd: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return "", "", 0, fmt.Errorf("write zstd blob: %w", err)
	}
	if err := checkDigest(); err != nil {
		return "", "", 0, err
	}
	// No fsync, as for downloaded blobs: a zstd form is verified against its
	// name before its first use after a start.
	fi, err := out.Stat()
	if err != nil {
		return "", "", 0, fmt.Errorf("stat zstd blob: %w", err)
	}
	if err := out.Close(); err != nil {
		return "", "", 0, fmt.Errorf("close zstd blob: %w", err)
	}
	return out.Name(), hex.EncodeToString(outHash.Sum(nil)), fi.Size(), nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// preemptedReader fails with errPreempted, and sets *stopped, once a build
// uses the cache, so a transcode in progress ends within one read
// (copyBufSize) of a build starting.
type preemptedReader struct {
	r       io.Reader
	t       *transcoder
	stopped *bool
}

func (y preemptedReader) Read(p []byte) (int, error) {
	if *y.stopped || y.t.builds() != nil {
		*y.stopped = true
		return 0, errPreempted
	}
	return y.r.Read(p)
}
