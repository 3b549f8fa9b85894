package inspect

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
)

// superblockOffset is where the ext4 superblock starts.
const superblockOffset = 1024

// superblockSize is how much of the superblock checkSuperblock reads.
const superblockSize = 1024

// Incompatible features the go-diskfs reader handles: filetype, recover
// (a journal needing replay is read as it is), extents, 64bit, flex_bg and
// csum_seed. Others change the layout it assumes (meta_bg, journal_dev,
// inline_data, encrypt, casefold...).
const supportedIncompat = 0x2 | 0x4 | 0x40 | 0x80 | 0x200 | 0x2000

// roCompatBigalloc makes the allocation unit a cluster of blocks.
const roCompatBigalloc = 0x200

// ErrNotImage means the file is not an ext4 image inspect can read.
var ErrNotImage = errors.New("not an ext4 image inspect can read")

// checkSuperblock validates the superblock of an image of size bytes
// before go-diskfs sees it: go-diskfs v1.9.4 trusts these fields, and
// allocates the group descriptor table from them (a crafted block count
// asks for terabytes) or indexes slices with them (panics).
func checkSuperblock(r io.ReaderAt, size int64) error {
	b := make([]byte, superblockSize)
	if n, err := r.ReadAt(b, superblockOffset); n < len(b) {
		return fmt.Errorf("%w: %d bytes, too small for a superblock (%v)", ErrNotImage, size, err)
	}
	le := binary.LittleEndian
	if magic := le.Uint16(b[0x38:]); magic != 0xEF53 {
		return fmt.Errorf("%w: no ext4 magic (0x%04x)", ErrNotImage, magic)
	}
	logBlock := le.Uint32(b[0x18:])
	if logBlock > 6 {
		return fmt.Errorf("%w: block size 2^%d is outside 1 KiB to 64 KiB", ErrNotImage, 10+uint64(logBlock))
	}
	blockSize := uint64(1024) << logBlock
	if le.Uint32(b[0x1C:]) != logBlock || le.Uint32(b[0x64:])&roCompatBigalloc != 0 {
		return fmt.Errorf("%w: bigalloc (clusters of blocks) is not supported", ErrNotImage)
	}
	incompat := le.Uint32(b[0x60:])
	if extra := incompat &^ supportedIncompat; extra != 0 {
		return fmt.Errorf("%w: unsupported incompatible features 0x%x", ErrNotImage, extra)
	}
	blocks := uint64(le.Uint32(b[0x04:]))
	descSize := uint64(32)
	if incompat&0x80 != 0 { // 64bit
		blocks |= uint64(le.Uint32(b[0x150:])) << 32
		descSize = uint64(le.Uint16(b[0xFE:]))
		if descSize < 32 || descSize > 1024 || bits.OnesCount64(descSize) != 1 {
			return fmt.Errorf("%w: group descriptor size %d", ErrNotImage, descSize)
		}
	}
	firstData := uint64(le.Uint32(b[0x14:]))
	if want := uint64(0); blockSize == 1024 {
		want = 1
		if firstData != want {
			return fmt.Errorf("%w: first data block %d, want %d for 1 KiB blocks", ErrNotImage, firstData, want)
		}
	} else if firstData != want {
		return fmt.Errorf("%w: first data block %d, want %d", ErrNotImage, firstData, want)
	}
	if blocks <= firstData || blocks > uint64(size)/blockSize {
		return fmt.Errorf("%w: %d blocks of %d bytes do not fit the %d-byte file", ErrNotImage, blocks, blockSize, size)
	}
	perGroup := uint64(le.Uint32(b[0x20:]))
	if perGroup < 8 || perGroup > 8*blockSize || perGroup%8 != 0 {
		return fmt.Errorf("%w: %d blocks per group", ErrNotImage, perGroup)
	}
	groups := (blocks + perGroup - 1) / perGroup
	gdtStart := uint64(1)
	if blockSize == 1024 {
		gdtStart = 2
	}
	if (gdtStart*blockSize + groups*descSize) > uint64(size) {
		return fmt.Errorf("%w: %d group descriptors do not fit the file", ErrNotImage, groups)
	}
	inodesPerGroup := uint64(le.Uint32(b[0x28:]))
	if inodesPerGroup == 0 || inodesPerGroup > 8*blockSize {
		return fmt.Errorf("%w: %d inodes per group", ErrNotImage, inodesPerGroup)
	}
	if inodes := uint64(le.Uint32(b[0x00:])); inodes == 0 || inodes > groups*inodesPerGroup {
		return fmt.Errorf("%w: %d inodes for %d groups of %d", ErrNotImage, inodes, groups, inodesPerGroup)
	}
	inodeSize := uint64(128)
	if le.Uint32(b[0x4C:]) >= 1 { // dynamic revision
		inodeSize = uint64(le.Uint16(b[0x58:]))
	}
	if inodeSize < 128 || inodeSize > blockSize || bits.OnesCount64(inodeSize) != 1 {
		return fmt.Errorf("%w: inode size %d", ErrNotImage, inodeSize)
	}
	return nil
}
