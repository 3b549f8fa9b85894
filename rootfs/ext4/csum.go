package ext4

import (
	"encoding/binary"
	"hash/crc32"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crc32c is the raw CRC32c used throughout ext4 (no pre- or post-inversion
// beyond what the seed carries), as the kernel's crc32c(seed, buf, len).
func crc32c(seed uint32, p []byte) uint32 {
	return ^crc32.Update(^seed, castagnoli, p)
}

func crc32cU32(seed, v uint32) uint32 {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	return crc32c(seed, b[:])
}

var zero4 [4]byte

// inodeSeed is the per-inode checksum seed (inode number and generation
// folded into the filesystem seed); generation is always 0 here.
func inodeSeed(fsSeed, ino uint32) uint32 {
	return crc32cU32(crc32cU32(fsSeed, ino), 0)
}
