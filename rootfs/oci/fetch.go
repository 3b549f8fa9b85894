package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/blobcache"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// progressInterval is the minimum time between two progress callbacks.
const progressInterval = 500 * time.Millisecond

// attemptsPerPlace is how often a blob download is tried at one place when it
// fails with a transient error (connection reset, truncated body, 5xx)
// without bringing a byte.
const attemptsPerPlace = 3

// maxResumes bounds the times one blob's download continues after a
// connection that dropped once it had brought bytes: each continues from
// the bytes received, with a Range request.
const maxResumes = 8

// Progress is a snapshot of a Fetch.
type Progress struct {
	// TotalBytes is the image's compressed size (sum of manifest layer sizes).
	TotalBytes int64
	// DownloadedBytes counts bytes written into the cache plus the size of
	// layers found there; it never decreases and equals TotalBytes at the end.
	DownloadedBytes int64
	// TotalLayers is the number of layers in the manifest.
	TotalLayers int
	// CompletedLayers counts layers verified in the cache.
	CompletedLayers int
	// SpeedBPS is the transfer rate in bytes per second: over the last
	// interval in intermediate reports, over the whole Fetch in the final one.
	SpeedBPS int64
}

// Done reports whether p is the final state of a Fetch: every layer in
// the cache.
func (p Progress) Done() bool {
	return p.CompletedLayers == p.TotalLayers && p.DownloadedBytes == p.TotalBytes
}

// blobStore is what fetching needs of the layer cache: pin a blob, filling
// it through a download when it is missing or corrupt (Acquire with
// Create, FillAt and Commit), read a pinned blob, and release the pins.
// *blobcache.Cache implements it.
type blobStore interface {
	// Acquire pins blob hex of size bytes, calling download (which writes it
	// through a Partial) unless a verified copy is present; concurrent
	// Acquires of a blob share one download. source keys where download
	// reads from.
	Acquire(ctx context.Context, hex string, size int64, source string, download func(context.Context) error) (fromCache bool, err error)
	// Create starts blob hex of size bytes; readers can follow it while
	// it is written, and its Commit checks size and digest.
	Create(hex string, size int64) (*blobcache.Partial, error)
	// FillAt writes n bytes of r into p from offset off on.
	FillAt(ctx context.Context, p *blobcache.Partial, r io.Reader, off, n int64, progress func(wrote int)) (int64, error)
	// Open reads pinned blob hex.
	Open(hex string) (io.ReadCloser, error)
	// Release drops one pin on each blob.
	Release(hexes []string)
}

var _ blobStore = (*blobcache.Cache)(nil)

// Layers holds cache pins on the layer blobs of one image, in manifest order.
// Close it when done; pinned blobs are never evicted. Layers returned by
// Start may still be downloading: Open streams a layer its downloads are
// writing, and waits for one not yet started.
type Layers struct {
	store  blobStore
	layers []Layer
	// blobs has the state of each distinct blob's download; done closes
	// when every download ended. Readers of a blob being written wait
	// under readers, which Close ends.
	blobs         map[string]*blobState
	readers       context.Context
	cancelReaders context.CancelFunc
	// starved is set when a reader waits for bytes of a download under
	// way (the gate's flag).
	starved *atomic.Bool
	done    chan struct{}
	cancel  context.CancelFunc

	mu     sync.Mutex
	ok     map[string]bool
	pinned []string
	err    error
	closed bool
}

// Len returns the number of layers.
func (l *Layers) Len() int { return len(l.layers) }

// Open returns the blob of layer i (manifest order, bottom first). A blob
// this Layers is downloading is read as it arrives: the reader waits for
// bytes not yet received, and fails at the end, instead of ending, when the
// download does not complete with the right size and sha256 (the blob then
// never enters the cache). Otherwise Open waits for the blob to be in the
// cache and returns it: as served, its size and sha256 verified when it
// entered the cache or on its first use by this process, or the zstd form
// the cache re-encoded it to (Options.TranscodeZstd), verified the same
// way. Either way the uncompressed stream is the layer's; tell the
// compression by the magic bytes, not Layer.MediaType.
func (l *Layers) Open(i int) (io.ReadCloser, error) {
	if i < 0 || i >= len(l.layers) {
		return nil, fmt.Errorf("open layer: index %d out of range [0,%d)", i, len(l.layers))
	}
	hex := l.layers[i].Digest.Hex
	b := l.blobs[hex]
	select {
	case <-b.ready:
	case <-b.started:
		select {
		case <-b.ready: // ended meanwhile: read the cache's copy
		default:
			rc, err := b.partial.NewReader(l.readers)
			if err != nil {
				return nil, fmt.Errorf("open layer %d: %w", i, err)
			}
			return &followingReader{ReadCloser: rc, p: b.partial, starved: l.starved}, nil
		}
	}
	l.mu.Lock()
	closed, ok := l.closed, l.ok[hex]
	l.mu.Unlock()
	if closed {
		return nil, errors.New("open layer: layers closed")
	}
	if !ok {
		if err := l.Wait(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("open layer %d: not fetched", i)
	}
	f, err := l.store.Open(hex)
	if err != nil {
		return nil, fmt.Errorf("open layer %d: %w", i, err)
	}
	return f, nil
}

// Wait blocks until every download ended and returns the first error.
func (l *Layers) Wait() error {
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Close stops downloads still running and unpins the blobs. Readers of
// blobs in the cache stay valid; readers of a blob still downloading fail.
func (l *Layers) Close() error {
	l.cancel()
	l.cancelReaders()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.store.Release(l.pinned)
	return nil
}

// Fetch brings every layer of img into the cache, at most Options.Jobs at a
// time, and pins them. A blob shared with a concurrent Fetch is downloaded
// once. progress, if not nil, is called from one goroutine at a time, at most
// every 500 ms while bytes move and once more at the end of a successful
// Fetch. On error nothing stays pinned and no temp file is left.
func (p *Puller) Fetch(ctx context.Context, img *Image, progress func(Progress)) (*Layers, error) {
	// Nothing reads while a Fetch downloads: the download is all the work,
	// and streams are added from the start.
	l, err := p.start(ctx, img, progress, true)
	if err != nil {
		return nil, err
	}
	if err := l.Wait(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Start is Fetch without the wait: it returns at once, and Layers.Open
// waits for the layer it opens, so a build can apply the first layers while
// later ones download. Downloads run under ctx until they end or Close.
// Streams beyond the first are added only once the build waited for bytes
// of a download under way: a registry that serves faster than the build
// applies gets one stream, which leaves the build its CPU.
func (p *Puller) Start(ctx context.Context, img *Image, progress func(Progress)) (*Layers, error) {
	return p.start(ctx, img, progress, false)
}

// start is Start; starved adds streams from the start, with no reader to
// wait for.
func (p *Puller) start(ctx context.Context, img *Image, progress func(Progress), starved bool) (*Layers, error) {
	if img == nil || img.src == nil {
		return nil, errors.New("fetch: image was not returned by Resolve")
	}
	jobs := distinctBlobs(img.Layers)
	ctx, cancel := context.WithCancel(ctx)
	readers, cancelReaders := context.WithCancel(context.WithoutCancel(ctx))
	l := &Layers{store: p.cache, layers: img.Layers, blobs: make(map[string]*blobState, len(jobs)),
		readers: readers, cancelReaders: cancelReaders,
		done: make(chan struct{}), cancel: cancel, ok: make(map[string]bool, len(jobs))}
	for _, j := range jobs {
		l.blobs[j.layer.Digest.Hex] = &blobState{ready: make(chan struct{}), started: make(chan struct{})}
	}
	gate := newStreamGate(p.slots, p.perBlob, max(p.firstStreams, 1), len(jobs))
	gate.starved.Store(starved)
	l.starved = &gate.starved
	r := &startRun{p: p, img: img, l: l, gate: gate, tr: newTracker(img), ctx: ctx, cancel: cancel}
	adapted := make(chan struct{})
	go func() {
		defer close(adapted)
		gate.adapt(ctx, r.tr.net.Load)
	}()
	work := make(chan *fetchJob)
	var wg sync.WaitGroup
	for range min(p.jobs, max(len(jobs), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				r.fetch(j)
			}
		}()
	}
	stopTicker := make(chan struct{})
	tickerDone := make(chan struct{})
	go func() {
		defer close(tickerDone)
		tickProgress(r.tr, progress, stopTicker)
	}()
	go func() {
		for _, j := range jobs {
			work <- j
		}
		close(work)
		wg.Wait()
		close(stopTicker)
		<-tickerDone
		failed := r.settle()
		<-adapted
		if !failed && progress != nil {
			progress(r.tr.snapshot(true))
		}
		close(l.done)
	}()
	return l, nil
}

// fetchJob is one distinct blob of a Start; a repeated layer counts once
// per use.
type fetchJob struct {
	layer Layer
	index int // of the layer's first use, for messages
	uses  int
	turn  int // among the distinct blobs, in manifest order
}

// distinctBlobs lists the distinct blobs of layers in manifest order.
func distinctBlobs(layers []Layer) []*fetchJob {
	var jobs []*fetchJob
	byHex := make(map[string]*fetchJob)
	for i, l := range layers {
		if j := byHex[l.Digest.Hex]; j != nil {
			j.uses++
			continue
		}
		j := &fetchJob{layer: l, index: i, uses: 1, turn: len(jobs)}
		byHex[l.Digest.Hex] = j
		jobs = append(jobs, j)
	}
	return jobs
}

// startRun is what the workers of one Start share.
type startRun struct {
	p      *Puller
	img    *Image
	l      *Layers
	gate   *streamGate
	tr     *tracker
	ctx    context.Context
	cancel context.CancelFunc
	// firstErr is the error the Start ends with (guarded by l.mu).
	firstErr error
}

// fetch downloads (or finds in the cache) one blob; its first error, or
// a later one more telling than a cancellation, ends the Start.
func (r *startRun) fetch(j *fetchJob) {
	l, hex := r.l, j.layer.Digest.Hex
	lane := r.gate.lanes[j.turn]
	defer close(l.blobs[hex].ready)
	if r.ctx.Err() != nil {
		r.gate.end(lane)
		return
	}
	lt := r.tr.layer(j.layer.Size, j.uses)
	lctx, endSpan := layerSpan(r.ctx, j.index, j.layer)
	d := &downloader{store: l.store, src: r.img.src, index: j.index, layer: j.layer, tracker: lt,
		blob: l.blobs[hex], gate: r.gate, lane: lane, chunks: r.p.chunks, secrets: r.img.secrets}
	fromCache, err := l.store.Acquire(lctx, hex, j.layer.Size, r.img.src.key(), d.download)
	r.gate.end(lane)
	endSpan(fromCache, err)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if r.firstErr == nil || (isCtxErr(r.firstErr) && !isCtxErr(err)) {
			r.firstErr = err
		}
		r.cancel()
		return
	}
	l.pinned = append(l.pinned, hex)
	l.ok[hex] = true
	lt.complete()
}

// settle records how the Start ended once every blob did, and reports
// whether it failed.
func (r *startRun) settle() bool {
	l := r.l
	l.mu.Lock()
	if r.firstErr == nil && r.ctx.Err() != nil {
		r.firstErr = fmt.Errorf("fetch: %w", r.ctx.Err())
	}
	// Download errors come redacted (downloader.download).
	l.err = r.firstErr
	failed := l.err != nil
	l.mu.Unlock()
	r.cancel()
	return failed
}

// tickProgress reports tr to progress every progressInterval until stop
// closes.
func tickProgress(tr *tracker, progress func(Progress), stop <-chan struct{}) {
	if progress == nil {
		<-stop
		return
	}
	t := time.NewTicker(progressInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			progress(tr.snapshot(false))
		}
	}
}

// blobState is one distinct blob of a Layers: ready closes when its
// download (or cache lookup) ended, ok in Layers telling whether it
// succeeded; started closes when this Layers' own download began writing
// it, as partial.
type blobState struct {
	ready   chan struct{}
	started chan struct{}
	partial *blobcache.Partial
}

// downloader brings one layer blob into the cache.
type downloader struct {
	store   blobStore
	src     blobSource
	index   int // of the layer's first use, for messages
	layer   Layer
	tracker *layerTracker
	blob    *blobState
	// gate grants the streams that read bodies, lane is this blob's
	// place there, chunks sizes its ranged requests.
	gate   *streamGate
	lane   *blobLane
	chunks chunking
	// secrets are the source's credentials: with URL query strings
	// (signed blob URLs), never in an error the download makes.
	secrets []string
	// events counts the span events of the layer, streams and chunks
	// what the span's attributes sum up.
	events, chunkCount atomic.Int64
	streams            atomic.Int64
}

// maxLayerEvents bounds the span events of one layer fetch: a large
// blob fetched in many chunks, or resumed often, stays a bounded trace.
const maxLayerEvents = 64

// event adds a span event to the layer's fetch span, up to
// maxLayerEvents; chunk events are also counted for the span's
// attributes.
func (d *downloader) event(ctx context.Context, name string, attrs ...attribute.KeyValue) {
	if name == EventLayerChunk {
		d.chunkCount.Add(1)
	}
	if d.events.Add(1) <= maxLayerEvents {
		spanEvent(ctx, name, attrs...)
	}
}

// download writes the layer's blob into the cache, trying each place the
// source offers until one yields all of it (blobRun: one or more streams,
// each claim with its own retries). What was received is kept across
// places, so readers following the blob never see it start over. The size
// and sha256 are checked at the end; a mismatch fails the download, with
// nothing kept, since readers may have used the bytes already.
func (d *downloader) download(ctx context.Context) error {
	p, err := d.store.Create(d.layer.Digest.Hex, d.layer.Size)
	if err != nil {
		return fmt.Errorf("fetch layer %s: %w", d.layer.Digest, err)
	}
	d.blob.partial = p
	close(d.blob.started)
	err = d.fill(ctx, p)
	trace.SpanFromContext(ctx).SetAttributes(attribute.Int64("oci.layer.connections", d.streams.Load()),
		attribute.Int64("oci.layer.chunks", d.chunkCount.Load()))
	if err != nil {
		// Redacted here, where it is made: readers following the blob,
		// the fetch span and the build's error all get this one.
		err = safetext.RedactError(err, d.secrets...)
		p.Abort(err)
		return err
	}
	return nil
}

// fill downloads into p from the source's places, in order, and commits
// it. A run that ends with bytes nobody fetched is run again (maxResumes
// times).
func (d *downloader) fill(ctx context.Context, p *blobcache.Partial) error {
	var errs []error
	for _, o := range d.src.openers(d.layer.Digest) {
		what := fmt.Sprintf("fetch layer %s from %s", d.layer.Digest, o.where)
		for runs := 1; ; runs++ {
			r := d.newRun(ctx, p, o)
			err := r.run()
			d.streams.Store(max(d.streams.Load(), int64(r.streams)))
			if err == nil {
				if err := p.Commit(); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				return nil
			}
			if ctx.Err() != nil {
				return fmt.Errorf("%s: %w", what, ctx.Err())
			}
			var se *StallError
			switch {
			case errors.Is(err, ErrDigestMismatch):
				return classify(err, what, o.host)
			case errors.Is(err, errRunIncomplete) && runs <= maxResumes:
				continue
			case errors.As(err, &se):
				errs = append(errs, &kindError{cause: err, msg: fmt.Sprintf("%s: layer %d: %v", what, d.index, se)})
			default:
				errs = append(errs, classify(err, what, o.host))
			}
			break
		}
	}
	if len(errs) == 0 {
		return fmt.Errorf("fetch layer %s: no source", d.layer.Digest)
	}
	return errors.Join(errs...)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// tracker sums the progress of one Fetch.
type tracker struct {
	start       time.Time
	totalBytes  int64
	totalLayers int
	done        atomic.Int64 // credited bytes, monotone
	net         atomic.Int64 // bytes actually copied, for the speed
	completed   atomic.Int64

	// Used by the ticker goroutine only.
	lastNet  int64
	lastTick time.Time
}

func newTracker(img *Image) *tracker {
	now := time.Now()
	return &tracker{start: now, lastTick: now, totalBytes: img.CompressedSize, totalLayers: len(img.Layers)}
}

// layerTracker credits one distinct blob used uses times in the manifest.
type layerTracker struct {
	t        *tracker
	size     int64
	uses     int
	credited atomic.Int64 // bytes of this blob already counted in t.done
}

func (t *tracker) layer(size int64, uses int) *layerTracker {
	return &layerTracker{t: t, size: size, uses: uses}
}

// add records n bytes written into the blob. Each byte of a blob is
// written once, so the credit never goes back and never passes the size.
func (lt *layerTracker) add(n int) {
	lt.t.net.Add(int64(n))
	for {
		c := lt.credited.Load()
		next := min(c+int64(n), lt.size)
		if next == c {
			return
		}
		if lt.credited.CompareAndSwap(c, next) {
			lt.t.done.Add(next - c)
			return
		}
	}
}

// complete credits the rest of the blob for every use of it.
func (lt *layerTracker) complete() {
	total := lt.size * int64(lt.uses)
	c := lt.credited.Swap(total)
	lt.t.done.Add(total - c)
	lt.t.completed.Add(int64(lt.uses))
}

func (t *tracker) snapshot(final bool) Progress {
	now := time.Now()
	net := t.net.Load()
	var speed int64
	if final {
		if el := now.Sub(t.start).Seconds(); el > 0 {
			speed = int64(float64(net) / el)
		}
	} else {
		if el := now.Sub(t.lastTick).Seconds(); el > 0 {
			speed = int64(float64(net-t.lastNet) / el)
		}
		t.lastNet, t.lastTick = net, now
	}
	return Progress{
		TotalBytes:      t.totalBytes,
		DownloadedBytes: t.done.Load(),
		TotalLayers:     t.totalLayers,
		CompletedLayers: int(t.completed.Load()),
		SpeedBPS:        speed,
	}
}

// starveAfter is how long, in all, a build must have waited for bytes of
// one layer already arriving before more streams are added: the first
// bytes of a fast registry come in small reads the build catches up with
// for a moment, which is no sign of a slow link.
const starveAfter = 20 * time.Millisecond

// followingReader reads a blob being downloaded and tells the gate when
// the build has waited starveAfter for bytes that had begun to arrive:
// the build, not the registry, is then the one waiting.
type followingReader struct {
	io.ReadCloser
	p       *blobcache.Partial
	starved *atomic.Bool
	off     int64
	waited  time.Duration
}

func (r *followingReader) Read(b []byte) (int, error) {
	if r.starved.Load() || r.off == 0 || r.off < r.p.Written() || r.off >= r.p.Size() {
		n, err := r.ReadCloser.Read(b)
		r.off += int64(n)
		return n, err
	}
	began := time.Now()
	n, err := r.ReadCloser.Read(b)
	r.off += int64(n)
	if r.waited += time.Since(began); r.waited >= starveAfter {
		r.starved.Store(true)
	}
	return n, err
}
