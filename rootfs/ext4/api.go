package ext4

import (
	"math"
	"os"
	"time"
)

// This file fixes the contract between the ext4 writer and its callers
// (rootfs/flatten fills a tree of Nodes and streams file data through the
// Writer). Keep the exported shapes stable; the implementation lives in the
// other files of this package.

// BlockSize is the only block size the writer produces.
const BlockSize = 4096

// File type bits of Node.Mode, as in the Linux stat(2) st_mode.
const (
	ModeTypeMask = 0o170000
	ModeSocket   = 0o140000
	ModeSymlink  = 0o120000
	ModeRegular  = 0o100000
	ModeBlock    = 0o060000
	ModeDir      = 0o040000
	ModeChar     = 0o020000
	ModeFIFO     = 0o010000
)

// Options control the layout of the filesystem the Writer produces. The same
// Options, the same tree and the same data calls give a byte-identical image.
type Options struct {
	// UUID is the filesystem UUID (s_uuid); callers derive it from the
	// template fingerprint so rebuilds agree.
	UUID [16]byte
	// HashSeed seeds the htree directory hash (s_hash_seed).
	HashSeed [16]byte
	// Label is the volume name (s_volume_name), at most 16 bytes.
	Label string
	// Time stamps the superblock (mkfs, write, last-check times) and any
	// inode the writer creates itself (lost+found, journal).
	Time time.Time
	// JournalBlocks is the size of the jbd2 journal in blocks; 0 means no
	// journal (the has_journal feature is then off).
	JournalBlocks uint32
	// HeadroomPercent is free space left for the guest, as a percentage of
	// the blocks in use; HeadroomMinBlocks is a floor for it.
	HeadroomPercent   uint32
	HeadroomMinBlocks uint64
	// HeadroomInodes is the number of free inodes left for the guest, on top
	// of those the tree uses.
	HeadroomInodes uint32
	// MaxSize bounds the image in bytes (it fixes how much room the group
	// descriptor table reserves); Finish fails if the content needs more.
	MaxSize int64
	// NoSync leaves flushing the finished image to the caller, who may
	// overlap it with other work (hashing the file, say).
	NoSync bool
	// BufferedData writes file data through the page cache. By default
	// it is written with direct I/O where the file system allows it (the
	// metadata Finish writes always goes through the page cache); the
	// image is the same either way.
	BufferedData bool
	// ConsumeTree lets Finish empty each directory of the tree (set its
	// Children to nil) once its entries are planned, so the maps are freed
	// while the metadata is rendered: on a tree of a million files they
	// are a sixth of Finish's peak memory. The tree must not be used after
	// Finish, whatever it returns.
	ConsumeTree bool
}

// Xattr is one extended attribute with its full name ("security.capability",
// "user.foo", "system.posix_acl_access"), value as found in a tar PAX record.
type Xattr struct {
	Name  string
	Value []byte
}

// Data is the on-disk placement of one regular file's content, returned by
// Writer.WriteData. Its zero value is an empty file.
type Data struct {
	// extents are unexported: only this package lays out and reads them.
	extents []extent
	blocks  uint64
	// owner is the Writer that laid the content out, nil when there is
	// none. A Writer refuses to lay out a tree holding another's Data.
	owner *Writer
}

// Blocks reports how many data blocks the content occupies (holes excluded).
func (d Data) Blocks() uint64 { return d.blocks }

// Node is one inode of the tree handed to Writer.Finish. A Node reached from
// several directories is one inode with several hard links. A tree is
// handed to one Finish at a time. The symlink target, device numbers and
// xattrs, which most nodes lack, are set and read through methods; a copy
// of a Node (*m = *n) shares them with n, so setting one on either changes
// both.
type Node struct {
	// Mode holds the type bits (Mode*) and the permission bits including
	// setuid, setgid and sticky.
	Mode     uint32
	UID, GID uint32
	// planned is the inode number Finish gave the node while it numbers
	// the tree, 0 otherwise: it finds hard links without a map of every
	// node, and fits in padding.
	planned uint32
	// Atime, Mtime, Ctime and Crtime are in nanoseconds since the Unix
	// epoch (see Nanos): an int64 is a third of a time.Time, and a tree
	// holds one Node per file.
	Atime, Mtime, Ctime, Crtime int64
	// Size is the byte length of a regular file's content (Data may hold
	// fewer blocks when the file has holes).
	Size int64
	// Data is the content of a regular file, written by WriteData.
	Data Data
	// extra holds the symlink target, device numbers and xattrs, nil while
	// the node has none of them: most nodes (regular files, directories)
	// have none, and keeping them out of Node makes it 112 bytes instead
	// of 160, an allocator size class.
	extra *nodeExtra
	// Children are the entries of a directory by name (any bytes but "/"
	// and NUL, at most 255 bytes). "." and ".." are implied.
	Children map[string]*Node
}

// nodeExtra is the part of a Node that few nodes need.
type nodeExtra struct {
	// linkTarget is the target of a symlink, stored as given.
	linkTarget []byte
	// devMajor and devMinor are the device numbers of block and character
	// device nodes.
	devMajor, devMinor uint32
	// xattrs are stored in the inode where they fit, else in one xattr
	// block.
	xattrs []Xattr
}

// extraAlloc is what the allocator gives a nodeExtra: its 56 bytes round
// up to the 64-byte size class.
const extraAlloc = 64

// NewSymlink returns a symlink node (mode 0777) pointing to target.
func NewSymlink(target []byte) *Node {
	n := &Node{Mode: ModeSymlink | 0o777}
	n.SetLinkTarget(target)
	return n
}

// NewDevice returns a device node of mode (ModeChar or ModeBlock and the
// permission bits) with the device numbers major and minor.
func NewDevice(mode, major, minor uint32) *Node {
	n := &Node{Mode: mode}
	n.SetDevice(major, minor)
	return n
}

// LinkTarget returns the target of a symlink, nil if none is set.
func (n *Node) LinkTarget() []byte {
	if n.extra == nil {
		return nil
	}
	return n.extra.linkTarget
}

// SetLinkTarget sets the target of a symlink, stored as given.
func (n *Node) SetLinkTarget(target []byte) {
	if len(target) == 0 {
		if n.extra != nil {
			n.extra.linkTarget = nil
			n.dropEmptyExtra()
		}
		return
	}
	n.ensureExtra().linkTarget = target
}

// Device returns the device numbers of a block or character device node,
// 0, 0 if none are set.
func (n *Node) Device() (major, minor uint32) {
	if n.extra == nil {
		return 0, 0
	}
	return n.extra.devMajor, n.extra.devMinor
}

// SetDevice sets the device numbers of a block or character device node.
func (n *Node) SetDevice(major, minor uint32) {
	if major == 0 && minor == 0 {
		if n.extra != nil {
			n.extra.devMajor, n.extra.devMinor = 0, 0
			n.dropEmptyExtra()
		}
		return
	}
	x := n.ensureExtra()
	x.devMajor, x.devMinor = major, minor
}

// Xattrs returns the extended attributes of the node, nil if it has none.
func (n *Node) Xattrs() []Xattr {
	if n.extra == nil {
		return nil
	}
	return n.extra.xattrs
}

// SetXattrs sets the extended attributes, stored in the inode where they
// fit, else in one xattr block.
func (n *Node) SetXattrs(xs []Xattr) {
	if len(xs) == 0 {
		if n.extra != nil {
			n.extra.xattrs = nil
			n.dropEmptyExtra()
		}
		return
	}
	n.ensureExtra().xattrs = xs
}

// ExtraMemory returns the bytes n allocates beside its Node for a link
// target, device numbers or xattrs, their contents not included: 0 for a
// node that has none of them.
func (n *Node) ExtraMemory() int64 {
	if n.extra == nil {
		return 0
	}
	return extraAlloc
}

// ensureExtra returns n.extra, allocating it if n has none.
func (n *Node) ensureExtra() *nodeExtra {
	if n.extra == nil {
		n.extra = new(nodeExtra)
	}
	return n.extra
}

// dropEmptyExtra frees n.extra once it holds nothing, so that nodes
// without extras never keep the allocation.
func (n *Node) dropEmptyExtra() {
	x := n.extra
	if len(x.linkTarget) == 0 && x.devMajor == 0 && x.devMinor == 0 && len(x.xattrs) == 0 {
		n.extra = nil
	}
}

// Nanos returns t in the unit of Node's times: nanoseconds since the Unix
// epoch, 0 for the zero Time, clamped to the years 1678 to 2262 that an
// int64 holds.
func Nanos(t time.Time) int64 {
	switch {
	case t.IsZero():
		return 0
	case t.Before(minNanos):
		return math.MinInt64
	case t.After(maxNanos):
		return math.MaxInt64
	}
	return t.UnixNano()
}

var (
	minNanos = time.Unix(0, math.MinInt64)
	maxNanos = time.Unix(0, math.MaxInt64)
)

// Stats describes the image Finish produced.
type Stats struct {
	// Size is the apparent size of the image file in bytes, a multiple of
	// 2 MiB.
	Size        int64
	BlocksTotal uint64
	BlocksFree  uint64
	InodesTotal uint32
	InodesFree  uint32
}

// NewWriter starts an image in f, which must be empty and is owned by the
// Writer until Finish returns.
func NewWriter(f *os.File, opts Options) (*Writer, error) {
	return openWriter(f, opts)
}
