package flatten

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// MaxSymlinkHops bounds the symlinks Resolve follows, as Linux's MAXSYMLINKS.
const MaxSymlinkHops = 40

// maxNameLen is the longest directory entry name ext4 stores.
const maxNameLen = 255

// maxLinkTarget is the longest symlink target Linux accepts (PATH_MAX - 1).
const maxLinkTarget = 4095

// DataStore is what the tree needs from the image writer: ext4.Writer
// satisfies it.
type DataStore interface {
	// WriteData stores size bytes read from r and returns their placement.
	WriteData(ctx context.Context, r io.Reader, size int64) (ext4.Data, error)
	// Release frees content no path refers to any more.
	Release(d ext4.Data)
	// OpenData reads back content stored earlier.
	OpenData(d ext4.Data, size int64) io.Reader
}

var _ DataStore = (*ext4.Writer)(nil)

// Options configure a Tree.
type Options struct {
	// RootTime stamps the root directory and directories created only
	// because an entry below them needed a parent.
	RootTime time.Time
	// Limits bound what layers may make the tree hold.
	Limits Limits
	// Grow, when set, is called with Memory each time the estimate has
	// grown by another GrowStep since the last call, on the goroutine
	// changing the tree.
	Grow func(memory int64)
}

// GrowStep is how much the memory estimate grows between two calls of
// Options.Grow.
const GrowStep = 8 << 20

// Tree is the flattened filesystem: a tree of ext4 inodes built layer by
// layer. Regular-file content lives in the DataStore.
type Tree struct {
	store DataStore
	opts  Options
	root  *ext4.Node
	// extra counts the links of a non-directory inode beyond its first
	// one; inodes with a single link are absent.
	extra map[*ext4.Node]uint32
	// touched holds the directory entries written by the layer being
	// applied (and their ancestors): whiteouts and opaque markers spare
	// them. It is nil between layers.
	touched map[edge]struct{}
	// entries and whiteouts count the tar entries and whiteout markers
	// applied: entries for Limits.MaxEntries, both for the tests' Stats.
	entries   int64
	whiteouts int64
	// memory is the estimated memory of the content, for Limits.MaxMemory;
	// grown is its value at the last call of Options.Grow.
	memory, grown int64
}

// edge names one directory entry.
type edge struct {
	dir  *ext4.Node
	name string
}

// New returns a Tree holding only a root directory (0755, root:root)
// whose file data goes to store.
func New(store DataStore, opts Options) *Tree {
	return &Tree{
		store: store,
		opts:  opts,
		root:  newDirNode(0o755, 0, 0, opts.RootTime),
		extra: make(map[*ext4.Node]uint32),
	}
}

// Root returns the root directory, to hand to ext4.Writer.Finish.
func (t *Tree) Root() *ext4.Node { return t.root }

// Lookup returns the inode at path (relative to the root; a leading "/" or
// "./" is ignored) without following any symlink: a symlink as a non-final
// component is an error wrapping ErrSymlink.
func (t *Tree) Lookup(p string) (*ext4.Node, error) {
	comps := splitPath(p)
	n := t.root
	for i, c := range comps {
		switch {
		case isSymlink(n):
			return nil, fmt.Errorf("lookup %s: %s: %w", safetext.Name(p), safetext.Name(strings.Join(comps[:i], "/")), ErrSymlink)
		case !isDir(n):
			return nil, fmt.Errorf("lookup %s: %s: %w", safetext.Name(p), safetext.Name(strings.Join(comps[:i], "/")), ErrNotDir)
		}
		n = n.Children[c]
		if n == nil {
			return nil, fmt.Errorf("lookup %s: %w", safetext.Name(p), fs.ErrNotExist)
		}
	}
	return n, nil
}

// Resolve returns the inode at path following every symlink, the last
// component's included, as the guest would see it, but clamped inside the
// root: absolute targets start at the root and ".." stops there. It also
// returns the resolved path ("." for the root). When only the last
// component is missing, the error wraps fs.ErrNotExist and the returned path
// is where it would be.
func (t *Tree) Resolve(p string) (*ext4.Node, string, error) {
	r, err := t.resolve(p, false, time.Time{})
	if err != nil {
		return nil, r.path(), fmt.Errorf("resolve %s: %w", safetext.Name(p), err)
	}
	return r.node(), r.path(), nil
}

// comp is one path component still to walk; fromLink marks components that
// come from a symlink's target.
type comp struct {
	name     string
	fromLink bool
}

// walker is the state of a symlink-following path walk.
type walker struct {
	nodes []*ext4.Node // nodes[0] is the root
	names []string     // names[i] leads from nodes[i] to nodes[i+1]
	last  string       // the missing last component, if any
	hops  int          // the symlinks followed
}

func (w *walker) node() *ext4.Node { return w.nodes[len(w.nodes)-1] }

func (w *walker) path() string {
	names := w.names
	if w.last != "" {
		names = append(names[:len(names):len(names)], w.last)
	}
	if len(names) == 0 {
		return "."
	}
	return strings.Join(names, "/")
}

// resolve walks p following symlinks inside the root. With mkdir set,
// missing directories named by p itself (not by a symlink's target) are
// created with mode 0755, owner root and times mtime; the last component
// is then treated as a directory too.
func (t *Tree) resolve(p string, mkdir bool, mtime time.Time) (*walker, error) {
	w := &walker{nodes: []*ext4.Node{t.root}}
	var todo []comp
	for _, c := range strings.Split(p, "/") {
		todo = append(todo, comp{name: c})
	}
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c.name {
		case "", ".":
			continue
		case "..":
			if len(w.names) > 0 {
				w.nodes = w.nodes[:len(w.nodes)-1]
				w.names = w.names[:len(w.names)-1]
			}
			continue
		}
		dir := w.node()
		if !isDir(dir) {
			return w, fmt.Errorf("%s: %w", w.path(), ErrNotDir)
		}
		child := dir.Children[c.name]
		if child == nil {
			if mkdir && !c.fromLink {
				child = newDirNode(0o755, 0, 0, mtime)
				if dir.Children == nil {
					dir.Children = make(map[string]*ext4.Node)
				}
				dir.Children[keyName(c.name)] = child
			} else {
				if len(todo) == 0 || onlyDots(todo) {
					w.last = c.name
				}
				return w, fs.ErrNotExist
			}
		}
		if isSymlink(child) {
			var err error
			if todo, err = w.follow(child, c.name, todo); err != nil {
				return w, err
			}
			continue
		}
		w.nodes = append(w.nodes, child)
		w.names = append(w.names, c.name)
	}
	if mkdir && !isDir(w.node()) {
		return w, fmt.Errorf("%s: %w", w.path(), ErrNotDir)
	}
	return w, nil
}

// follow puts the target of link, the symlink name in the current
// directory, before the components todo still has to walk; an absolute
// target starts again at the root.
func (w *walker) follow(link *ext4.Node, name string, todo []comp) ([]comp, error) {
	w.hops++
	if w.hops > MaxSymlinkHops {
		return nil, ErrLoop
	}
	target := string(link.LinkTarget())
	if target == "" {
		return nil, fmt.Errorf("%s/%s: empty symlink: %w", w.path(), name, fs.ErrNotExist)
	}
	if strings.HasPrefix(target, "/") {
		w.nodes = w.nodes[:1]
		w.names = w.names[:0]
	}
	var expanded []comp
	for _, tc := range strings.Split(target, "/") {
		expanded = append(expanded, comp{name: tc, fromLink: true})
	}
	return append(expanded, todo...), nil
}

// onlyDots reports whether the remaining components are all "" or ".".
func onlyDots(cs []comp) bool {
	for _, c := range cs {
		if c.name != "" && c.name != "." {
			return false
		}
	}
	return true
}

// splitPath turns a path relative to the root (a leading "/" or "./" is
// ignored) into its cleaned components; the root has none.
func splitPath(p string) []string {
	p = path.Clean("/" + p)
	if p == "/" {
		return nil
	}
	return strings.Split(p[1:], "/")
}

// cleanRelative cleans a name that must be relative and stay inside the
// root; "." (or "") names the root and yields no components.
func cleanRelative(name string) ([]string, error) {
	c := path.Clean(name)
	if c == "." {
		return nil, nil
	}
	if c == ".." || strings.HasPrefix(c, "../") {
		return nil, ErrEscape
	}
	return strings.Split(c, "/"), nil
}

// keyName copies a name about to become a directory entry: names are cut
// from the tar header's full path, which the tree would otherwise keep
// alive for every entry.
func keyName(name string) string { return strings.Clone(name) }

func newDirNode(perm, uid, gid uint32, t time.Time) *ext4.Node {
	return &ext4.Node{
		Mode:     ext4.ModeDir | perm,
		UID:      uid,
		GID:      gid,
		Atime:    ext4.Nanos(t),
		Mtime:    ext4.Nanos(t),
		Ctime:    ext4.Nanos(t),
		Crtime:   ext4.Nanos(t),
		Children: make(map[string]*ext4.Node),
	}
}

func isDir(n *ext4.Node) bool     { return n.Mode&ext4.ModeTypeMask == ext4.ModeDir }
func isSymlink(n *ext4.Node) bool { return n.Mode&ext4.ModeTypeMask == ext4.ModeSymlink }
func isRegular(n *ext4.Node) bool { return n.Mode&ext4.ModeTypeMask == ext4.ModeRegular }

// put makes dir/name refer to n, dropping what was there.
func (t *Tree) put(dir *ext4.Node, name string, n *ext4.Node) {
	old, exists := dir.Children[name]
	if old != nil && old != n {
		t.drop(name, old)
	}
	if dir.Children == nil {
		dir.Children = make(map[string]*ext4.Node)
	}
	if !exists {
		name = keyName(name)
	}
	dir.Children[name] = n
	t.touch(dir, name)
}

// unlink removes dir/name, releasing data no other link refers to.
func (t *Tree) unlink(dir *ext4.Node, name string) {
	if old := dir.Children[name]; old != nil {
		delete(dir.Children, name)
		t.drop(name, old)
	}
}

// drop forgets one link, named name, to n; the last link of a regular file
// releases its data, and a directory drops its whole subtree.
func (t *Tree) drop(name string, n *ext4.Node) {
	if isDir(n) {
		for cname, c := range n.Children {
			t.drop(cname, c)
		}
		t.refund(nodeCost(name, n))
		return
	}
	if c := t.extra[n]; c > 0 {
		t.refund(linkMemory + int64(len(name)))
		if c == 1 {
			delete(t.extra, n)
		} else {
			t.extra[n] = c - 1
		}
		return
	}
	t.refund(nodeCost(name, n))
	if isRegular(n) {
		t.store.Release(n.Data)
		n.Data = ext4.Data{}
	}
}

// link adds one more link to a non-directory inode.
func (t *Tree) link(n *ext4.Node) { t.extra[n]++ }

func (t *Tree) touch(dir *ext4.Node, name string) {
	if t.touched != nil {
		t.touched[edge{dir, name}] = struct{}{}
	}
}
