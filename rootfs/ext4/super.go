package ext4

import (
	"encoding/binary"
	"time"
)

// Feature flags.
const (
	compatHasJournal = 0x4
	compatExtAttr    = 0x8
	compatDirIndex   = 0x20

	incompatFiletype = 0x2
	incompatExtents  = 0x40
	incompat64bit    = 0x80
	incompatFlexBg   = 0x200

	roCompatSparseSuper  = 0x1
	roCompatLargeFile    = 0x2
	roCompatHugeFile     = 0x8
	roCompatDirNlink     = 0x20
	roCompatExtraIsize   = 0x40
	roCompatMetadataCsum = 0x400

	bgInodeZeroed   = 0x4
	logGroupsPerFlx = 4
)

// geometry is the final shape of the filesystem.
type geometry struct {
	blocks     uint64 // s_blocks_count
	groups     uint64
	ipg        uint32 // inodes per group
	itb        uint64 // inode table blocks per group
	gdtBlocks  uint64 // blocks of one descriptor table copy
	freeBlocks uint64
	freeInodes uint32
}

func (g *geometry) inodes() uint32 { return uint32(uint64(g.ipg) * g.groups) }

// groupDesc holds one group's descriptor fields.
type groupDesc struct {
	blockBitmap, inodeBitmap, inodeTable uint64
	freeBlocks, freeInodes, usedDirs     uint32
	itableUnused                         uint32
	blockBitmapCsum, inodeBitmapCsum     uint32
}

func encodeGroupDesc(b []byte, g uint32, d *groupDesc, fsSeed uint32) {
	le := binary.LittleEndian
	le.PutUint32(b[0x00:], uint32(d.blockBitmap))
	le.PutUint32(b[0x04:], uint32(d.inodeBitmap))
	le.PutUint32(b[0x08:], uint32(d.inodeTable))
	le.PutUint16(b[0x0C:], uint16(d.freeBlocks))
	le.PutUint16(b[0x0E:], uint16(d.freeInodes))
	le.PutUint16(b[0x10:], uint16(d.usedDirs))
	le.PutUint16(b[0x12:], bgInodeZeroed)
	le.PutUint16(b[0x18:], uint16(d.blockBitmapCsum))
	le.PutUint16(b[0x1A:], uint16(d.inodeBitmapCsum))
	le.PutUint16(b[0x1C:], uint16(d.itableUnused))
	le.PutUint32(b[0x20:], uint32(d.blockBitmap>>32))
	le.PutUint32(b[0x24:], uint32(d.inodeBitmap>>32))
	le.PutUint32(b[0x28:], uint32(d.inodeTable>>32))
	le.PutUint16(b[0x2C:], uint16(d.freeBlocks>>16))
	le.PutUint16(b[0x2E:], uint16(d.freeInodes>>16))
	le.PutUint16(b[0x30:], uint16(d.usedDirs>>16))
	le.PutUint16(b[0x32:], uint16(d.itableUnused>>16))
	le.PutUint16(b[0x38:], uint16(d.blockBitmapCsum>>16))
	le.PutUint16(b[0x3A:], uint16(d.inodeBitmapCsum>>16))
	le.PutUint16(b[0x1E:], 0)
	c := crc32cU32(fsSeed, g)
	c = crc32c(c, b[:0x1E])
	c = crc32c(c, zero4[:2])
	c = crc32c(c, b[0x20:descSize])
	le.PutUint16(b[0x1E:], uint16(c))
}

func putTime32(b []byte, lo, hi int, t time.Time) {
	var s int64
	if !t.IsZero() {
		s = t.Unix()
	}
	if s < 0 {
		s = 0
	}
	binary.LittleEndian.PutUint32(b[lo:], uint32(s))
	b[hi] = uint8(s >> 32)
}

// superblockParams carries what the superblock needs beyond geometry.
type superblockParams struct {
	opts       *Options
	geo        *geometry
	journal    *inode // nil without a journal
	csumSeed   uint32
	blockGroup uint32
}

// encodeSuperblock renders the 1024-byte superblock into b.
func encodeSuperblock(b []byte, p *superblockParams) {
	le := binary.LittleEndian
	g := p.geo
	o := p.opts
	clear(b[:1024])
	le.PutUint32(b[0x00:], g.inodes())
	le.PutUint32(b[0x04:], uint32(g.blocks))
	le.PutUint32(b[0x0C:], uint32(g.freeBlocks))
	le.PutUint32(b[0x10:], g.freeInodes)
	le.PutUint32(b[0x14:], 0) // s_first_data_block
	le.PutUint32(b[0x18:], 2) // 4 KiB
	le.PutUint32(b[0x1C:], 2)
	le.PutUint32(b[0x20:], blocksPerGroup)
	le.PutUint32(b[0x24:], blocksPerGroup)
	le.PutUint32(b[0x28:], g.ipg)
	putTime32(b, 0x30, 0x274, o.Time) // s_wtime
	le.PutUint16(b[0x34:], 0)
	le.PutUint16(b[0x36:], 0xFFFF) // s_max_mnt_count -1
	le.PutUint16(b[0x38:], 0xEF53)
	le.PutUint16(b[0x3A:], 1)         // clean
	le.PutUint16(b[0x3C:], 1)         // errors: continue
	putTime32(b, 0x40, 0x277, o.Time) // s_lastcheck
	le.PutUint32(b[0x4C:], 1)         // dynamic revision
	le.PutUint32(b[0x54:], firstIno)
	le.PutUint16(b[0x58:], inodeSize)
	le.PutUint16(b[0x5A:], uint16(p.blockGroup))

	compat := uint32(compatExtAttr | compatDirIndex)
	if p.journal != nil {
		compat |= compatHasJournal
	}
	le.PutUint32(b[0x5C:], compat)
	le.PutUint32(b[0x60:], incompatFiletype|incompatExtents|incompat64bit|incompatFlexBg)
	le.PutUint32(b[0x64:], roCompatSparseSuper|roCompatLargeFile|roCompatHugeFile|
		roCompatDirNlink|roCompatExtraIsize|roCompatMetadataCsum)
	copy(b[0x68:0x78], o.UUID[:])
	copy(b[0x78:0x88], o.Label)
	copy(b[0xEC:0xFC], o.HashSeed[:])
	b[0xFC] = hashHalfMD4
	le.PutUint16(b[0xFE:], descSize)
	le.PutUint32(b[0x100:], 0x0C)      // default mount options: user_xattr, acl
	putTime32(b, 0x108, 0x276, o.Time) // s_mkfs_time
	if j := p.journal; j != nil {
		le.PutUint32(b[0xE0:], journalIno)
		b[0xFD] = 1 // s_jnl_backup_type: inode blocks
		putIBlock(b[0x10C:0x148], j)
		size := uint64(j.node.Size)
		le.PutUint32(b[0x148:], uint32(size>>32))
		le.PutUint32(b[0x14C:], uint32(size))
	}
	le.PutUint32(b[0x150:], uint32(g.blocks>>32))
	le.PutUint32(b[0x158:], uint32(g.freeBlocks>>32))
	le.PutUint16(b[0x15C:], extraIsize)
	le.PutUint16(b[0x15E:], extraIsize)
	le.PutUint32(b[0x160:], flagUnsignedHash)
	b[0x174] = logGroupsPerFlx
	b[0x175] = 1 // crc32c
	le.PutUint32(b[0x3FC:], crc32c(^uint32(0), b[:0x3FC]))
}
