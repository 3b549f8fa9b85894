package blobstore

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SidecarSuffix names the file beside each fs object that records its
// sha256, in sha256sum's format ("<hex>  <name>\n"), so `sha256sum -c
// <key>.sha256` run in the object's directory verifies it.
const SidecarSuffix = ".sha256"

// tmpInfix marks temporary files: ".<base>.tmp-<random>" beside the target.
const tmpInfix = ".tmp-"

// FS stores objects as files under a root directory: key "a/b.ext4" is
// <root>/a/b.ext4, its sha256 in <root>/a/b.ext4.sha256. Writes go to a
// temporary name beside the target, are fsynced and renamed into place, and
// the directory is fsynced. The root is trusted: keys are checked lexically
// (no "..", no absolute keys), symlinks inside the root are followed.
type FS struct {
	root string
}

var _ Store = (*FS)(nil)

// NewFS returns an fs backend rooted at root (absolute), creating it.
func NewFS(root string) (*FS, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("fs blob store: root %q is not an absolute path", root)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		// MkdirAll's error names the ancestor it tripped on, which may be
		// far from the root the operator configured: name the root too.
		return nil, fmt.Errorf("fs blob store: create root %s: %w", root, err)
	}
	return &FS{root: filepath.Clean(root)}, nil
}

// Backend returns BackendFS.
func (f *FS) Backend() string { return BackendFS }

// Abilities implements Store: files are linked in, nothing is presigned,
// and the fs store is the only durable copy (no fallback).
func (f *FS) Abilities() Abilities { return Abilities{LinkFiles: true} }

// Root returns the root directory.
func (f *FS) Root() string { return f.root }

// Path returns the file that holds key, checking the key.
func (f *FS) Path(key string) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	base := path.Base(key)
	if strings.HasPrefix(base, ".") || strings.HasSuffix(base, SidecarSuffix) {
		// Dot names are our temporary files, .sha256 names our sidecars.
		return "", fmt.Errorf("%w %q: fs keys must not start with a dot or end in %s", ErrInvalidKey, key, SidecarSuffix)
	}
	p := filepath.Join(f.root, filepath.FromSlash(key))
	if rel, err := filepath.Rel(f.root, p); err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%w %q: outside the root", ErrInvalidKey, key)
	}
	return p, nil
}

func (f *FS) fail(op, key string, err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	e := &Error{Backend: BackendFS, Op: op, Key: key, Detail: err.Error(), cause: err}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		e.Kind = ErrNotFound
	case errors.Is(err, fs.ErrPermission):
		e.Kind = ErrAccessDenied
	}
	return e
}

// Put copies r to a temporary file beside the target, verifies size and
// sha256, fsyncs, writes the sidecar, renames both into place and fsyncs
// the directory.
func (f *FS) Put(ctx context.Context, key string, r io.Reader, size int64, sha256hex string) error {
	if err := checkPut(key, size, sha256hex); err != nil {
		return f.fail("put", key, err)
	}
	target, err := f.Path(key)
	if err != nil {
		return f.fail("put", key, err)
	}
	return f.fail("put", key, f.put(ctx, target, r, size, sha256hex))
}

func (f *FS) put(ctx context.Context, target string, r io.Reader, size int64, sha256hex string) error {
	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(target)+tmpInfix+"*")
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	defer tmp.Close()
	v := newVerifier(&ctxReader{ctx: ctx, r: r}, size, sha256hex)
	if _, err := io.CopyN(tmp, v, size); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: source ended after %d of %d bytes", ErrSizeMismatch, v.n, size)
		}
		return fmt.Errorf("copy: %w", err)
	}
	if err := v.finish(); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return f.publish(tmp.Name(), target, sha256hex)
}

// publish writes the sidecar, then renames tmp to target and fsyncs the
// directory. The sidecar goes first so that a published object always has
// one; a crash in between leaves a sidecar without object, which Stat
// ignores and the next Put replaces.
func (f *FS) publish(tmp, target, sha256hex string) error {
	if err := writeSidecar(target, sha256hex); err != nil {
		return err
	}
	if err := os.Rename(tmp, target); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	return fsyncDir(filepath.Dir(target))
}

// writeSidecar writes <target>.sha256 atomically (temporary file, fsync,
// rename); the caller fsyncs the directory.
func writeSidecar(target, sha256hex string) error {
	dir, base := filepath.Split(target)
	tmp, err := os.CreateTemp(dir, "."+base+SidecarSuffix+tmpInfix+"*")
	if err != nil {
		return fmt.Errorf("create sha256 sidecar: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := fmt.Fprintf(tmp, "%s  %s\n", strings.ToLower(sha256hex), base); err != nil {
		return fmt.Errorf("write sha256 sidecar: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fsync sha256 sidecar: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close sha256 sidecar: %w", err)
	}
	if err := os.Rename(tmp.Name(), target+SidecarSuffix); err != nil {
		return fmt.Errorf("publish sha256 sidecar: %w", err)
	}
	return nil
}

// readSidecar returns the sha256 recorded beside target, "" when there is
// none.
func readSidecar(target string) (string, error) {
	file, err := os.Open(target + SidecarSuffix)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read sha256 sidecar: %w", err)
	}
	defer file.Close()
	line, err := bufio.NewReader(io.LimitReader(file, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read sha256 sidecar: %w", err)
	}
	sum, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	if checkPut("x", 0, sum) != nil {
		return "", fmt.Errorf("sha256 sidecar %s: %q is not a hex sha256", target+SidecarSuffix, sum)
	}
	return strings.ToLower(sum), nil
}

// PutFile hard-links path into the store when it is on the same filesystem
// (checking its size; the sha256 is the caller's), and copies it otherwise.
// The linked file shares its inode with path: callers must replace path by
// rename, never rewrite it in place.
func (f *FS) PutFile(ctx context.Context, key, src string, size int64, sha256hex string) error {
	if err := checkPut(key, size, sha256hex); err != nil {
		return f.fail("put", key, err)
	}
	target, err := f.Path(key)
	if err != nil {
		return f.fail("put", key, err)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return sourceFailed(BackendFS, key, err)
	}
	if !fi.Mode().IsRegular() {
		return f.fail("put", key, fmt.Errorf("%s is not a regular file", src))
	}
	if fi.Size() != size {
		return f.fail("put", key, fmt.Errorf("%w: %s has %d bytes, want %d", ErrSizeMismatch, src, fi.Size(), size))
	}
	linked, err := f.link(src, target, sha256hex)
	if err != nil || linked {
		return f.fail("put", key, err)
	}
	file, err := os.Open(src)
	if err != nil {
		return sourceFailed(BackendFS, key, err)
	}
	defer file.Close()
	return f.fail("put", key, f.put(ctx, target, file, size, sha256hex))
}

// link publishes src at target through a hard link; false (and no error)
// means the filesystem refused the link and the caller should copy.
func (f *FS) link(src, target, sha256hex string) (bool, error) {
	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("create directory: %w", err)
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(dir, "."+filepath.Base(target)+tmpInfix+hex.EncodeToString(rnd[:]))
	if err := os.Link(src, tmp); err != nil {
		if errors.Is(err, syscall.EXDEV) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EMLINK) ||
			errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EOPNOTSUPP) {
			return false, nil
		}
		return false, fmt.Errorf("link: %w", err)
	}
	// rename(2) of a link onto the same inode succeeds and leaves tmp.
	defer os.Remove(tmp)
	if err := fsyncFile(tmp); err != nil {
		return false, err
	}
	return true, f.publish(tmp, target, sha256hex)
}

// Stat returns the file's size and the sidecar's sha256.
func (f *FS) Stat(ctx context.Context, key string) (Info, error) {
	target, err := f.Path(key)
	if err != nil {
		return Info{}, f.fail("stat", key, err)
	}
	fi, err := os.Stat(target)
	if err != nil {
		return Info{}, f.fail("stat", key, err)
	}
	if !fi.Mode().IsRegular() {
		return Info{}, f.fail("stat", key, fmt.Errorf("%s is not a regular file", target))
	}
	sum, err := readSidecar(target)
	if err != nil {
		return Info{}, f.fail("stat", key, err)
	}
	return Info{Key: key, Size: fi.Size(), SHA256: sum, ModTime: fi.ModTime()}, nil
}

// Get reads a small object whole, checked against its sidecar.
func (f *FS) Get(ctx context.Context, key string, maxBytes int64) ([]byte, error) {
	target, err := f.Path(key)
	if err != nil {
		return nil, f.fail("get", key, err)
	}
	sum, err := readSidecar(target)
	if err != nil {
		return nil, f.fail("get", key, err)
	}
	file, err := os.Open(target)
	if err != nil {
		return nil, f.fail("get", key, err)
	}
	defer file.Close()
	data, err := getChecked(&ctxReader{ctx: ctx, r: file}, maxBytes, sum)
	if err != nil {
		return nil, f.fail("get", key, err)
	}
	return data, nil
}

// Delete removes the object, then its sidecar; missing files are success.
func (f *FS) Delete(ctx context.Context, key string) error {
	target, err := f.Path(key)
	if err != nil {
		return f.fail("delete", key, err)
	}
	for _, p := range []string{target, target + SidecarSuffix} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return f.fail("delete", key, err)
		}
	}
	if err := fsyncDir(filepath.Dir(target)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return f.fail("delete", key, err)
	}
	return nil
}

// PresignGet is not supported on fs.
func (f *FS) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error) {
	return "", &Error{Backend: BackendFS, Op: "presign", Key: key, Kind: ErrNotSupported}
}

// AbortIncomplete removes the temporary files interrupted Puts of key
// left beside it, when their inode last changed (written, or linked in)
// before startedBefore.
func (f *FS) AbortIncomplete(ctx context.Context, key string, startedBefore time.Time) error {
	target, err := f.Path(key)
	if err != nil {
		return f.fail("abort", key, err)
	}
	dir, base := filepath.Split(target)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return f.fail("abort", key, err)
	}
	for _, e := range entries {
		if !isTempOf(e.Name(), base) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return f.fail("abort", key, err)
		}
		// The change time, not the modification time: a hard link keeps
		// its source's mtime, but linking it in sets the ctime.
		if !time.Unix(st.Ctim.Unix()).Before(startedBefore) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return f.fail("abort", key, err)
		}
	}
	return nil
}

// isTempOf reports whether name is a temporary file of a Put to base: the
// object's (".<base>.tmp-<random>") or its sidecar's
// (".<base>.sha256.tmp-<random>"). The random part has no dot, which tells
// them from the temporary files of keys that extend base, such as
// "<base>.tmp-1": those are another Put's.
func isTempOf(name, base string) bool {
	for _, prefix := range []string{"." + base + tmpInfix, "." + base + SidecarSuffix + tmpInfix} {
		if random, ok := strings.CutPrefix(name, prefix); ok && random != "" && !strings.Contains(random, ".") {
			return true
		}
	}
	return false
}

// Check verifies the root is a directory this process can write to.
func (f *FS) Check(ctx context.Context) error {
	fi, err := os.Stat(f.root)
	if errors.Is(err, fs.ErrNotExist) {
		return &Error{Backend: BackendFS, Op: "check", Key: f.root, Kind: ErrBucketMissing, Detail: "root directory is missing"}
	}
	if err != nil {
		return f.fail("check", f.root, err)
	}
	if !fi.IsDir() {
		return &Error{Backend: BackendFS, Op: "check", Key: f.root, Detail: "root is not a directory"}
	}
	tmp, err := os.CreateTemp(f.root, ".blobstore-check"+tmpInfix+"*")
	if err != nil {
		return f.fail("check", f.root, err)
	}
	tmp.Close()
	return f.fail("check", f.root, os.Remove(tmp.Name()))
}

// ctxReader ends a copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func fsyncFile(p string) error {
	file, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	defer file.Close()
	if err := file.Sync(); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	return nil
}

func fsyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory: %w", err)
	}
	return nil
}
