package flatten

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// typeRegA is the pre-POSIX regular-file typeflag; archive/tar normally
// turns it into TypeReg (or TypeDir for names ending in "/") already.
const typeRegA = '\x00'

// Whiteout names, as in the OCI image-spec layer format.
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// ApplyLayer applies one uncompressed tar layer on top of the tree. layer is
// the layer's index, used in errors. Regular-file data streams from r into
// the DataStore. r is read to its end, so a digest-verifying reader sees all
// of it. On error the tree is left half-applied and must be discarded.
func (t *Tree) ApplyLayer(ctx context.Context, layer int, r io.Reader) error {
	t.touched = make(map[edge]struct{})
	defer func() { t.touched = nil }()
	tr := tar.NewReader(r)
	last := ""
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("apply layer %d: %w", layer, err)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if last != "" {
				return fmt.Errorf("apply layer %d: read tar after entry %s: %w", layer, safetext.Name(last), err)
			}
			return fmt.Errorf("apply layer %d: read tar: %w", layer, err)
		}
		last = hdr.Name
		if err := t.applyEntry(ctx, layer, tr, hdr); err != nil {
			return err
		}
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("apply layer %d: read past end of tar: %w", layer, err)
	}
	return nil
}

// applyEntry applies one tar entry.
func (t *Tree) applyEntry(ctx context.Context, layer int, tr io.Reader, hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // PAX global records carry nothing we apply
	}
	e := entry{layer: layer, hdr: hdr}
	comps, skip, err := e.path()
	if skip || err != nil {
		return err
	}
	t.entries++
	if max := t.opts.Limits.MaxEntries; max > 0 && t.entries > max {
		return e.fail("limit reached", &LimitError{Limit: LimitEntries, Max: max, What: fmt.Sprintf("the image's %d entries", t.entries)})
	}
	if len(comps) == 0 {
		return t.applyRoot(e)
	}
	parentComps, base := comps[:len(comps)-1], comps[len(comps)-1]
	if strings.HasPrefix(base, whiteoutPrefix) {
		return t.applyWhiteout(e, parentComps, base)
	}
	dir, err := t.walkCreate(parentComps)
	var limit *LimitError
	switch {
	case errors.As(err, &limit):
		return e.fail("limit reached", err)
	case errors.Is(err, ErrSymlink):
		return e.fail("writing below a symlinked directory", nil)
	case err != nil:
		return e.fail("parent is not a directory", nil)
	}
	if hdr.Typeflag == tar.TypeLink {
		return t.applyHardlink(e, dir, base)
	}
	return t.applyInode(ctx, e, tr, dir, base)
}

// entry is the tar entry being applied and its layer, which its errors
// name.
type entry struct {
	layer int
	hdr   *tar.Header
}

// fail refuses the entry for reason, with the error behind it if any.
func (e entry) fail(reason string, err error) error {
	return &EntryError{Layer: e.layer, Name: e.hdr.Name, Reason: reason, Err: err}
}

// path checks the entry's name and returns its components, none for the
// root; skip says the entry is AUFS metadata, never content.
func (e entry) path() (comps []string, skip bool, err error) {
	name := e.hdr.Name
	if len(name) > MaxPathLen {
		return nil, false, e.fail(fmt.Sprintf("name longer than %d bytes", MaxPathLen), nil)
	}
	if strings.HasPrefix(name, "/") {
		return nil, false, e.fail("absolute path", nil)
	}
	comps, err = cleanRelative(name)
	if err != nil {
		return nil, false, e.fail("path escapes the root", nil)
	}
	if len(comps) > MaxDepth {
		return nil, false, e.fail(fmt.Sprintf("more than %d path components", MaxDepth), nil)
	}
	for i, c := range comps {
		if len(c) > maxNameLen {
			return nil, false, e.fail(fmt.Sprintf("name component longer than %d bytes", maxNameLen), nil)
		}
		if strings.HasPrefix(c, whiteoutMeta) && !(i == len(comps)-1 && c == whiteoutOpaque) {
			return nil, true, nil // AUFS metadata (.wh..wh.plnk, .wh..wh.aufs...), never content
		}
		if i < len(comps)-1 && strings.HasPrefix(c, whiteoutPrefix) {
			return nil, false, e.fail("whiteout name used as a directory", nil)
		}
	}
	return comps, false, nil
}

// applyRoot applies an entry naming the root directory: its metadata only.
func (t *Tree) applyRoot(e entry) error {
	if e.hdr.Typeflag != tar.TypeDir {
		return e.fail("entry would replace the root directory with a non-directory", nil)
	}
	meta, err := metadata(e.hdr)
	if err != nil {
		return e.fail(err.Error(), nil)
	}
	setMeta(t.root, meta)
	return nil
}

// applyWhiteout applies the whiteout base found in the directory parent
// names: the entry it names goes, or with the opaque marker every entry
// of the directory, except what this layer wrote (remove).
func (t *Tree) applyWhiteout(e entry, parentComps []string, base string) error {
	t.whiteouts++
	dir, err := t.walkExisting(parentComps)
	if err != nil {
		return e.fail("whiteout below a symlinked directory", nil)
	}
	if dir == nil {
		return nil // nothing to remove
	}
	if base == whiteoutOpaque {
		for name := range dir.Children {
			t.remove(dir, name)
		}
		return nil
	}
	target := base[len(whiteoutPrefix):]
	if target == "" || target == "." || target == ".." {
		return e.fail("invalid whiteout name", nil)
	}
	t.remove(dir, target)
	return nil
}

// applyHardlink makes dir/base one more link to the inode the entry's link
// target names.
func (t *Tree) applyHardlink(e entry, dir *ext4.Node, base string) error {
	if len(e.hdr.Linkname) > MaxPathLen {
		return e.fail(fmt.Sprintf("hard link target longer than %d bytes", MaxPathLen), nil)
	}
	target, reason := t.hardlinkTarget(e.hdr.Linkname)
	if target == nil {
		return e.fail(reason, nil)
	}
	if dir.Children[base] != target {
		if err := t.charge(linkMemory + int64(len(base))); err != nil {
			return e.fail("limit reached", err)
		}
		t.link(target)
	}
	t.put(dir, base, target)
	return nil
}

// applyInode puts the entry's new inode at dir/base, a regular file's
// content read from tr; a directory entry over a directory only gives it
// the entry's metadata.
func (t *Tree) applyInode(ctx context.Context, e entry, tr io.Reader, dir *ext4.Node, base string) error {
	meta, err := metadata(e.hdr)
	if err != nil {
		return e.fail(err.Error(), nil)
	}
	if e.hdr.Typeflag == tar.TypeDir {
		if old := dir.Children[base]; old != nil && isDir(old) {
			before := nodeCost(base, old)
			setMeta(old, meta)
			t.touch(dir, base)
			if err := t.charge(nodeCost(base, old) - before); err != nil {
				return e.fail("limit reached", err)
			}
			return nil
		}
	}
	n, err := t.newInode(ctx, e, tr)
	if err != nil {
		return err
	}
	setMeta(n, meta)
	if err := t.charge(nodeCost(base, n)); err != nil {
		if isRegular(n) {
			t.store.Release(n.Data)
		}
		return e.fail("limit reached", err)
	}
	t.put(dir, base, n)
	return nil
}

// newInode makes the inode of the entry's type, without its metadata; a
// regular file's content streams from tr into the store.
func (t *Tree) newInode(ctx context.Context, e entry, tr io.Reader) (*ext4.Node, error) {
	hdr := e.hdr
	switch hdr.Typeflag {
	case tar.TypeDir:
		return &ext4.Node{Mode: ext4.ModeDir, Children: make(map[string]*ext4.Node)}, nil
	case tar.TypeReg, typeRegA, tar.TypeGNUSparse:
		data, err := t.store.WriteData(ctx, tr, hdr.Size)
		if err != nil {
			return nil, e.fail("write data", err)
		}
		return &ext4.Node{Mode: ext4.ModeRegular, Size: hdr.Size, Data: data}, nil
	case tar.TypeSymlink:
		if hdr.Linkname == "" {
			return nil, e.fail("empty symlink target", nil)
		}
		if len(hdr.Linkname) > maxLinkTarget {
			return nil, e.fail(fmt.Sprintf("symlink target longer than %d bytes", maxLinkTarget), nil)
		}
		return ext4.NewSymlink([]byte(hdr.Linkname)), nil
	case tar.TypeChar, tar.TypeBlock:
		if hdr.Devmajor < 0 || hdr.Devmajor > math.MaxUint32 || hdr.Devminor < 0 || hdr.Devminor > math.MaxUint32 {
			return nil, e.fail("device number out of range", nil)
		}
		mode := uint32(ext4.ModeChar)
		if hdr.Typeflag == tar.TypeBlock {
			mode = ext4.ModeBlock
		}
		return ext4.NewDevice(mode, uint32(hdr.Devmajor), uint32(hdr.Devminor)), nil
	case tar.TypeFifo:
		return &ext4.Node{Mode: ext4.ModeFIFO}, nil
	default:
		return nil, e.fail(fmt.Sprintf("unsupported entry type %q", hdr.Typeflag), nil)
	}
}

// walkCreate returns the directory named by comps, creating missing ones
// (0755, root:root, Options.RootTime) and marking every entry on the way as
// written by this layer. It never follows a symlink: one on the way is
// ErrSymlink, any other non-directory ErrNotDir.
func (t *Tree) walkCreate(comps []string) (*ext4.Node, error) {
	dir := t.root
	for _, c := range comps {
		child := dir.Children[c]
		switch {
		case child == nil:
			child = newDirNode(0o755, 0, 0, t.opts.RootTime)
			if err := t.charge(nodeCost(c, child)); err != nil {
				return nil, err
			}
			dir.Children[keyName(c)] = child
		case isSymlink(child):
			return nil, ErrSymlink
		case !isDir(child):
			return nil, ErrNotDir
		}
		t.touch(dir, c)
		dir = child
	}
	return dir, nil
}

// walkExisting returns the directory named by comps, or nil if some
// component is missing or not a directory. A symlink on the way is
// ErrSymlink.
func (t *Tree) walkExisting(comps []string) (*ext4.Node, error) {
	dir := t.root
	for _, c := range comps {
		child := dir.Children[c]
		switch {
		case child == nil:
			return nil, nil
		case isSymlink(child):
			return nil, ErrSymlink
		case !isDir(child):
			return nil, nil
		}
		dir = child
	}
	return dir, nil
}

// hardlinkTarget finds the inode a hard link names. Like containerd and
// umoci, a leading "/" is relative to the root. It returns nil and a reason
// when the target is unusable.
func (t *Tree) hardlinkTarget(name string) (*ext4.Node, string) {
	rel := strings.TrimLeft(name, "/")
	if rel == "" {
		return nil, "empty hard link target"
	}
	comps, err := cleanRelative(rel)
	if err != nil {
		return nil, fmt.Sprintf("hard link target %s escapes the root", safetext.Name(name))
	}
	if len(comps) == 0 {
		return nil, "hard link to a directory"
	}
	dir, err := t.walkExisting(comps[:len(comps)-1])
	if err != nil {
		return nil, fmt.Sprintf("hard link target %s is below a symlinked directory", safetext.Name(name))
	}
	var n *ext4.Node
	if dir != nil {
		n = dir.Children[comps[len(comps)-1]]
	}
	switch {
	case n == nil:
		return nil, fmt.Sprintf("hard link target %s not found", safetext.Name(name))
	case isDir(n):
		return nil, fmt.Sprintf("hard link target %s is a directory", safetext.Name(name))
	}
	return n, ""
}

// remove applies a whiteout to dir/name: entries written by the layer being
// applied survive (a directory keeps those of its descendants); everything
// else goes.
func (t *Tree) remove(dir *ext4.Node, name string) {
	c := dir.Children[name]
	if c == nil {
		return
	}
	if _, ok := t.touched[edge{dir, name}]; !ok {
		t.unlink(dir, name)
		return
	}
	if isDir(c) {
		for n := range c.Children {
			t.remove(c, n)
		}
	}
}

// meta is the inode metadata a tar header carries.
type meta struct {
	perm                uint32
	uid, gid            uint32
	atime, mtime, ctime time.Time
	xattrs              []ext4.Xattr
}

// metadata extracts the inode metadata of hdr.
func metadata(hdr *tar.Header) (meta, error) {
	if hdr.Uid < 0 || int64(hdr.Uid) > math.MaxUint32 || hdr.Gid < 0 || int64(hdr.Gid) > math.MaxUint32 {
		return meta{}, errors.New("uid or gid out of range")
	}
	xs, err := paxXattrs(hdr.PAXRecords)
	if err != nil {
		return meta{}, err
	}
	if err := ext4.CheckXattrs(xs); err != nil {
		return meta{}, err
	}
	m := meta{
		perm:   uint32(hdr.Mode) & 0o7777,
		uid:    uint32(hdr.Uid),
		gid:    uint32(hdr.Gid),
		mtime:  hdr.ModTime,
		atime:  hdr.AccessTime,
		ctime:  hdr.ChangeTime,
		xattrs: xs,
	}
	if m.atime.IsZero() {
		m.atime = m.mtime
	}
	if m.ctime.IsZero() {
		m.ctime = m.mtime
	}
	return m, nil
}

// setMeta applies m to n, keeping n's type bits. A symlink's permissions
// are always 0777, as on any Linux filesystem a real unpack writes to.
func setMeta(n *ext4.Node, m meta) {
	n.Mode = n.Mode&ext4.ModeTypeMask | m.perm
	if isSymlink(n) {
		n.Mode = ext4.ModeSymlink | 0o777
	}
	n.UID, n.GID = m.uid, m.gid
	n.Atime, n.Mtime, n.Ctime, n.Crtime = ext4.Nanos(m.atime), ext4.Nanos(m.mtime), ext4.Nanos(m.ctime), ext4.Nanos(m.mtime)
	n.SetXattrs(m.xattrs)
}
