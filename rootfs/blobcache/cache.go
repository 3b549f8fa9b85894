package blobcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fsutil"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
)

// tmpPrefix starts the name of every partial blob; New removes such files.
const tmpPrefix = ".tmp-"

// copyBufSize is the buffer each concurrent blob copy uses.
const copyBufSize = 1 << 20

// Cache is the content-addressed store of layer blobs, keyed by the hex of
// their sha256 as served. Each blob is on disk in one of two forms: as served, in <blobs>/sha256/<hex>, or, once
// transcoded, as zstd in <blobs>/zstd/<hex>-<hex of the zstd file> (both for
// a moment while a reader still holds the served form). The files are the
// truth; the in-memory index mirrors them with pin counts, last use
// (persisted as the file mtime, so LRU order survives restarts) and whether
// the bytes were verified by this process. It is safe for concurrent use.
type Cache struct {
	dir   string // served blobs
	zdir  string // zstd transcodes
	quota int64
	bufs  sync.Pool
	tc    *transcoder // nil when transcoding is off
	lock  *os.File    // flock on <Dir>/lock, nil once closed

	mu      sync.Mutex
	entries map[string]*cacheEntry
	total   int64
	flights map[string]*flight
	// users counts Acquire calls in progress plus the pins they hold (not
	// the transcoder's own): while it is above zero a build is using the
	// cache, and the transcoder waits. usersIdle, when not nil, is closed
	// once users drops to zero.
	users     int
	usersIdle chan struct{}
	// hits and misses count the Acquire calls that succeeded, by whether
	// they found the blob on disk (Stats).
	hits, misses atomic.Int64
}

// cacheEntry is one blob, keyed by the hex of its digest as served.
type cacheEntry struct {
	// size is the blob's size as served, -1 when only the zstd form was
	// found on disk.
	size int64
	// served tells whether the blob as served is on disk; staleServed that it
	// is to be removed once unpinned (a zstd form replaced it).
	served, staleServed bool
	// reverify asks for verified to be cleared once unpinned: the file was
	// found changed while in use. Clearing it earlier would let a new
	// acquire drop and replace the entry under its current pins.
	reverify bool
	// zhex and zsize describe the zstd form; zhex is "" without one.
	zhex  string
	zsize int64
	// keep marks a blob the transcoder leaves alone (not gzip, failed).
	keep     bool
	lastUse  time.Time
	pins     int
	verified bool
}

// flight is one in-progress verification or download of a blob; concurrent
// acquirers of the same blob wait for it instead of downloading again.
type flight struct {
	done   chan struct{}
	err    error
	source string
}

// Options configure a Cache.
type Options struct {
	// Dir holds the cache: blobs in <Dir>/blobs/sha256/<hex>, their zstd
	// forms in <Dir>/blobs/zstd/, and <Dir>/lock; required. One Cache at a
	// time may use it (Open takes the lock).
	Dir string
	// QuotaBytes is the size the cache is LRU-evicted down to; required.
	// Pinned blobs are never evicted, so the cache can exceed it while they
	// are in use.
	QuotaBytes int64
	// TranscodeZstd has Release queue gzip blobs to be re-encoded as zstd,
	// one at a time on a thread at the lowest priority, paused while any
	// blob is pinned or being acquired (a build uses the cache); Open then
	// returns the zstd form. Close stops a transcode in progress.
	TranscodeZstd bool
	// Logger receives the transcoder's warnings (slog.DiscardHandler when
	// nil).
	Logger *slog.Logger
	// Gzip inflates the gzip blobs the transcoder reads
	// (layercodec.NewGzipInflater(layercodec.InflaterAuto) when nil).
	Gzip *layercodec.GzipInflater
}

// Open creates the cache directory, locks it against other Caches, removes
// temp files a crash left behind, loads the index from the files on disk and
// evicts down to the quota. Close releases it.
func Open(opts Options) (*Cache, error) {
	if opts.Dir == "" {
		return nil, errors.New("Options.Dir is required")
	}
	if opts.QuotaBytes <= 0 {
		return nil, errors.New("QuotaBytes must be positive")
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cache dir: %w", err)
	}
	lock, err := lockDir(opts.Dir)
	if err != nil {
		return nil, err
	}
	c, err := openBlobs(filepath.Join(opts.Dir, "blobs"), opts.QuotaBytes)
	if err != nil {
		lock.Close()
		return nil, err
	}
	c.lock = lock
	if opts.TranscodeZstd {
		logger := opts.Logger
		if logger == nil {
			logger = slog.New(slog.DiscardHandler)
		}
		gz := opts.Gzip
		if gz == nil {
			gz = layercodec.NewGzipInflater(layercodec.InflaterAuto)
		}
		c.tc = newTranscoder(c, logger, gz)
	}
	return c, nil
}

// lockDir takes a non-blocking exclusive flock on <dir>/lock so two Caches
// (in this or another process) never manage one directory: the in-memory
// pins and single-flight state would not see each other.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open cache lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked by another Cache", ErrLocked, dir)
		}
		return nil, fmt.Errorf("lock cache dir: %w", err)
	}
	return f, nil
}

// Close stops the transcoder (a transcode in progress is cancelled, its temp
// file removed) and releases the lock. Blobs already opened stay readable,
// but the Cache must not be used afterwards.
func (c *Cache) Close() error {
	if c.lock == nil {
		return nil
	}
	if c.tc != nil {
		c.tc.stop()
	}
	err := c.lock.Close()
	c.lock = nil
	if err != nil {
		return fmt.Errorf("close cache lock: %w", err)
	}
	return nil
}

// openBlobs scans <blobs>/sha256 and <blobs>/zstd, removing partial files
// left by a crash, and loads the index from the files' names, sizes and
// mtimes.
func openBlobs(blobs string, quota int64) (*Cache, error) {
	c := &Cache{
		dir:     filepath.Join(blobs, "sha256"),
		zdir:    filepath.Join(blobs, "zstd"),
		quota:   quota,
		entries: make(map[string]*cacheEntry),
		flights: make(map[string]*flight),
	}
	c.bufs.New = func() any { b := make([]byte, copyBufSize); return &b }
	for _, d := range []string{c.dir, c.zdir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create cache dir: %w", err)
		}
	}
	err := scanCacheDir(c.dir, IsHex64, func(name string, fi fs.FileInfo) error {
		c.entries[name] = &cacheEntry{size: fi.Size(), served: true, lastUse: fi.ModTime()}
		c.total += fi.Size()
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = scanCacheDir(c.zdir, isZstdName, func(name string, fi fs.FileInfo) error {
		hex, zhex := name[:64], name[65:]
		if e := c.entries[hex]; e != nil {
			// A crash between committing the zstd form and removing the
			// served one: keep the served blob, its name authenticates it
			// (and of two zstd forms, the first found).
			if err := os.Remove(filepath.Join(c.zdir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove duplicate zstd blob: %w", err)
			}
			return nil
		}
		c.entries[hex] = &cacheEntry{size: -1, zhex: zhex, zsize: fi.Size(), lastUse: fi.ModTime()}
		c.total += fi.Size()
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.evictLocked()
	c.mu.Unlock()
	return c, nil
}

// scanCacheDir removes temp files from dir and calls found for every regular
// file whose name passes valid.
func scanCacheDir(dir string, valid func(string) bool, found func(name string, fi fs.FileInfo) error) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read cache dir: %w", err)
	}
	for _, de := range des {
		n := de.Name()
		if strings.HasPrefix(n, tmpPrefix) {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove stale temp blob: %w", err)
			}
			continue
		}
		if !valid(n) || !de.Type().IsRegular() {
			continue
		}
		fi, err := de.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return fmt.Errorf("stat cached blob: %w", err)
		}
		if err := found(n, fi); err != nil {
			return err
		}
	}
	return nil
}

// isZstdName matches <hex>-<hex>, the name of a zstd form.
func isZstdName(s string) bool {
	return len(s) == 129 && s[64] == '-' && IsHex64(s[:64]) && IsHex64(s[65:])
}

// IsHex64 reports whether s is the lower-case hex of a sha256 digest, the
// only blob names the cache accepts.
func IsHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'f') {
			return false
		}
	}
	return true
}

func (c *Cache) path(hexDigest string) string { return filepath.Join(c.dir, hexDigest) }

func (c *Cache) zpath(hexDigest, zhex string) string {
	return filepath.Join(c.zdir, hexDigest+"-"+zhex)
}

// Open opens the form of pinned blob hexDigest readers should use: the zstd
// form when there is one, verified like the served form, whose uncompressed
// stream is the same. Neither form of a pinned blob is removed, so the
// choice made under the lock stays valid.
func (c *Cache) Open(hexDigest string) (io.ReadCloser, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[hexDigest]
	if e == nil || e.pins == 0 || !e.verified {
		return nil, fmt.Errorf("blob sha256:%s is not pinned", hexDigest)
	}
	if e.zhex != "" {
		return os.Open(c.zpath(hexDigest, e.zhex))
	}
	return os.Open(c.path(hexDigest))
}

// Stats describes a Cache.
type Stats struct {
	// Bytes is the size of the cached files; Blobs the number of blobs.
	Bytes int64
	Blobs int
	// ZstdBlobs counts blobs kept in zstd form.
	ZstdBlobs int
	// Pinned counts blobs held by at least one Acquire not yet released.
	Pinned int
	// TranscodePending counts blobs queued for or being transcoded;
	// Transcoded and TranscodeFailures count outcomes since Open.
	TranscodePending  int
	Transcoded        int64
	TranscodeFailures int64
	// TranscodePaused tells that the transcoder waits for builds to
	// release the cache.
	TranscodePaused bool
	// Hits counts the Acquire calls since Open served by a file already in
	// the cache; Misses those that downloaded the blob or waited for
	// another Acquire's download of it. Failed calls count in neither.
	Hits, Misses int64
}

// Stats returns the cache's sizes, pins and transcoder counts.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	st := Stats{Bytes: c.total, Blobs: len(c.entries), Hits: c.hits.Load(), Misses: c.misses.Load()}
	for _, e := range c.entries {
		if e.zhex != "" {
			st.ZstdBlobs++
		}
		if e.pins > 0 {
			st.Pinned++
		}
	}
	c.mu.Unlock()
	if c.tc != nil {
		st.TranscodePending, st.Transcoded, st.TranscodeFailures, st.TranscodePaused = c.tc.counts()
	}
	return st
}

// Has reports whether blob hexDigest is on disk, in either form, whether
// or not it was verified yet.
func (c *Cache) Has(hexDigest string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[hexDigest] != nil
}

// Quota returns the size the cache is evicted down to.
func (c *Cache) Quota() int64 { return c.quota }

// Acquire pins blob hexDigest of the given size, making sure it is present
// and verified: an unverified file is hashed once, a missing or corrupt one is
// obtained with download (which must commit it with Put). Release drops the
// pin; a pinned blob is never evicted. Concurrent
// acquirers of one blob share a single verification or download. fromCache
// reports that no download by this call was needed. source names where
// download reads from: a waiter whose leader failed retries with its own
// download when the leader was cancelled or read from another source.
func (c *Cache) Acquire(ctx context.Context, hexDigest string, size int64, source string,
	download func(context.Context) error) (fromCache bool, err error) {
	c.mu.Lock()
	c.users++
	c.mu.Unlock()
	defer func() {
		if err != nil {
			c.mu.Lock()
			c.dropUserLocked()
			c.mu.Unlock()
		}
	}()
	retried := false
	// waited tells that the blob came from another call's download: a miss
	// for this one too, though it downloaded nothing.
	waited := false
	for {
		c.mu.Lock()
		e := c.entries[hexDigest]
		if e != nil && e.verified {
			if e.size >= 0 && e.size != size {
				c.mu.Unlock()
				return false, fmt.Errorf("%w: blob sha256:%s has %d bytes, the manifest says %d", ErrDigestMismatch, hexDigest, e.size, size)
			}
			e.pins++
			e.lastUse = time.Now()
			c.mu.Unlock()
			c.touch(hexDigest)
			c.count(!waited)
			return true, nil
		}
		if f := c.flights[hexDigest]; f != nil {
			c.mu.Unlock()
			waited = true
			var werr error
			select {
			case <-f.done:
			case <-ctx.Done():
				werr = ctx.Err()
			}
			if werr != nil {
				return false, fmt.Errorf("wait for the download of sha256:%s: %w", hexDigest, werr)
			}
			if f.err == nil {
				continue
			}
			if !retried && ctx.Err() == nil && (isCtxErr(f.err) || f.source != source) {
				retried = true
				continue
			}
			return false, f.err
		}
		f := &flight{done: make(chan struct{}), source: source}
		c.flights[hexDigest] = f
		c.mu.Unlock()

		fromCache, err = c.fill(ctx, hexDigest, size, e != nil, download)

		c.mu.Lock()
		delete(c.flights, hexDigest)
		if err == nil {
			if e = c.entries[hexDigest]; e == nil {
				e = &cacheEntry{size: size, served: true}
				c.entries[hexDigest] = e
				c.total += size
			}
			e.verified = true
			e.pins++
			e.lastUse = time.Now()
			c.evictLocked()
		}
		c.mu.Unlock()
		f.err = err
		close(f.done)
		if err == nil && fromCache {
			c.touch(hexDigest)
		}
		if err == nil {
			c.count(fromCache && !waited)
		}
		return fromCache, err
	}
}

// count records a successful Acquire as a hit or a miss.
func (c *Cache) count(hit bool) {
	if hit {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
}

// fill runs as the only worker on a blob: it verifies the file when one is
// indexed (dropping it if corrupt) and downloads it otherwise.
func (c *Cache) fill(ctx context.Context, hexDigest string, size int64, indexed bool,
	download func(context.Context) error) (bool, error) {
	if indexed {
		path, want, wantSize := c.path(hexDigest), hexDigest, size
		c.mu.Lock()
		if e := c.entries[hexDigest]; e != nil && e.zhex != "" {
			path, want, wantSize = c.zpath(hexDigest, e.zhex), e.zhex, e.zsize
		}
		c.mu.Unlock()
		ok, err := c.verifyFile(ctx, path, want, wantSize)
		if err != nil {
			return false, err
		}
		if ok {
			return true, nil
		}
		if err := c.drop(hexDigest); err != nil {
			return false, err
		}
	}
	return false, download(ctx)
}

// verifyFile reports whether the cached file at path has the expected size
// and digest.
func (c *Cache) verifyFile(ctx context.Context, path, hexDigest string, size int64) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open cached blob: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("stat cached blob: %w", err)
	}
	if fi.Size() != size {
		return false, nil
	}
	h := sha256.New()
	bp := c.bufs.Get().(*[]byte)
	defer c.bufs.Put(bp)
	if _, err := io.CopyBuffer(h, fsutil.ContextReader(ctx, f), *bp); err != nil {
		return false, fmt.Errorf("verify cached blob sha256:%s: %w", hexDigest, err)
	}
	return hex.EncodeToString(h.Sum(nil)) == hexDigest, nil
}

// drop deletes a corrupt blob (both forms) and its index entry.
func (c *Cache) drop(hexDigest string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[hexDigest]; e != nil {
		if err := c.removeLocked(hexDigest, e); err != nil {
			return fmt.Errorf("remove corrupt cached blob: %w", err)
		}
	} else if err := os.Remove(c.path(hexDigest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove corrupt cached blob: %w", err)
	}
	return nil
}

// removeLocked deletes an entry's files and the entry. On error the entry
// stays, accounting for what is still on disk.
func (c *Cache) removeLocked(hexDigest string, e *cacheEntry) error {
	if e.served {
		if err := os.Remove(c.path(hexDigest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		c.total -= e.size
		e.served = false
	}
	if e.zhex != "" {
		if err := os.Remove(c.zpath(hexDigest, e.zhex)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		c.total -= e.zsize
		e.zhex = ""
	}
	delete(c.entries, hexDigest)
	return nil
}

// Fill copies r into p until r ends, stopping when ctx ends; progress, if
// not nil, gets p.Written() after each write. It neither commits nor aborts p.
func (c *Cache) Fill(ctx context.Context, p *Partial, r io.Reader, progress func(written int64)) error {
	bp := c.bufs.Get().(*[]byte)
	defer c.bufs.Put(bp)
	buf := *bp
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := p.Write(buf[:n]); err != nil {
				return err
			}
			if progress != nil {
				progress(p.Written())
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// FillAt copies n bytes of r into p from offset off on (Partial.WriteAt),
// stopping when ctx ends; progress, if not nil, gets the size of each
// write. It returns the bytes written, fewer than n only with an error:
// io.EOF itself when r ended first without one. It neither commits nor
// aborts p.
func (c *Cache) FillAt(ctx context.Context, p *Partial, r io.Reader, off, n int64, progress func(wrote int)) (int64, error) {
	bp := c.bufs.Get().(*[]byte)
	defer c.bufs.Put(bp)
	buf := *bp
	var done int64
	for done < n {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		k, rerr := r.Read(buf[:min(int64(len(buf)), n-done)])
		if k > 0 {
			w, err := p.WriteAt(buf[:k], off+done)
			done += int64(w)
			if w > 0 && progress != nil {
				progress(w)
			}
			if err != nil {
				return done, err
			}
		}
		if rerr == io.EOF && done < n {
			return done, io.EOF
		}
		if rerr != nil && rerr != io.EOF {
			return done, rerr
		}
	}
	return done, nil
}

// Release drops one pin on each blob, removes served forms a zstd form
// replaced, evicts down to the quota and queues the blobs for transcoding.
func (c *Cache) Release(hexDigests []string) {
	now := time.Now()
	var transcode []string
	c.mu.Lock()
	for _, d := range hexDigests {
		if e := c.entries[d]; e != nil && e.pins > 0 {
			e.pins--
			e.lastUse = now
			c.settleLocked(d, e)
			c.dropUserLocked()
		}
	}
	c.evictLocked()
	for _, d := range hexDigests {
		if e := c.entries[d]; e != nil && e.verified && !e.reverify && e.served && e.zhex == "" && !e.keep {
			transcode = append(transcode, d)
		}
	}
	c.mu.Unlock()
	if c.tc != nil {
		c.tc.enqueue(transcode)
	}
}

// dropUserLocked ends one use counted in c.users, waking the transcoder
// when it was the last.
func (c *Cache) dropUserLocked() {
	if c.users == 0 {
		return
	}
	c.users--
	if c.users == 0 && c.usersIdle != nil {
		close(c.usersIdle)
		c.usersIdle = nil
	}
}

// usersDone returns nil when no Acquire is in progress and no blob is
// pinned by one, else a channel closed once that holds.
func (c *Cache) usersDone() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users == 0 {
		return nil
	}
	if c.usersIdle == nil {
		c.usersIdle = make(chan struct{})
	}
	return c.usersIdle
}

// settleLocked applies what waited for a blob to be unpinned: it is marked
// for verification again, and its served form is removed if a zstd form
// replaced it. A failed removal leaves the form accounted for, to be retried
// at the next unpin.
func (c *Cache) settleLocked(hexDigest string, e *cacheEntry) {
	if e.pins > 0 {
		return
	}
	if e.reverify {
		e.verified, e.reverify = false, false
	}
	if !e.staleServed {
		return
	}
	if err := os.Remove(c.path(hexDigest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return
	}
	e.served, e.staleServed = false, false
	c.total -= e.size
}

// evictLocked removes unpinned, idle blobs, least recently used first, until
// the total is within the quota. Pinned blobs and blobs being verified are
// never removed, so the total may stay above the quota while they are in use.
func (c *Cache) evictLocked() {
	if c.total <= c.quota {
		return
	}
	type cand struct {
		hex     string
		lastUse time.Time
	}
	var cands []cand
	for d, e := range c.entries {
		if e.pins == 0 && c.flights[d] == nil {
			cands = append(cands, cand{d, e.lastUse})
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		if !cands[i].lastUse.Equal(cands[j].lastUse) {
			return cands[i].lastUse.Before(cands[j].lastUse)
		}
		return cands[i].hex < cands[j].hex
	})
	for _, cd := range cands {
		if c.total <= c.quota {
			return
		}
		_ = c.removeLocked(cd.hex, c.entries[cd.hex])
	}
}

// touch records a use in the file's mtime so LRU order survives restarts.
// It is best effort: a failure only makes the blob look older.
func (c *Cache) touch(hexDigest string) {
	c.mu.Lock()
	e := c.entries[hexDigest]
	if e == nil {
		c.mu.Unlock()
		return
	}
	t, path := e.lastUse, c.path(hexDigest)
	if e.zhex != "" {
		path = c.zpath(hexDigest, e.zhex)
	}
	c.mu.Unlock()
	_ = os.Chtimes(path, t, t)
}
