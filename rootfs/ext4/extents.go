package ext4

import "encoding/binary"

const (
	extMagic       = 0xF30A
	extRootMax     = 4
	extBlockMax    = (BlockSize - 12 - 4) / 12 // 340, room for the tail
	extTailOffset  = 12 + extBlockMax*12
	inodeExtentsFl = 0x80000
)

// treeBlock is one extent tree node stored outside the inode.
type treeBlock struct {
	block uint64
	data  []byte
}

// treeLevels returns how many blocks each level of the extent tree for n
// extents needs, leaves first; none when the inode holds them all.
func treeLevels(n int) []int {
	var levels []int
	for n > extRootMax {
		n = (n + extBlockMax - 1) / extBlockMax
		levels = append(levels, n)
	}
	return levels
}

func treeBlockCount(n int) int {
	t := 0
	for _, l := range treeLevels(n) {
		t += l
	}
	return t
}

func putExtHeader(b []byte, entries, maxEntries, depth int) {
	binary.LittleEndian.PutUint16(b[0:], extMagic)
	binary.LittleEndian.PutUint16(b[2:], uint16(entries))
	binary.LittleEndian.PutUint16(b[4:], uint16(maxEntries))
	binary.LittleEndian.PutUint16(b[6:], uint16(depth))
	binary.LittleEndian.PutUint32(b[8:], 0)
}

func putLeaf(b []byte, e extent) {
	binary.LittleEndian.PutUint32(b[0:], e.logical)
	binary.LittleEndian.PutUint16(b[4:], uint16(e.length))
	binary.LittleEndian.PutUint16(b[6:], uint16(e.physical>>32))
	binary.LittleEndian.PutUint32(b[8:], uint32(e.physical))
}

func putIndex(b []byte, logical uint32, child uint64) {
	binary.LittleEndian.PutUint32(b[0:], logical)
	binary.LittleEndian.PutUint32(b[4:], uint32(child))
	binary.LittleEndian.PutUint16(b[8:], uint16(child>>32))
	binary.LittleEndian.PutUint16(b[10:], 0)
}

// buildExtentTree fills in.root (i_block) and in.tree from in.ext, using
// the physical blocks in phys for the nodes outside the inode (as many as
// treeBlockCount says, leaves first).
func buildExtentTree(in *inode, phys []uint64, seed uint32) {
	exts := in.ext
	levels := treeLevels(len(exts))
	if len(levels) == 0 {
		putExtHeader(in.root[:], len(exts), extRootMax, 0)
		for i, e := range exts {
			putLeaf(in.root[12+12*i:], e)
		}
		return
	}
	type ref struct {
		logical uint32
		block   uint64
	}
	// Leaves.
	var cur []ref
	next := 0
	for i := 0; i < len(exts); i += extBlockMax {
		chunk := exts[i:min(i+extBlockMax, len(exts))]
		b := make([]byte, BlockSize)
		putExtHeader(b, len(chunk), extBlockMax, 0)
		for j, e := range chunk {
			putLeaf(b[12+12*j:], e)
		}
		in.tree = append(in.tree, treeBlock{block: phys[next], data: b})
		cur = append(cur, ref{chunk[0].logical, phys[next]})
		next++
	}
	// Index levels above the leaves, until the inode can hold the rest.
	for depth := 1; len(cur) > extRootMax; depth++ {
		var up []ref
		for i := 0; i < len(cur); i += extBlockMax {
			chunk := cur[i:min(i+extBlockMax, len(cur))]
			b := make([]byte, BlockSize)
			putExtHeader(b, len(chunk), extBlockMax, depth)
			for j, r := range chunk {
				putIndex(b[12+12*j:], r.logical, r.block)
			}
			in.tree = append(in.tree, treeBlock{block: phys[next], data: b})
			up = append(up, ref{chunk[0].logical, phys[next]})
			next++
		}
		cur = up
	}
	putExtHeader(in.root[:], len(cur), extRootMax, len(levels))
	for i, r := range cur {
		putIndex(in.root[12+12*i:], r.logical, r.block)
	}
	is := inodeSeed(seed, in.ino)
	for _, t := range in.tree {
		binary.LittleEndian.PutUint32(t.data[extTailOffset:], crc32c(is, t.data[:extTailOffset]))
	}
}

// runsToExtents turns allocated runs into a block map starting at logical 0.
func runsToExtents(runs []run) []extent {
	var d Data
	var logical uint64
	for _, r := range runs {
		d.addRun(logical, r.start, r.count)
		logical += r.count
	}
	return d.extents
}
