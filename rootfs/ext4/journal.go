package ext4

import "encoding/binary"

const (
	jbd2Magic        = 0xC03B3998
	jbd2SuperblockV2 = 4
)

// journalSuperblock renders an empty, clean jbd2 v2 superblock.
func journalSuperblock(blocks uint32, uuid [16]byte) []byte {
	b := make([]byte, BlockSize)
	be := binary.BigEndian
	be.PutUint32(b[0x00:], jbd2Magic)
	be.PutUint32(b[0x04:], jbd2SuperblockV2)
	be.PutUint32(b[0x08:], 0)
	be.PutUint32(b[0x0C:], BlockSize)
	be.PutUint32(b[0x10:], blocks) // s_maxlen
	be.PutUint32(b[0x14:], 1)      // s_first
	be.PutUint32(b[0x18:], 1)      // s_sequence
	be.PutUint32(b[0x1C:], 0)      // s_start: clean
	copy(b[0x30:0x40], uuid[:])
	be.PutUint32(b[0x40:], 1) // s_nr_users
	return b
}
