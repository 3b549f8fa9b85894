package ext4

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
)

// Reserved inode numbers.
const (
	rootIno      = 2
	journalIno   = 8
	firstIno     = 11 // s_first_ino; lost+found gets it
	lostFound    = "lost+found"
	maxLinks     = 65000
	maxNameLen   = 255
	maxSymlink   = 4095
	fastSymlink  = 60 // targets shorter than this live in i_block
	lpfMinBlocks = 4  // lost+found is pre-sized like mke2fs does
)

// Directory entry file types.
const (
	ftRegular = 1
	ftDir     = 2
	ftChar    = 3
	ftBlock   = 4
	ftFIFO    = 5
	ftSocket  = 6
	ftSymlink = 7
)

type dirent struct {
	name  string
	ino   uint32
	ftype uint8
}

// inode is the planning record of one inode. It is kept small, as a tree
// of a million files has a million of them: what only directories, xattrs
// or large extent maps need lives in x, and i_block is rendered when the
// inode table is written.
type inode struct {
	node   *Node
	up     *inode // directory of the first link (nil for the root)
	name   string // name of the first link
	x      *inodeExtra
	blocks uint64 // 4 KiB blocks charged to the inode (i_blocks/8)
	ino    uint32
	links  uint32
	ftype  uint8
}

// inodeExtra holds the planning fields few inodes need.
type inodeExtra struct {
	parent uint32 // directories: inode of ".."

	children []dirent // directories: sorted entries without "." and "..", until rendered
	subdirs  uint32
	dirData  []byte // directories: every block's bytes
	htree    bool

	ibody  []byte // in-inode xattr area (after i_extra_isize), or nil
	xblock *xattrBlock

	// ext is the block map of inodes that are not regular files (those
	// use their Data's).
	ext []extent
	// tree holds the extent tree blocks outside the inode, and root its
	// top (i_block), when the block map does not fit in the inode.
	tree []treeBlock
	root [60]byte
}

// extra returns in.x, allocating it on first use.
func (in *inode) extra() *inodeExtra {
	if in.x == nil {
		in.x = new(inodeExtra)
	}
	return in.x
}

// xblock returns the inode's external xattr block, or nil.
func (in *inode) xblock() *xattrBlock {
	if in.x == nil {
		return nil
	}
	return in.x.xblock
}

// extents returns the inode's block map.
func (in *inode) extents() []extent {
	if in.ftype == ftRegular {
		return in.node.Data.extents
	}
	if in.x == nil {
		return nil
	}
	return in.x.ext
}

// inodeSlab is how many inode records are allocated at once.
const inodeSlab = 1024

// plan collects every inode of the tree in inode-number order.
type plan struct {
	ctx context.Context
	// owner is the Writer laying the tree out; file Data must be its own.
	owner  *Writer
	inodes []*inode // index ino-1; reserved slots are nil
	slab   []inode  // records handed out by newInode
	steps  int
}

// newInode returns a zero record from the current slab: one allocation
// per inodeSlab records instead of one each.
func (p *plan) newInode() *inode {
	if len(p.slab) == cap(p.slab) {
		p.slab = make([]inode, 0, inodeSlab)
	}
	p.slab = p.slab[:len(p.slab)+1]
	return &p.slab[len(p.slab)-1]
}

// path is the inode's first path, for messages.
func (in *inode) path() string {
	if in.up == nil {
		if in.ino == rootIno {
			return "/"
		}
		return in.name
	}
	return joinPath(in.up.path(), in.name)
}

func invalid(path, format string, args ...any) error {
	return fmt.Errorf("%q: %s: %w", path, fmt.Sprintf(format, args...), ErrInvalidNode)
}

func fileType(mode uint32) uint8 {
	switch mode & ModeTypeMask {
	case ModeRegular:
		return ftRegular
	case ModeDir:
		return ftDir
	case ModeChar:
		return ftChar
	case ModeBlock:
		return ftBlock
	case ModeFIFO:
		return ftFIFO
	case ModeSocket:
		return ftSocket
	case ModeSymlink:
		return ftSymlink
	}
	return 0
}

// checkName returns why name cannot be a directory entry, or "".
func checkName(name string) string {
	switch {
	case name == "":
		return "empty name"
	case name == "." || name == "..":
		return "reserved name"
	case len(name) > maxNameLen:
		return fmt.Sprintf("name is %d bytes, more than %d", len(name), maxNameLen)
	case strings.IndexByte(name, '/') >= 0:
		return "name contains '/'"
	case strings.IndexByte(name, 0) >= 0:
		return "name contains NUL"
	}
	return ""
}

func joinPath(parent, name string) string {
	if parent == "/" {
		return "/" + name
	}
	return parent + "/" + name
}

// buildPlan validates the tree and numbers its inodes: root 2, lost+found
// 11 (created when missing), then depth-first in byte-wise name order.
func buildPlan(ctx context.Context, root *Node, w *Writer) (*plan, error) {
	opts := &w.opts
	if root == nil {
		return nil, invalid("/", "nil root")
	}
	if root.Mode&ModeTypeMask != ModeDir {
		return nil, invalid("/", "root is not a directory (mode %#o)", root.Mode)
	}
	if err := checkNode(root, w); err != "" {
		return nil, invalid("/", "%s", err)
	}
	p := &plan{ctx: ctx, owner: w, inodes: make([]*inode, firstIno-1)}
	defer func() {
		// Node.planned is only valid while the tree is numbered.
		for _, in := range p.inodes {
			if in != nil {
				in.node.planned = 0
			}
		}
	}()
	ri := p.newInode()
	*ri = inode{node: root, ino: rootIno, ftype: ftDir, x: &inodeExtra{parent: rootIno}}
	p.inodes[rootIno-1] = ri
	root.planned = rootIno

	lpf := root.Children[lostFound]
	if lpf == nil {
		t := Nanos(opts.Time)
		lpf = &Node{Mode: ModeDir | 0o700, Atime: t, Mtime: t, Ctime: t, Crtime: t}
	}
	if lpf.Mode&ModeTypeMask == ModeDir {
		li := p.newInode()
		*li = inode{node: lpf, ino: firstIno, up: ri, name: lostFound, ftype: ftDir, x: &inodeExtra{parent: rootIno}}
		p.inodes = append(p.inodes, li)
		lpf.planned = firstIno
		if root.Children[lostFound] == nil {
			// Created here: linked from the root below.
			ri.x.children = append(ri.x.children, dirent{name: lostFound, ino: firstIno, ftype: ftDir})
			li.links = 1
			ri.x.subdirs++
		}
	} else {
		// A non-directory named lost+found: keep it, and leave inode 11
		// unused rather than renumber everything.
		p.inodes = append(p.inodes, nil)
	}
	if err := p.walk(ri); err != nil {
		return nil, err
	}
	slices.SortFunc(ri.x.children, func(a, b dirent) int { return strings.Compare(a.name, b.name) })
	// Link counts of directories.
	for _, in := range p.inodes {
		if in == nil {
			continue
		}
		if in.ftype == ftDir {
			in.links = 2 + in.x.subdirs
			if in.links > maxLinks {
				in.links = 1 // dir_nlink: "many"
			}
		} else if in.links > maxLinks {
			return nil, invalid(in.path(), "%d hard links, more than %d", in.links, maxLinks)
		}
	}
	return p, nil
}

func (p *plan) walk(dir *inode) error {
	n := dir.node
	names := make([]string, 0, len(n.Children))
	for name := range n.Children {
		names = append(names, name)
	}
	slices.Sort(names)
	dx := dir.x
	if dx.children == nil {
		dx.children = make([]dirent, 0, len(names))
	}
	var dpath string // computed on the first error only
	pathOf := func(name string) string {
		if dpath == "" {
			dpath = dir.path()
		}
		return joinPath(dpath, name)
	}
	for _, name := range names {
		if p.steps++; p.steps%checkEvery == 0 {
			if err := p.ctx.Err(); err != nil {
				return err
			}
		}
		if err := checkName(name); err != "" {
			return invalid(pathOf(name), "%s", err)
		}
		child := n.Children[name]
		if child == nil {
			return invalid(pathOf(name), "nil node")
		}
		var ci *inode
		if child.planned != 0 {
			ci = p.inodes[child.planned-1]
		}
		switch {
		case ci == nil:
			if err := checkNode(child, p.owner); err != "" {
				return invalid(pathOf(name), "%s", err)
			}
			ci = p.newInode()
			*ci = inode{node: child, ino: uint32(len(p.inodes) + 1), up: dir, name: name, ftype: fileType(child.Mode)}
			if ci.ftype == ftDir {
				ci.x = new(inodeExtra)
			}
			if uint64(ci.ino) >= 1<<32-1 {
				return invalid(pathOf(name), "too many inodes")
			}
			p.inodes = append(p.inodes, ci)
			child.planned = ci.ino
		case ci.ino == firstIno && ci.links == 0 && dir.ino == rootIno && name == lostFound:
			// The tree's own lost+found, numbered in advance.
			if err := checkNode(child, p.owner); err != "" {
				return invalid(pathOf(name), "%s", err)
			}
		case ci.ftype == ftDir:
			return invalid(pathOf(name), "hard link to directory %q", ci.path())
		}
		ci.links++
		dx.children = append(dx.children, dirent{name: name, ino: ci.ino, ftype: ci.ftype})
		if ci.ftype == ftDir && ci.links == 1 {
			ci.x.parent = dir.ino
			dx.subdirs++
			if err := p.walk(ci); err != nil {
				return err
			}
		}
	}
	if p.owner.opts.ConsumeTree {
		n.Children = nil // the entries live on in dx.children
	}
	return nil
}

// checkNode returns what is wrong with one node's own fields, or "", for a
// tree laid out by owner.
func checkNode(n *Node, owner *Writer) string {
	ft := fileType(n.Mode)
	if ft == 0 {
		return fmt.Sprintf("unknown file type in mode %#o", n.Mode)
	}
	if n.Mode&^(ModeTypeMask|0o7777) != 0 {
		return fmt.Sprintf("mode %#o has bits outside type and permissions", n.Mode)
	}
	if ft != ftDir && n.Children != nil {
		return "non-directory has children"
	}
	if ft != ftRegular && n.Data.blocks != 0 {
		return "non-regular file has data"
	}
	if n.Data.owner != nil && n.Data.owner != owner {
		return "data was not written by this writer"
	}
	target := n.LinkTarget()
	if ft != ftSymlink && len(target) != 0 {
		return "non-symlink has a link target"
	}
	switch ft {
	case ftRegular:
		if n.Size < 0 {
			return fmt.Sprintf("negative size %d", n.Size)
		}
		if k := len(n.Data.extents); k > 0 {
			last := n.Data.extents[k-1]
			if end := int64(last.logical) + int64(last.length); end*BlockSize-BlockSize >= n.Size {
				return fmt.Sprintf("data extends to block %d, beyond size %d", end, n.Size)
			}
		}
		if uint64(n.Size) > uint64(maxFileBlocks)*BlockSize {
			return fmt.Sprintf("size %d exceeds the ext4 limit", n.Size)
		}
	case ftSymlink:
		if len(target) == 0 {
			return "empty symlink target"
		}
		if len(target) > maxSymlink {
			return fmt.Sprintf("symlink target is %d bytes, more than %d", len(target), maxSymlink)
		}
		if bytes.IndexByte(target, 0) >= 0 {
			return "symlink target contains NUL"
		}
	case ftChar, ftBlock:
		if major, minor := n.Device(); major >= 1<<12 || minor >= 1<<20 {
			return fmt.Sprintf("device number %d:%d out of range", major, minor)
		}
	}
	if major, minor := n.Device(); ft != ftChar && ft != ftBlock && (major != 0 || minor != 0) {
		return "device numbers on a non-device"
	}
	return ""
}
