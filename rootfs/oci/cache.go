package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fsutil"
)

// tmpPrefix starts the name of every partial blob; New removes such files.
const tmpPrefix = ".tmp-"

// copyBufSize is the buffer each concurrent blob copy uses.
const copyBufSize = 1 << 20

// blobCache is the content-addressed store of compressed blobs in
// <CacheDir>/blobs/sha256. The files are the truth; the in-memory index
// mirrors them with pin counts, last use (persisted as the file mtime, so LRU
// order survives restarts) and whether the bytes were verified by this
// process.
type blobCache struct {
	dir   string
	quota int64
	bufs  sync.Pool

	mu      sync.Mutex
	entries map[string]*cacheEntry
	total   int64
	flights map[string]*flight
}

type cacheEntry struct {
	size     int64
	lastUse  time.Time
	pins     int
	verified bool
}

// flight is one in-progress verification or download of a blob; concurrent
// acquirers of the same blob wait for it instead of downloading again.
type flight struct {
	done    chan struct{}
	err     error
	source  string
	waiters int // acquirers waiting on it, guarded by blobCache.mu
}

// openBlobCache scans dir, removing partial blobs left by a crash, and loads
// the index from the files' sizes and mtimes.
func openBlobCache(dir string, quota int64) (*blobCache, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cache dir: %w", err)
	}
	c := &blobCache{
		dir:     dir,
		quota:   quota,
		entries: make(map[string]*cacheEntry),
		flights: make(map[string]*flight),
	}
	c.bufs.New = func() any { b := make([]byte, copyBufSize); return &b }
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read cache dir: %w", err)
	}
	for _, de := range des {
		n := de.Name()
		if strings.HasPrefix(n, tmpPrefix) {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("remove stale temp blob: %w", err)
			}
			continue
		}
		if !isHex64(n) || !de.Type().IsRegular() {
			continue
		}
		fi, err := de.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("stat cached blob: %w", err)
		}
		c.entries[n] = &cacheEntry{size: fi.Size(), lastUse: fi.ModTime()}
		c.total += fi.Size()
	}
	c.mu.Lock()
	c.evictLocked()
	c.mu.Unlock()
	return c, nil
}

func isHex64(s string) bool {
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

func (c *blobCache) path(hexDigest string) string { return filepath.Join(c.dir, hexDigest) }

// usage returns the bytes and number of blobs in the cache.
func (c *blobCache) usage() (int64, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, len(c.entries)
}

// acquire pins blob hexDigest of the given size, making sure it is present
// and verified: an unverified file is hashed once, a missing or corrupt one is
// obtained with download (which must commit it with write). Concurrent
// acquirers of one blob share a single verification or download. fromCache
// reports that no download by this call was needed. source names where
// download reads from: a waiter whose leader failed retries with its own
// download when the leader was cancelled or read from another source.
func (c *blobCache) acquire(ctx context.Context, hexDigest string, size int64, source string,
	download func(context.Context) error) (fromCache bool, err error) {
	retried := false
	for {
		c.mu.Lock()
		e := c.entries[hexDigest]
		if e != nil && e.verified {
			if e.size != size {
				c.mu.Unlock()
				return false, fmt.Errorf("%w: blob sha256:%s has %d bytes, the manifest says %d", ErrDigestMismatch, hexDigest, e.size, size)
			}
			e.pins++
			e.lastUse = time.Now()
			c.mu.Unlock()
			c.touch(hexDigest)
			return true, nil
		}
		if f := c.flights[hexDigest]; f != nil {
			f.waiters++
			c.mu.Unlock()
			var werr error
			select {
			case <-f.done:
			case <-ctx.Done():
				werr = ctx.Err()
			}
			c.mu.Lock()
			f.waiters--
			c.mu.Unlock()
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
				e = &cacheEntry{size: size}
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
		return fromCache, err
	}
}

// fill runs as the only worker on a blob: it verifies the file when one is
// indexed (dropping it if corrupt) and downloads it otherwise.
func (c *blobCache) fill(ctx context.Context, hexDigest string, size int64, indexed bool,
	download func(context.Context) error) (bool, error) {
	if indexed {
		ok, err := c.verifyFile(ctx, hexDigest, size)
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

// verifyFile reports whether the cached file has the expected size and
// digest.
func (c *blobCache) verifyFile(ctx context.Context, hexDigest string, size int64) (bool, error) {
	f, err := os.Open(c.path(hexDigest))
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

// drop deletes a corrupt blob and its index entry.
func (c *blobCache) drop(hexDigest string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := os.Remove(c.path(hexDigest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove corrupt cached blob: %w", err)
	}
	if e := c.entries[hexDigest]; e != nil {
		c.total -= e.size
		delete(c.entries, hexDigest)
	}
	return nil
}

// write streams r into the cache as blob hexDigest: into a temp file beside
// the final name, checking size and sha256 on the way, then fsync, rename and
// directory fsync. progress gets the number of bytes written so far. On any
// error the temp file is removed.
func (c *blobCache) write(ctx context.Context, hexDigest string, size int64, r io.Reader, progress func(written int64)) (err error) {
	tmp, err := os.CreateTemp(c.dir, tmpPrefix+hexDigest+"-*")
	if err != nil {
		return fmt.Errorf("create temp blob: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	bp := c.bufs.Get().(*[]byte)
	defer c.bufs.Put(bp)
	buf := *bp
	var written int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := r.Read(buf)
		if n > 0 {
			if written+int64(n) > size {
				return fmt.Errorf("%w: expected %d bytes, got more", ErrDigestMismatch, size)
			}
			if _, err := tmp.Write(buf[:n]); err != nil {
				return fmt.Errorf("write temp blob: %w", err)
			}
			h.Write(buf[:n])
			written += int64(n)
			if progress != nil {
				progress(written)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if written != size {
		return fmt.Errorf("%w: expected %d bytes, got %d", ErrDigestMismatch, size, written)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != hexDigest {
		return fmt.Errorf("%w: expected sha256:%s, got sha256:%s", ErrDigestMismatch, hexDigest, got)
	}
	// No fsync: the blob is verified (size and sha256) before its first use
	// after every start, so a blob a crash left torn is re-fetched, and
	// syncing here would hold a cold build up for the disk.
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close temp blob: %w", err)
	}
	if err := os.Rename(tmp.Name(), c.path(hexDigest)); err != nil {
		return fmt.Errorf("commit blob: %w", err)
	}
	return nil
}

// unpin releases one pin on each blob and evicts down to the quota.
func (c *blobCache) unpin(hexDigests []string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range hexDigests {
		if e := c.entries[d]; e != nil && e.pins > 0 {
			e.pins--
			e.lastUse = now
		}
	}
	c.evictLocked()
}

// evictLocked removes unpinned, idle blobs, least recently used first, until
// the total is within the quota. Pinned blobs and blobs being verified are
// never removed, so the total may stay above the quota while they are in use.
func (c *blobCache) evictLocked() {
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
		if err := os.Remove(c.path(cd.hex)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		c.total -= c.entries[cd.hex].size
		delete(c.entries, cd.hex)
	}
}

// touch records a use in the file's mtime so LRU order survives restarts.
// It is best effort: a failure only makes the blob look older.
func (c *blobCache) touch(hexDigest string) {
	now := time.Now()
	_ = os.Chtimes(c.path(hexDigest), now, now)
}
