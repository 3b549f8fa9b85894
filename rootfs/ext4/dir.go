package ext4

import (
	"cmp"
	"context"
	"encoding/binary"
	"slices"
	"strings"
)

const (
	dirTailLen   = 12
	dirLeafSpace = BlockSize - dirTailLen
	dxRootCount  = 0x20
	dxNodeCount  = 0x08
	dxTailLen    = 8
	dxRootLimit  = (BlockSize - dxRootCount - dxTailLen) / 8 // 507
	dxNodeLimit  = (BlockSize - dxNodeCount - dxTailLen) / 8 // 510
	inodeIndexFl = 0x1000
)

func recLen(nameLen int) int { return (8 + nameLen + 3) &^ 3 }

func putDirent(b []byte, ino uint32, rec int, name string, ft uint8) {
	binary.LittleEndian.PutUint32(b[0:], ino)
	binary.LittleEndian.PutUint16(b[4:], uint16(rec))
	b[6] = uint8(len(name))
	b[7] = ft
	copy(b[8:], name)
}

// sealLeaf writes the checksum tail of a directory leaf block.
func sealLeaf(b []byte, is uint32) {
	t := b[dirLeafSpace:]
	binary.LittleEndian.PutUint32(t[0:], 0)
	binary.LittleEndian.PutUint16(t[4:], dirTailLen)
	t[6] = 0
	t[7] = 0xDE
	binary.LittleEndian.PutUint32(t[8:], crc32c(is, b[:dirLeafSpace]))
}

// fillLeaf packs entries into one leaf block; the last record stretches to
// the tail. An empty list gives an unused block (one empty record).
func fillLeaf(b []byte, ents []dirent, is uint32) {
	pos := 0
	for i, e := range ents {
		rec := recLen(len(e.name))
		if i == len(ents)-1 {
			rec = dirLeafSpace - pos
		}
		putDirent(b[pos:], e.ino, rec, e.name, e.ftype)
		pos += rec
	}
	if len(ents) == 0 {
		putDirent(b, 0, dirLeafSpace, "", 0)
	}
	sealLeaf(b, is)
}

// buildDir renders a directory's blocks into in.x.dirData: one linear
// block when "." , ".." and the entries fit, else an htree. The entry list
// is dropped once rendered.
func buildDir(ctx context.Context, in *inode, hashSeed [4]uint32, fsSeed uint32) error {
	if err := renderDir(ctx, in, hashSeed, fsSeed); err != nil {
		return err
	}
	in.x.children = nil
	return nil
}

func renderDir(ctx context.Context, in *inode, hashSeed [4]uint32, fsSeed uint32) error {
	x := in.x
	is := inodeSeed(fsSeed, in.ino)
	size := recLen(1) + recLen(2)
	for _, e := range x.children {
		size += recLen(len(e.name))
	}
	if size <= dirLeafSpace {
		nblocks := 1
		if in.ino == firstIno {
			nblocks = lpfMinBlocks
		}
		x.dirData = make([]byte, nblocks*BlockSize)
		ents := make([]dirent, 0, 2+len(x.children))
		ents = append(ents, dirent{".", in.ino, ftDir}, dirent{"..", x.parent, ftDir})
		ents = append(ents, x.children...)
		fillLeaf(x.dirData[:BlockSize], ents, is)
		for i := 1; i < nblocks; i++ {
			fillLeaf(x.dirData[i*BlockSize:(i+1)*BlockSize], nil, is)
		}
		return nil
	}
	return buildHtree(ctx, in, hashSeed, is)
}

type hashedEnt struct {
	dirent
	hash uint32
}

type dxRef struct {
	hash  uint32 // lowest hash in the block, bit 0 set on a collision continuation
	block uint32 // logical block in the directory
}

func buildHtree(ctx context.Context, in *inode, hashSeed [4]uint32, is uint32) error {
	x := in.x
	ents := make([]hashedEnt, len(x.children))
	for i, e := range x.children {
		if i%checkEvery == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		ents[i] = hashedEnt{e, dirHash([]byte(e.name), hashSeed)}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	slices.SortFunc(ents, func(a, b hashedEnt) int {
		if c := cmp.Compare(a.hash, b.hash); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	// Pack leaves.
	type leaf struct {
		lo, hi int // ents[lo:hi]
		hash   uint32
	}
	var leaves []leaf
	for i := 0; i < len(ents); {
		used := 0
		j := i
		for j < len(ents) && used+recLen(len(ents[j].name)) <= dirLeafSpace {
			used += recLen(len(ents[j].name))
			j++
		}
		h := ents[i].hash
		if i > 0 && ents[i-1].hash == h {
			h |= 1
		}
		leaves = append(leaves, leaf{i, j, h})
		i = j
	}
	levels := 0
	nodes := 0
	if len(leaves) > dxRootLimit {
		levels = 1
		nodes = (len(leaves) + dxNodeLimit - 1) / dxNodeLimit
		if nodes > dxRootLimit {
			return invalid(in.path(), "directory of %d entries is too large for a two-level htree", len(ents))
		}
	}
	total := 1 + nodes + len(leaves)
	x.dirData = make([]byte, total*BlockSize)
	blk := func(i int) []byte { return x.dirData[i*BlockSize : (i+1)*BlockSize] }
	// Leaves after the root and the index nodes.
	refs := make([]dxRef, len(leaves))
	for i, l := range leaves {
		n := 1 + nodes + i
		lents := make([]dirent, 0, l.hi-l.lo)
		for _, e := range ents[l.lo:l.hi] {
			lents = append(lents, e.dirent)
		}
		fillLeaf(blk(n), lents, is)
		refs[i] = dxRef{l.hash, uint32(n)}
	}
	if levels == 1 {
		var up []dxRef
		for k := 0; k < nodes; k++ {
			chunk := refs[k*dxNodeLimit : min((k+1)*dxNodeLimit, len(refs))]
			b := blk(1 + k)
			putDirent(b, 0, BlockSize, "", 0)
			putDxEntries(b, dxNodeCount, dxNodeLimit, chunk, is)
			up = append(up, dxRef{chunk[0].hash, uint32(1 + k)})
		}
		refs = up
	}
	// Root: ".", "..", dx_root_info, entries.
	b := blk(0)
	putDirent(b, in.ino, 12, ".", ftDir)
	putDirent(b[12:], x.parent, BlockSize-12, "..", ftDir)
	binary.LittleEndian.PutUint32(b[24:], 0)
	b[28] = hashHalfMD4
	b[29] = 8
	b[30] = uint8(levels)
	b[31] = 0
	putDxEntries(b, dxRootCount, dxRootLimit, refs, is)
	x.htree = true
	return nil
}

// putDxEntries writes count/limit, the entries and the checksummed dx_tail.
func putDxEntries(b []byte, off, limit int, refs []dxRef, is uint32) {
	binary.LittleEndian.PutUint16(b[off:], uint16(limit))
	binary.LittleEndian.PutUint16(b[off+2:], uint16(len(refs)))
	binary.LittleEndian.PutUint32(b[off+4:], refs[0].block)
	for i := 1; i < len(refs); i++ {
		binary.LittleEndian.PutUint32(b[off+8*i:], refs[i].hash)
		binary.LittleEndian.PutUint32(b[off+8*i+4:], refs[i].block)
	}
	tail := off + limit*8
	binary.LittleEndian.PutUint32(b[tail:], 0)
	c := crc32c(is, b[:off+len(refs)*8])
	c = crc32c(c, b[tail:tail+4])
	c = crc32c(c, zero4[:])
	binary.LittleEndian.PutUint32(b[tail+4:], c)
}
