package ext4

import (
	"encoding/binary"
	"time"
)

const (
	inodeSize        = 256
	inodeGoodOldSize = 128
	extraIsize       = 32
)

// encodeTime splits ns (Unix nanoseconds) into the 32-bit seconds field
// and the extra field (two epoch bits, then nanoseconds), as
// ext4_encode_extra_time does.
func encodeTime(ns int64) (uint32, uint32) {
	t := time.Unix(0, ns)
	sec := t.Unix()
	nsec := uint32(t.Nanosecond())
	epoch := uint32(uint64(sec-int64(int32(sec)))>>32) & 3
	return uint32(sec), epoch | nsec<<2
}

// encodeInode renders in into b (inodeSize bytes, zeroed by the caller).
func encodeInode(b []byte, in *inode, fsSeed uint32) {
	n := in.node
	le := binary.LittleEndian
	mode := n.Mode & (ModeTypeMask | 0o7777)
	le.PutUint16(b[0x00:], uint16(mode))
	le.PutUint16(b[0x02:], uint16(n.UID))
	le.PutUint16(b[0x78:], uint16(n.UID>>16))
	le.PutUint16(b[0x18:], uint16(n.GID))
	le.PutUint16(b[0x7A:], uint16(n.GID>>16))

	var size uint64
	var flags uint32
	switch in.ftype {
	case ftRegular:
		size = uint64(n.Size)
		flags = inodeExtentsFl
		putIBlock(b[0x28:0x64], in)
	case ftDir:
		size = uint64(len(in.x.dirData))
		flags = inodeExtentsFl
		if in.x.htree {
			flags |= inodeIndexFl
		}
		putIBlock(b[0x28:0x64], in)
	case ftSymlink:
		target := n.LinkTarget()
		size = uint64(len(target))
		if len(target) < fastSymlink {
			copy(b[0x28:0x64], target)
		} else {
			flags = inodeExtentsFl
			putIBlock(b[0x28:0x64], in)
		}
	case ftChar, ftBlock:
		maj, mnr := n.Device()
		if maj < 256 && mnr < 256 {
			le.PutUint32(b[0x28:], maj<<8|mnr)
		} else {
			le.PutUint32(b[0x2C:], mnr&0xff|maj<<8|(mnr&^0xff)<<12)
		}
	}
	le.PutUint32(b[0x04:], uint32(size))
	le.PutUint32(b[0x6C:], uint32(size>>32))
	le.PutUint16(b[0x1A:], uint16(in.links))
	sectors := in.blocks * (BlockSize / 512)
	le.PutUint32(b[0x1C:], uint32(sectors))
	le.PutUint16(b[0x74:], uint16(sectors>>32))
	le.PutUint32(b[0x20:], flags)
	if xb := in.xblock(); xb != nil {
		le.PutUint32(b[0x68:], uint32(xb.block))
		le.PutUint16(b[0x76:], uint16(xb.block>>32))
	}

	putTime := func(lo, extra int, t int64) {
		s, x := encodeTime(t)
		le.PutUint32(b[lo:], s)
		le.PutUint32(b[extra:], x)
	}
	putTime(0x08, 0x8C, n.Atime)
	putTime(0x0C, 0x84, n.Ctime)
	putTime(0x10, 0x88, n.Mtime)
	putTime(0x90, 0x94, n.Crtime)
	le.PutUint16(b[0x80:], extraIsize)
	if in.x != nil && in.x.ibody != nil {
		copy(b[xattrIbodyStart:], in.x.ibody)
	}
	// Checksum over the whole inode with both checksum fields zero.
	c := crc32c(inodeSeed(fsSeed, in.ino), b[:inodeSize])
	le.PutUint16(b[0x7C:], uint16(c))
	le.PutUint16(b[0x82:], uint16(c>>16))
}
