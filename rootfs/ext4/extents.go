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

// buildExtentTree fills in.x.tree and in.x.root (i_block) from the
// inode's extents when they do not fit in the inode, using the physical
// blocks in phys for the nodes outside it (as many as treeBlockCount says,
// leaves first). An inode whose extents fit keeps nothing: putIBlock
// renders them.
func buildExtentTree(in *inode, phys []uint64, seed uint32) {
	exts := in.extents()
	levels := treeLevels(len(exts))
	if len(levels) == 0 {
		return
	}
	x := in.extra()
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
		x.tree = append(x.tree, treeBlock{block: phys[next], data: b})
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
			x.tree = append(x.tree, treeBlock{block: phys[next], data: b})
			up = append(up, ref{chunk[0].logical, phys[next]})
			next++
		}
		cur = up
	}
	putExtHeader(x.root[:], len(cur), extRootMax, len(levels))
	for i, r := range cur {
		putIndex(x.root[12+12*i:], r.logical, r.block)
	}
	is := inodeSeed(seed, in.ino)
	for _, t := range x.tree {
		binary.LittleEndian.PutUint32(t.data[extTailOffset:], crc32c(is, t.data[:extTailOffset]))
	}
}

// putIBlock renders the extent tree root of in into b (i_block, 60 bytes).
func putIBlock(b []byte, in *inode) {
	if x := in.x; x != nil && len(x.tree) > 0 {
		copy(b, x.root[:])
		return
	}
	exts := in.extents()
	putExtHeader(b, len(exts), extRootMax, 0)
	for i, e := range exts {
		putLeaf(b[12+12*i:], e)
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
