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
// handed to one Finish at a time.
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
	// LinkTarget is the target of a symlink, stored as given.
	LinkTarget []byte
	// DevMajor and DevMinor are the device numbers of block and character
	// device nodes.
	DevMajor, DevMinor uint32
	// Xattrs are stored in the inode where they fit, else in one xattr block.
	Xattrs []Xattr
	// Children are the entries of a directory by name (any bytes but "/"
	// and NUL, at most 255 bytes). "." and ".." are implied.
	Children map[string]*Node
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
