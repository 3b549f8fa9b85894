package flatten

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
)

// FileAttr is the metadata WriteFile gives a new regular file.
type FileAttr struct {
	// Mode holds the permission bits, setuid, setgid and sticky included.
	Mode     uint32
	UID, GID uint32
	// Mtime stamps the file (all its times) and any directory WriteFile
	// creates; the zero time means Options.RootTime.
	Mtime  time.Time
	Xattrs []ext4.Xattr
}

// WriteFile stores size bytes from r as a regular file at p. Directories
// on the way are followed through symlinks inside the root, as the guest
// would, and created (0755, root:root) when missing. A non-directory
// already at p, a symlink included, is replaced; a directory is an error
// wrapping ErrIsDir.
func (t *Tree) WriteFile(ctx context.Context, p string, r io.Reader, size int64, attr FileAttr) error {
	comps := splitPath(p)
	if len(comps) == 0 {
		return fmt.Errorf("write file %q: %w", p, ErrIsDir)
	}
	for _, c := range comps {
		if len(c) > maxNameLen {
			return fmt.Errorf("write file %q: name component longer than %d bytes", p, maxNameLen)
		}
	}
	mtime := attr.Mtime
	if mtime.IsZero() {
		mtime = t.opts.RootTime
	}
	w, err := t.resolve(strings.Join(comps[:len(comps)-1], "/"), true, mtime)
	if err != nil {
		return fmt.Errorf("write file %q: parent: %w", p, err)
	}
	dir, base := w.node(), comps[len(comps)-1]
	if old := dir.Children[base]; old != nil && isDir(old) {
		return fmt.Errorf("write file %q: %w", p, ErrIsDir)
	}
	data, err := t.store.WriteData(ctx, r, size)
	if err != nil {
		return fmt.Errorf("write file %q: %w", p, err)
	}
	n := &ext4.Node{Mode: ext4.ModeRegular, Size: size, Data: data}
	setMeta(n, meta{perm: attr.Mode & 0o7777, uid: attr.UID, gid: attr.GID,
		atime: mtime, mtime: mtime, ctime: mtime, xattrs: attr.Xattrs})
	t.put(dir, base, n)
	return nil
}

// ReadFile returns the content of the regular file at p, following
// symlinks inside the root like Resolve. It holds the whole file in memory:
// use it for small files; one larger than MaxReadFile is ErrTooLarge.
func (t *Tree) ReadFile(p string) ([]byte, error) {
	n, _, err := t.Resolve(p)
	if err != nil {
		return nil, fmt.Errorf("read file: %w", err)
	}
	if !isRegular(n) {
		return nil, fmt.Errorf("read file %q: not a regular file", p)
	}
	if n.Size > MaxReadFile {
		return nil, fmt.Errorf("read file %q: %w: %d bytes, over the %d-byte limit for files read whole", p, ErrTooLarge, n.Size, MaxReadFile)
	}
	var buf bytes.Buffer
	buf.Grow(int(min(n.Size, 1<<20)))
	if _, err := io.Copy(&buf, io.LimitReader(t.store.OpenData(n.Data, n.Size), n.Size)); err != nil {
		return nil, fmt.Errorf("read file %q: %w", p, err)
	}
	if int64(buf.Len()) != n.Size {
		return nil, fmt.Errorf("read file %q: got %d bytes, want %d", p, buf.Len(), n.Size)
	}
	return buf.Bytes(), nil
}

// ReadHead returns up to n bytes from the start of the regular file at p,
// following symlinks inside the root like Resolve. The content is read
// back from the DataStore (the image being written), so only the head is
// ever held: enough to read a file's format, whatever its size.
func (t *Tree) ReadHead(p string, n int) ([]byte, error) {
	node, _, err := t.Resolve(p)
	if err != nil {
		return nil, fmt.Errorf("read head: %w", err)
	}
	if !isRegular(node) {
		return nil, fmt.Errorf("read head of %q: not a regular file", p)
	}
	want := min(int64(max(n, 0)), node.Size)
	buf := make([]byte, want)
	got, err := io.ReadFull(t.store.OpenData(node.Data, node.Size), buf)
	if err != nil {
		return nil, fmt.Errorf("read head of %q: got %d of %d bytes: %w", p, got, want, err)
	}
	return buf, nil
}
