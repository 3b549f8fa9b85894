package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/inject"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fsutil"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
)

// Options configure a Builder.
type Options struct {
	// Store is where artifacts are published.
	Store Store
	// CAPath is the egress CA baked into images.
	CAPath string
	// Pull configures image sources and the layer cache.
	Pull PullOptions
	// HeadroomPercent and HeadroomInodes are left free in every image for
	// the guest to write.
	HeadroomPercent int
	HeadroomInodes  int
	// DirectIO writes images of directMinCompressed or more with direct
	// I/O and hashes them with direct reads; off, every image goes
	// through the page cache.
	DirectIO bool
	// Limits bound what one build may take from the host.
	Limits Limits
	// Pacer paces the Go collector while builds hold large trees; nil
	// leaves the collector alone. The pacer sets the process's memory
	// limit, so it is for the program's main to make, once.
	Pacer *MemoryPacer
}

// Builder resolves images and builds template images from them.
type Builder struct {
	opts   Options
	puller *oci.Puller
	// chunks are the layers' read-ahead buffers, reused across layers
	// and builds.
	chunks *layercodec.ChunkPool
	// returned gives memory back to the OS when the last build ends.
	returned *memoryReturn
}

// NewBuilder opens the layer cache; Close releases it.
func NewBuilder(opts Options) (*Builder, error) {
	if opts.Store == "" {
		return nil, errors.New("new builder: no store directory")
	}
	if opts.Pull.Gzip == nil {
		opts.Pull.Gzip = layercodec.NewGzipInflater(layercodec.InflaterAuto)
	}
	p, err := oci.New(opts.Pull)
	if err != nil {
		return nil, err
	}
	return &Builder{opts: opts, puller: p, chunks: new(layercodec.ChunkPool),
		returned: &memoryReturn{idle: memoryReturnIdle, release: debug.FreeOSMemory}}, nil
}

// Close stops the layer cache's background work and releases it.
func (b *Builder) Close() error { return b.puller.Close() }

// CacheStats describes the layer cache.
func (b *Builder) CacheStats() CacheStats {
	st := b.puller.CacheStats()
	return CacheStats{Bytes: st.Bytes, Blobs: st.Blobs, ZstdBlobs: st.ZstdBlobs,
		TranscodePending: st.TranscodePending, Transcoded: st.Transcoded, TranscodeFailures: st.TranscodeFailures,
		Hits: st.Hits, Misses: st.Misses}
}

// Resolve reads the image's manifest and configuration.
func (b *Builder) Resolve(ctx context.Context, src Source) (*Image, error) {
	img, err := b.puller.Resolve(ctx, oci.Source{Ref: src.Ref, Username: src.Username, Password: src.Password})
	if err != nil {
		return nil, err
	}
	c := img.Config
	return &Image{Digest: img.Digest, Created: img.Created, CompressedSize: img.CompressedSize,
		Config: ImageConfig{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, WorkingDir: c.WorkingDir, User: c.User},
		Arch:   img.Architecture, resolved: img}, nil
}

// LoadCA reads the configured egress CA.
func (b *Builder) LoadCA(ctx context.Context) (*CA, error) {
	return inject.LoadCA(b.opts.CAPath)
}

// Progress milestones of Build: downloads take 40→60, layers 60→95.
const (
	percentFetch  = 40
	percentLayers = 60
	percentFinish = 95
)

// Build fetches the image's layers, flattens them into a new ext4 image with
// envd and the CA injected, and publishes it as spec.ArtifactID. Nothing
// from the image touches the host filesystem except the image file itself,
// which appears under its final name only when complete.
func (b *Builder) Build(ctx context.Context, spec Spec, progress ProgressFunc) (*Artifact, error) {
	if progress == nil {
		progress = func(Progress) {}
	}
	img := spec.Image
	if img == nil || img.resolved == nil {
		return nil, errors.New("build: image was not returned by Resolve")
	}
	if err := b.checkSpace(img); err != nil {
		return nil, err
	}
	b.returned.begin()
	defer b.returned.end()
	// Asked before the downloads start, which fill the cache.
	cached := b.puller.Cached(img.resolved)
	// Downloads run while the layers are applied: each layer is applied
	// as its bytes arrive, bottom first (oci.Layers.Open).
	layers, err := b.puller.Start(ctx, img.resolved, func(p oci.Progress) {
		pct := percentFetch
		if p.TotalBytes > 0 {
			pct += int(int64(percentLayers-percentFetch) * p.DownloadedBytes / p.TotalBytes)
		}
		progress(Progress{Percent: pct, Pull: &p})
	})
	if err != nil {
		return nil, fmt.Errorf("fetch layers: %w", err)
	}
	defer layers.Close()

	f, err := b.opts.Store.CreateTemp(spec.ArtifactID)
	if err != nil {
		return nil, err
	}
	published := false
	defer func() {
		if !published {
			b.opts.Store.Discard(f, spec.ArtifactID)
		}
	}()
	art, err := b.write(ctx, f, spec, layers, cached, progress)
	if err != nil {
		return nil, err
	}
	if err := b.opts.Store.Commit(f, spec.ArtifactID); err != nil {
		return nil, err
	}
	published = true
	fi, err := os.Stat(b.opts.Store.ArtifactPath(spec.ArtifactID))
	if err != nil {
		return nil, fmt.Errorf("stat published image: %w", err)
	}
	art.ModTime = fi.ModTime()
	return art, nil
}

// write produces the image in f: layers, injections, start check,
// metadata, hash; cached tells that no layer had to be downloaded. On an
// error no write to f is in flight when it returns, so the caller's
// Discard gives the space back at once.
func (b *Builder) write(ctx context.Context, f *os.File, spec Spec, layers *oci.Layers, cached bool, progress ProgressFunc) (art *Artifact, err error) {
	img := spec.Image
	stamp := img.Created
	if stamp.IsZero() {
		stamp = time.Unix(0, 0)
	}
	large := directData(img.CompressedSize)
	direct := b.opts.DirectIO && large && cached
	w, err := b.newImageWriter(f, spec, stamp, direct)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			w.Abort()
		}
	}()
	store := &guardedStore{Writer: w, dir: string(b.opts.Store), limits: b.opts.Limits}
	paced := b.opts.Pacer.start()
	defer paced.done()
	tree := flatten.New(store, flatten.Options{RootTime: stamp, Limits: flatten.Limits{
		MaxEntries: b.opts.Limits.MaxEntries, MaxMemory: b.opts.Limits.MaxTreeMemory}, Grow: paced.grow})
	if err := b.applyLayers(ctx, tree, layers, progress); err != nil {
		return nil, err
	}
	art = &Artifact{ID: spec.ArtifactID, Path: b.opts.Store.ArtifactPath(spec.ArtifactID)}
	if err := injectEnvdAndCA(ctx, tree, spec, stamp, art); err != nil {
		return nil, err
	}
	// The tree is complete and still in memory: check that its start
	// command can run before the image is finished and published.
	if err := checkStart(ctx, tree, store, spec, art); err != nil {
		return nil, err
	}
	if err := store.checkFree(0); err != nil {
		return nil, fmt.Errorf("write ext4 metadata: %w", err)
	}
	paced.grow(tree.Memory())
	if art.SHA256, art.Size, err = b.finishImage(ctx, f, w, tree, paced, direct, large); err != nil {
		return nil, err
	}
	return art, nil
}

// newImageWriter starts the ext4 image of spec in f, its identity derived
// from the fingerprint and its times from stamp; direct writes its data
// past the page cache.
func (b *Builder) newImageWriter(f *os.File, spec Spec, stamp time.Time, direct bool) (*ext4.Writer, error) {
	w, err := ext4.NewWriter(f, ext4.Options{
		BufferedData: !direct,
		UUID:         derive("uuid", spec.Fingerprint), HashSeed: derive("hash-seed", spec.Fingerprint),
		Label: "cube-rootfs", Time: stamp, JournalBlocks: journalBlocks(spec.Image.CompressedSize),
		HeadroomPercent: uint32(b.opts.HeadroomPercent), HeadroomMinBlocks: 1024, HeadroomInodes: uint32(b.opts.HeadroomInodes),
		NoSync:      true, // flushed by finishImage while the image is hashed
		ConsumeTree: true, // the tree is not used after Finish
	})
	if err != nil {
		return nil, fmt.Errorf("start ext4 image: %w", err)
	}
	return w, nil
}

// applyLayers applies the layers onto tree, bottom first, each one
// decompressing ahead while the one below it is applied, and waits for
// their downloads to end.
func (b *Builder) applyLayers(ctx context.Context, tree *flatten.Tree, layers *oci.Layers, progress ProgressFunc) error {
	n := layers.Len()
	next := startLayer(ctx, layers, 0, readAheadCurrent, b.chunks, b.opts.Pull.Gzip)
	defer func() {
		if next != nil {
			// On an error: the next layer may still be downloading,
			// until Build closes the layers; do not wait for it here.
			go next.close()
		}
	}()
	for i := 0; i < n; i++ {
		cur := next
		next = nil
		if i+1 < n {
			next = startLayer(ctx, layers, i+1, readAheadNext, b.chunks, b.opts.Pull.Gzip)
		}
		actx, endApply := startSpan(ctx, SpanLayerApply, attribute.Int("oci.layer.index", i))
		err := cur.apply(actx, tree)
		endApply(err)
		cur.close()
		if errors.Is(err, oci.ErrIncomplete) {
			// The layer streamed while it downloaded and the download
			// failed: its error says why, not the tar reader's.
			if ferr := layers.Wait(); ferr != nil {
				return fmt.Errorf("fetch layers: %w", ferr)
			}
		}
		if err != nil {
			return err
		}
		progress(Progress{Percent: percentLayers + (percentFinish-percentLayers)*(i+1)/n})
	}
	if err := layers.Wait(); err != nil {
		return fmt.Errorf("fetch layers: %w", err)
	}
	return nil
}

// injectEnvdAndCA installs spec's envd and bakes its egress CA into tree;
// art records what the CA's baking wrote.
func injectEnvdAndCA(ctx context.Context, tree *flatten.Tree, spec Spec, stamp time.Time, art *Artifact) error {
	if spec.Envd != nil {
		if err := inject.Envd(ctx, tree, spec.Envd, stamp); err != nil {
			return fmt.Errorf("inject envd: %w", err)
		}
	}
	if spec.CA != nil {
		res, err := inject.BakeCA(ctx, tree, spec.CA, stamp)
		if err != nil {
			return fmt.Errorf("bake cube egress CA: %w", err)
		}
		if !res.Baked {
			return fmt.Errorf("bake cube egress CA: nothing written and the CA is not in the image (skipped: %v)", res.Skipped)
		}
		art.CABaked, art.CATargets = true, res.TargetsWritten
	}
	return nil
}

// checkStart runs the start check spec asks for on the complete tree and
// records its result in art; a check that fails the build is a
// *StartCheckError.
func checkStart(ctx context.Context, tree *flatten.Tree, store flatten.DataStore, spec Spec, art *Artifact) error {
	mode := spec.StartCheck
	if mode == StartCheckOff {
		return nil
	}
	cctx, endCheck := startSpan(ctx, SpanStartCheck)
	res := checkTree(tree, store, spec.Image, spec.Envd != nil, spec.Start)
	trace.SpanFromContext(cctx).SetAttributes(attribute.String("start_check.result", res.Result),
		attribute.Int("start_check.libraries", len(res.Libraries)+res.LibrariesOmitted))
	if res.Failed() && mode != StartCheckWarn {
		err := &StartCheckError{Result: res}
		endCheck(err)
		return err
	}
	endCheck(nil)
	art.StartCheck = &res
	return nil
}

// finishImage writes tree's ext4 metadata through w, which frees the tree
// (paced is done), and hashes the image in f while the disk syncs it. A
// large image written through the page cache leaves it afterwards.
func (b *Builder) finishImage(ctx context.Context, f *os.File, w *ext4.Writer, tree *flatten.Tree, paced *pacedBuild, direct, large bool) (sum string, size int64, err error) {
	ectx, endExt4 := startSpan(ctx, SpanExt4)
	defer func() { endExt4(err) }()
	stats, err := w.Finish(ectx, tree.Root())
	paced.done() // the tree and the plan are garbage now
	if err != nil {
		return "", 0, fmt.Errorf("write ext4 metadata: %w", err)
	}
	if sum, err = b.hashWhileSyncing(ctx, f, direct); err != nil {
		return "", 0, err
	}
	if large && !direct {
		// A large image written through the page cache while its layers
		// downloaded: synced and hashed, its pages are dropped, as direct
		// I/O would have left them, for the memory the node's sandboxes use.
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	}
	return sum, stats.Size, nil
}

// hashWhileSyncing hashes the image in f while the disk flushes it:
// hashing reads the page cache, so the two overlap.
func (b *Builder) hashWhileSyncing(ctx context.Context, f *os.File, direct bool) (string, error) {
	type hashed struct {
		sum string
		err error
	}
	done := make(chan hashed, 1)
	go func() {
		sum, err := hashImage(ctx, f.Name(), direct, b.chunks)
		done <- hashed{sum, err}
	}()
	syncErr := f.Sync()
	h := <-done
	switch {
	case syncErr != nil:
		return "", fmt.Errorf("sync image: %w", syncErr)
	case h.err != nil:
		return "", h.err
	}
	return h.sum, nil
}

// Read-ahead of a layer's uncompressed stream: the first layer, and each
// later one, which starts to inflate while the one before it is applied
// (on whatever core that leaves idle) and keeps that lead. With a lead of
// 32 MiB, warm builds of docs/performance.md took -5 % (Debian) and -12 %
// (large) from gzip, 0 and -5 % from zstd, but the peak RSS of an image
// of 8 layers rose from 67 to 130 MiB (two leads filled, and the garbage
// collector's slack on them); 16 MiB keeps most of the overlap for 101
// MiB. Buffers come from the Builder's ChunkPool as they fill.
const (
	readAheadCurrent = 4 << 20
	readAheadNext    = 16 << 20
)

// startedLayer is a layer whose decompression runs ahead of its
// application, on a goroutine of its own.
type startedLayer struct {
	i     int
	ready chan struct{}
	blob  io.ReadCloser
	tar   io.ReadCloser
	ahead *layercodec.ReadAheadReader
	err   error
}

// startLayer opens layer i (as its download brings it) and starts
// decompressing it (gzip with gz) up to size bytes ahead, without blocking
// the caller.
func startLayer(ctx context.Context, layers *oci.Layers, i, size int, pool *layercodec.ChunkPool, gz *layercodec.GzipInflater) *startedLayer {
	l := &startedLayer{i: i, ready: make(chan struct{})}
	go func() {
		defer close(l.ready)
		blob, err := layers.Open(i)
		if err != nil {
			l.err = fmt.Errorf("fetch layers: %w", err)
			return
		}
		tarStream, err := layercodec.Decompress(blob, gz)
		if err != nil {
			blob.Close()
			l.err = fmt.Errorf("layer %d: %w", i, err)
			return
		}
		l.blob, l.tar = blob, tarStream
		l.ahead = layercodec.ReadAheadSize(fsutil.ContextReader(ctx, tarStream), size, pool)
	}()
	return l
}

// apply applies the layer onto tree.
func (l *startedLayer) apply(ctx context.Context, tree *flatten.Tree) error {
	<-l.ready
	if l.err != nil {
		return l.err
	}
	// Applied now: a short lead is enough, the rest of its buffers serve
	// the next layer's.
	l.ahead.Shrink(readAheadCurrent)
	// ApplyLayer's errors already name the layer and entry.
	return tree.ApplyLayer(ctx, l.i, l.ahead)
}

// close stops the decompression and closes the blob.
func (l *startedLayer) close() {
	<-l.ready
	if l.ahead != nil {
		l.ahead.Close()
		l.tar.Close()
		l.blob.Close()
	}
}

// derive makes a stable 16-byte value from the fingerprint, so the same spec
// always gets the same filesystem UUID and directory hash seed.
func derive(purpose, fingerprint string) [16]byte {
	sum := sha256.Sum256([]byte("cube-templatecenter " + purpose + " " + fingerprint))
	var out [16]byte
	copy(out[:], sum[:16])
	out[6] = out[6]&0x0f | 0x40 // RFC 4122 version 4 layout
	out[8] = out[8]&0x3f | 0x80
	return out
}

// journalBlocks sizes the journal from the compressed image size (a stable
// input, so the layout stays deterministic): 4 MiB for small images up to
// 64 MiB, never more than mke2fs would choose.
func journalBlocks(compressed int64) uint32 {
	switch est := compressed * 3; {
	case est < 128<<20:
		return 1024
	case est < 1<<30:
		return 4096
	case est < 8<<30:
		return 8192
	default:
		return 16384
	}
}

// checkSpace fails early when the store clearly cannot hold the image
// above its reserve (Limits.MinFree*): layers expand to about three times
// their compressed size. Writing checks again as the content arrives.
func (b *Builder) checkSpace(img *Image) error {
	sp, err := StoreSpace(string(b.opts.Store), b.opts.Limits)
	if err != nil {
		return err
	}
	required := img.CompressedSize*3 + 64<<20
	if sp.Free-sp.Reserve < required {
		return fmt.Errorf("insufficient disk space: available=%d bytes required=%d bytes plus %d kept free by %s (store %s)",
			sp.Free, required, sp.Reserve, LimitMinFree, b.opts.Store)
	}
	return nil
}

// hashBufSize is FileSHA256's read size.
const hashBufSize = 4 << 20

// FileSHA256 hashes a file, stopping when ctx ends.
func FileSHA256(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	// Large reads: the hash is most of a warm build's last phase, and
	// io.Copy's small reads cost measurably more (docs/performance.md,
	// decision 4).
	buf := make([]byte, hashBufSize)
	if _, err := io.CopyBuffer(h, fsutil.ContextReader(ctx, f), buf); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// directMinCompressed is the compressed image size from which the
// Builder writes the image's data with direct I/O (ext4.Options
// .BufferedData off) and hashes it with direct reads, when its layers are
// all in the cache. Large images build faster that way, because the page
// cache they would grow into costs more than the device; small ones
// slower, because their writes fit in cache already freed. The crossover
// was measured (docs/performance.md, decision 8); 128 MiB compressed is
// about 400 MiB of image. A build that downloads writes as the layers
// arrive: the page cache's costs hide in the download's time, its
// writeback is done by the end, and the hash after the last byte reads
// memory instead of the device (docs/performance.md, link decisions).
const directMinCompressed = 128 << 20

// directData reports whether an image of compressed bytes is large enough
// to be written and hashed with direct I/O (when its layers are cached).
func directData(compressed int64) bool { return compressed >= directMinCompressed }

// hashImage hashes the image at path: with direct reads when its data
// was written directly (falling back to the page cache where they are
// refused), else through the page cache that holds it. Either way the
// reads run ahead of the hash on other threads: after the last layer, the
// hash is most of what a build still has to do.
func hashImage(ctx context.Context, path string, direct bool, pool *layercodec.ChunkPool) (string, error) {
	if direct {
		if sum, ok, err := directSHA256(ctx, path, pool); ok {
			return sum, err
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	sum, _, err := sha256At(ctx, f, cachedReadsInFlight, pool)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return sum, nil
}

// Reads in flight while an image is hashed: direct reads need several to
// keep the device busy (one at a time left it idle between requests, and
// the hash waiting on it), page cache reads one ahead of the hash.
const (
	directReadsInFlight = 4
	cachedReadsInFlight = 2
)

// sha256At hashes f from its first byte to its size, reading ahead of the
// hash; consumed is what was hashed before an error.
func sha256At(ctx context.Context, f *os.File, inFlight int, pool *layercodec.ChunkPool) (sum string, consumed int64, err error) {
	fi, err := f.Stat()
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	consumed, err = layercodec.ReadAtInOrder(ctx, f, fi.Size(), inFlight, pool, func(b []byte) error {
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", consumed, err
	}
	return hex.EncodeToString(h.Sum(nil)), consumed, nil
}

// directSHA256 hashes path read with direct I/O, into the pool's
// page-aligned buffers: data written past the page cache would otherwise
// be fetched through small read-ahead requests and fill the cache for
// nothing. ok is false when the file system refuses direct reads.
func directSHA256(ctx context.Context, path string, pool *layercodec.ChunkPool) (sum string, ok bool, err error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false, nil
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	switch sum, consumed, err := sha256At(ctx, f, directReadsInFlight, pool); {
	case consumed == 0 && errors.Is(err, unix.EINVAL):
		return "", false, nil
	case err != nil:
		return "", true, fmt.Errorf("hash %s: %w", path, err)
	default:
		return sum, true, nil
	}
}
