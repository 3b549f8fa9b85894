package ext4

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
)

const (
	// sizeAlign is the image size granularity (2 MiB) in blocks.
	sizeAlign = (2 << 20) / BlockSize
	// inodesPerBlock of the inode table.
	inodesPerBlock = BlockSize / inodeSize
	maxIPG         = BlockSize * 8
	checkEvery     = 4096
)

// Finish writes every inode, directory, bitmap, descriptor and the
// superblock for the tree under root, sizes the file and syncs it (unless
// Options.NoSync).
func (w *Writer) Finish(ctx context.Context, root *Node) (Stats, error) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return Stats{}, fmt.Errorf("finish image: %w", ErrFinished)
	}
	w.done = true
	// No writeback hint or direct descriptor may outlive Finish: the
	// caller closes the file.
	defer w.q.release()
	if err := w.flushPending(); err != nil {
		return Stats{}, fmt.Errorf("finish image: %w", err)
	}
	st, err := w.finish(ctx, root)
	if err != nil {
		return Stats{}, fmt.Errorf("finish image: %w", err)
	}
	return st, nil
}

// finisher carries the state of one Finish call.
type finisher struct {
	w        *Writer
	ctx      context.Context
	opts     *Options
	csumSeed uint32
	p        *plan
	journal  *inode
	xblocks  []*xattrBlock // in first-use order
	dataUsed uint64        // data blocks referenced by the tree
	base     *allocator    // reserved areas plus referenced data

	// Result of layout.
	geo   geometry
	a     *allocator
	used  uint64
	bbm   []uint64
	ibm   []uint64
	itab  []uint64
	itBuf []byte // inode table staging, reused across groups
}

func (w *Writer) finish(ctx context.Context, root *Node) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	f := &finisher{w: w, ctx: ctx, opts: &w.opts}
	f.csumSeed = crc32c(^uint32(0), w.opts.UUID[:])
	p, err := buildPlan(ctx, root, w)
	if err != nil {
		return Stats{}, fmt.Errorf("plan tree: %w", err)
	}
	f.p = p
	if err := f.prepare(); err != nil {
		return Stats{}, err
	}
	if err := f.layout(); err != nil {
		return Stats{}, err
	}
	if err := f.write(); err != nil {
		return Stats{}, err
	}
	g := &f.geo
	return Stats{
		Size:        int64(g.blocks) * BlockSize,
		BlocksTotal: g.blocks,
		BlocksFree:  g.freeBlocks,
		InodesTotal: g.inodes(),
		InodesFree:  g.freeInodes,
	}, nil
}

func (f *finisher) check(i int) error {
	if i%checkEvery == 0 {
		return f.ctx.Err()
	}
	return nil
}

// prepare renders directories and xattrs, and claims the data blocks the
// tree references.
func (f *finisher) prepare() error {
	o := f.opts
	if o.JournalBlocks > 0 {
		t := Nanos(o.Time)
		f.journal = &inode{
			node:  &Node{Mode: ModeRegular | 0o600, Size: int64(o.JournalBlocks) * BlockSize, Atime: t, Mtime: t, Ctime: t, Crtime: t},
			ino:   journalIno,
			name:  "<journal>",
			ftype: ftRegular,
			links: 1,
		}
		f.p.inodes[journalIno-1] = f.journal
	}
	hashSeed := hashSeedWords(o.HashSeed)
	f.base = newAllocator(f.w.maxBlocks, 1+f.w.gdtReserve)
	shared := make(map[string]*xattrBlock)
	for i, in := range f.p.inodes {
		if err := f.check(i); err != nil {
			return err
		}
		if in == nil || in == f.journal {
			continue
		}
		n := in.node
		if in.ftype == ftDir {
			if err := buildDir(f.ctx, in, hashSeed, f.csumSeed); err != nil {
				return fmt.Errorf("build directory: %w", err)
			}
		}
		if in.ftype == ftRegular {
			for _, e := range n.Data.extents {
				if err := f.base.mark(e.physical, uint64(e.length)); err != nil {
					return fmt.Errorf("claim data of %q: %w", in.path(), err)
				}
				f.dataUsed += uint64(e.length)
			}
		}
		if xs := n.Xattrs(); len(xs) > 0 {
			es, err := parseXattrs(in.path(), xs)
			if err != nil {
				return fmt.Errorf("plan tree: %w", err)
			}
			ib, blk := splitXattrs(es)
			x := in.extra()
			x.ibody = ibodyXattrs(ib)
			if len(blk) > 0 {
				data, ok := blockXattrs(blk)
				if !ok {
					return fmt.Errorf("plan tree: %w", invalid(in.path(), "xattrs do not fit in one block"))
				}
				key := string(data)
				xb := shared[key]
				if xb == nil || xb.refs >= xattrRefMax {
					xb = &xattrBlock{data: data}
					shared[key] = xb
					f.xblocks = append(f.xblocks, xb)
				}
				xb.refs++
				x.xblock = xb
			}
		}
	}
	return nil
}

// layout sizes the filesystem and places every metadata block, growing
// the group count until everything fits.
func (f *finisher) layout() error {
	o := f.opts
	maxIno := uint64(len(f.p.inodes))
	needInodes := maxIno + uint64(o.HeadroomInodes)
	groups := uint64(1)
	for iter := 0; ; iter++ {
		if err := f.ctx.Err(); err != nil {
			return err
		}
		if iter > 64 {
			return fmt.Errorf("lay out metadata: no stable group count")
		}
		if groups*blocksPerGroup > f.w.maxBlocks+blocksPerGroup-1 {
			return fmt.Errorf("lay out metadata: %d block groups needed: %w", groups, ErrTooLarge)
		}
		ipg := ceilDiv(needInodes, groups)
		ipg = max(ceilDiv(ipg, inodesPerBlock)*inodesPerBlock, inodesPerBlock)
		if ipg > maxIPG {
			groups = ceilDiv(needInodes, maxIPG)
			continue
		}
		if ipg*groups >= 1<<32 {
			return fmt.Errorf("lay out metadata: %d inodes is too many", ipg*groups)
		}
		if err := f.place(groups, uint32(ipg)); err != nil {
			return err
		}
		g := &f.geo
		head := max(f.used*uint64(o.HeadroomPercent)/100, o.HeadroomMinBlocks)
		total := max(f.used+head, f.a.top, (groups-1)*blocksPerGroup+1+g.gdtBlocks+1)
		total = ceilDiv(total, sizeAlign) * sizeAlign
		if total > groups*blocksPerGroup {
			groups = ceilDiv(total, blocksPerGroup)
			continue
		}
		if total > f.w.maxBlocks {
			return fmt.Errorf("lay out metadata: image needs %d bytes, MaxSize is %d: %w", total*BlockSize, o.MaxSize, ErrTooLarge)
		}
		g.blocks = total
		return nil
	}
}

// place allocates all metadata for a filesystem of the given group count
// on a copy of the base allocator.
func (f *finisher) place(groups uint64, ipg uint32) error {
	a := f.base.clone()
	f.a = a
	f.geo = geometry{
		groups:    groups,
		ipg:       ipg,
		itb:       uint64(ipg) / inodesPerBlock,
		gdtBlocks: ceilDiv(groups*descSize, BlockSize),
	}
	used := f.dataUsed
	for g := uint64(0); g < groups; g++ {
		if hasSuper(g) {
			used += 1 + f.geo.gdtBlocks
		}
	}
	take := func(n uint64) ([]run, error) {
		runs, err := a.alloc(n)
		used += n
		return runs, err
	}
	f.itab = make([]uint64, groups)
	for g := range f.itab {
		s, err := a.allocContig(f.geo.itb)
		if err != nil {
			return fmt.Errorf("place inode table: %w", err)
		}
		f.itab[g] = s
		used += f.geo.itb
	}
	var err error
	if f.bbm, err = f.blockList(take, groups); err != nil {
		return fmt.Errorf("place block bitmaps: %w", err)
	}
	if f.ibm, err = f.blockList(take, groups); err != nil {
		return fmt.Errorf("place inode bitmaps: %w", err)
	}
	for _, xb := range f.xblocks {
		xb.placed = false
	}
	for i, in := range f.p.inodes {
		if err := f.check(i); err != nil {
			return err
		}
		if in != nil {
			if err := f.placeInode(in, take); err != nil {
				return err
			}
		}
	}
	f.used = used
	return nil
}

// placeInode gives in the blocks it needs besides its file data (the
// journal's, a directory's, a long symlink's, its xattr block, its extent
// tree) through take, and counts its blocks.
func (f *finisher) placeInode(in *inode, take func(uint64) ([]run, error)) error {
	in.blocks = 0
	if in.x != nil {
		in.x.tree = nil
		clear(in.x.root[:])
	}
	switch {
	case in == f.journal:
		runs, err := take(uint64(f.opts.JournalBlocks))
		if err != nil {
			return fmt.Errorf("place journal: %w", err)
		}
		in.node.Data.extents = runsToExtents(runs)
	case in.ftype == ftDir:
		runs, err := take(uint64(len(in.x.dirData) / BlockSize))
		if err != nil {
			return fmt.Errorf("place directory %q: %w", in.path(), err)
		}
		in.x.ext = runsToExtents(runs)
	case in.ftype == ftSymlink && len(in.node.LinkTarget()) >= fastSymlink:
		runs, err := take(1)
		if err != nil {
			return fmt.Errorf("place symlink %q: %w", in.path(), err)
		}
		in.extra().ext = runsToExtents(runs)
	}
	exts := in.extents()
	for _, e := range exts {
		in.blocks += uint64(e.length)
	}
	if xb := in.xblock(); xb != nil {
		if !xb.placed {
			runs, err := take(1)
			if err != nil {
				return fmt.Errorf("place xattr block of %q: %w", in.path(), err)
			}
			xb.block = runs[0].start
			xb.placed = true
		}
		in.blocks++
	}
	if in.ftype != ftRegular && in.ftype != ftDir && len(exts) == 0 {
		return nil
	}
	k := treeBlockCount(len(exts))
	var phys []uint64
	if k > 0 {
		runs, err := take(uint64(k))
		if err != nil {
			return fmt.Errorf("place extent tree of %q: %w", in.path(), err)
		}
		for _, r := range runs {
			for b := r.start; b < r.start+r.count; b++ {
				phys = append(phys, b)
			}
		}
		in.blocks += uint64(k)
	}
	buildExtentTree(in, phys, f.csumSeed)
	return nil
}

func (f *finisher) blockList(take func(uint64) ([]run, error), n uint64) ([]uint64, error) {
	runs, err := take(n)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, 0, n)
	for _, r := range runs {
		for b := r.start; b < r.start+r.count; b++ {
			out = append(out, b)
		}
	}
	return out, nil
}

// inodeUsed reports whether inode ino is allocated.
func (f *finisher) inodeUsed(ino uint64) bool {
	if ino < firstIno {
		return true
	}
	return ino <= uint64(len(f.p.inodes)) && f.p.inodes[ino-1] != nil
}

// write emits all metadata, then sizes and syncs the file.
func (f *finisher) write() error {
	w := f.w
	g := &f.geo
	s := newSink(w.f)
	f.freeReservedDescriptors()
	if err := f.writeInodeBlocks(s); err != nil {
		return err
	}
	descs, err := f.writeGroups(s)
	if err != nil {
		return err
	}
	if err := f.writeSuperblocks(s, descs); err != nil {
		return err
	}
	if err := s.flush(); err != nil {
		return err
	}
	if err := f.clearFree(); err != nil {
		return err
	}
	if err := w.f.Truncate(int64(g.blocks) * BlockSize); err != nil {
		return fmt.Errorf("size image: %w", err)
	}
	if w.opts.NoSync {
		return nil
	}
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("sync image: %w", err)
	}
	return nil
}

// freeReservedDescriptors marks the reserved descriptor blocks beyond the
// real table free.
func (f *finisher) freeReservedDescriptors() {
	g, a := &f.geo, f.a
	a.ensure(g.groups * blocksPerGroup)
	for grp := uint64(0); grp < g.groups; grp++ {
		if hasSuper(grp) && f.w.gdtReserve > g.gdtBlocks {
			st := grp*blocksPerGroup + 1 + g.gdtBlocks
			a.clearBits(st, min(grp*blocksPerGroup+1+f.w.gdtReserve, a.size))
		}
	}
}

// writeInodeBlocks writes the directory, symlink, xattr and extent tree
// blocks, and the journal.
func (f *finisher) writeInodeBlocks(s *sink) error {
	for i, in := range f.p.inodes {
		if err := f.check(i); err != nil {
			return err
		}
		if in == nil {
			continue
		}
		switch {
		case in == f.journal:
			if err := f.writeJournal(s, in); err != nil {
				return err
			}
		case in.ftype == ftDir:
			for _, e := range in.x.ext {
				lo := uint64(e.logical) * BlockSize
				if err := s.put(e.physical, in.x.dirData[lo:lo+uint64(e.length)*BlockSize]); err != nil {
					return err
				}
			}
		case in.ftype == ftSymlink && in.x != nil && len(in.x.ext) > 0:
			b := make([]byte, BlockSize)
			copy(b, in.node.LinkTarget())
			if err := s.put(in.x.ext[0].physical, b); err != nil {
				return err
			}
		}
		if in.x == nil {
			continue
		}
		for _, t := range in.x.tree {
			if err := s.put(t.block, t.data); err != nil {
				return err
			}
		}
	}
	for _, xb := range f.xblocks {
		finishXattrBlock(xb, f.csumSeed)
		if err := s.put(xb.block, xb.data); err != nil {
			return err
		}
	}
	return nil
}

// writeGroups writes each group's bitmaps and inode table and returns the
// groups' descriptors; it adds up the free blocks and inodes in f.geo.
func (f *finisher) writeGroups(s *sink) ([]groupDesc, error) {
	g := &f.geo
	descs := make([]groupDesc, g.groups)
	for grp := uint64(0); grp < g.groups; grp++ {
		if err := f.check(int(grp)); err != nil {
			return nil, err
		}
		d := &descs[grp]
		d.blockBitmap, d.inodeBitmap, d.inodeTable = f.bbm[grp], f.ibm[grp], f.itab[grp]
		bb := f.blockBitmap(grp)
		free := uint64(blocksPerGroup)
		for i := 0; i < BlockSize; i += 8 {
			free -= uint64(bits.OnesCount64(binary.LittleEndian.Uint64(bb[i:])))
		}
		d.freeBlocks = uint32(free)
		g.freeBlocks += free
		d.blockBitmapCsum = crc32c(f.csumSeed, bb)
		ib, last := f.inodeBitmap(grp, d)
		g.freeInodes += d.freeInodes
		if err := s.put(d.blockBitmap, bb); err != nil {
			return nil, err
		}
		if err := s.put(d.inodeBitmap, ib); err != nil {
			return nil, err
		}
		if err := f.writeInodeTable(grp, last); err != nil {
			return nil, err
		}
	}
	return descs, nil
}

// inodeBitmap renders group grp's inode bitmap, padding past the group's
// inodes with ones, and fills d's inode counts and bitmap checksum; last
// is the number of the group's inodes up to its last used one.
func (f *finisher) inodeBitmap(grp uint64, d *groupDesc) (ib []byte, last uint64) {
	ipg := uint64(f.geo.ipg)
	ib = make([]byte, BlockSize)
	for k := uint64(0); k < maxIPG; k++ {
		if k >= ipg {
			ib[k/8] |= 1 << (k % 8)
			continue
		}
		ino := grp*ipg + k + 1
		if !f.inodeUsed(ino) {
			d.freeInodes++
			continue
		}
		ib[k/8] |= 1 << (k % 8)
		last = k + 1
		if in := f.p.inodes[ino-1]; in != nil && in.ftype == ftDir {
			d.usedDirs++
		}
	}
	d.itableUnused = uint32(ipg - last)
	d.inodeBitmapCsum = crc32c(f.csumSeed, ib[:ipg/8])
	return ib, last
}

// writeSuperblocks writes the superblock and the descriptor table in
// every group that holds a copy.
func (f *finisher) writeSuperblocks(s *sink, descs []groupDesc) error {
	g := &f.geo
	gdt := make([]byte, g.gdtBlocks*BlockSize)
	for grp := range descs {
		encodeGroupDesc(gdt[grp*descSize:], uint32(grp), &descs[grp], f.csumSeed)
	}
	for grp := uint64(0); grp < g.groups; grp++ {
		if !hasSuper(grp) {
			continue
		}
		b := make([]byte, BlockSize)
		off := 0
		if grp == 0 {
			off = 1024
		}
		encodeSuperblock(b[off:], &superblockParams{opts: f.opts, geo: g, journal: f.journal, csumSeed: f.csumSeed, blockGroup: uint32(grp)})
		if err := s.put(grp*blocksPerGroup, b); err != nil {
			return err
		}
		if err := s.put(grp*blocksPerGroup+1, gdt); err != nil {
			return err
		}
	}
	return nil
}

// blockBitmap renders group grp's block bitmap, padding past the end of
// the filesystem with ones.
func (f *finisher) blockBitmap(grp uint64) []byte {
	b := make([]byte, BlockSize)
	a := f.a
	for i := uint64(0); i < groupWords; i++ {
		wi := grp*groupWords + i
		var v uint64
		if wi < uint64(len(a.words)) {
			v = a.words[wi]
		}
		start := wi * 64
		if end := f.geo.blocks; start+64 > end {
			if start >= end {
				v = ^uint64(0)
			} else {
				v |= ^uint64(0) << (end - start)
			}
		}
		binary.LittleEndian.PutUint64(b[i*8:], v)
	}
	return b
}

// writeInodeTable writes group grp's inodes up to local index last, and
// zeros the rest of the table where stale data may lie.
func (f *finisher) writeInodeTable(grp, last uint64) error {
	g := &f.geo
	nblk := ceilDiv(last, inodesPerBlock)
	if cap(f.itBuf) < int(nblk*BlockSize) {
		f.itBuf = make([]byte, nblk*BlockSize)
	}
	buf := f.itBuf[:nblk*BlockSize]
	clear(buf)
	for k := uint64(0); k < last; k++ {
		ino := grp*uint64(g.ipg) + k + 1
		if ino > uint64(len(f.p.inodes)) {
			break
		}
		if in := f.p.inodes[ino-1]; in != nil {
			encodeInode(buf[k*inodeSize:(k+1)*inodeSize], in, f.csumSeed)
		}
	}
	start := f.itab[grp]
	if len(buf) > 0 {
		if _, err := f.w.f.WriteAt(buf, int64(start)*BlockSize); err != nil {
			return fmt.Errorf("write inode table of group %d: %w", grp, err)
		}
	}
	return f.zeroStale(start+nblk, start+g.itb)
}

// clearFree turns every free block that WriteData may have written (data
// released, overwritten or never referenced) back into zeros, so no old
// content survives in free space.
func (f *finisher) clearFree() error {
	a := f.a
	end := min(f.w.dirty, f.geo.blocks, a.size)
	punch := true
	for b := uint64(0); b < end; {
		w := a.words[b/64] >> (b % 64)
		if w == ^uint64(0)>>(b%64) {
			b = (b/64 + 1) * 64
			continue
		}
		if w&1 != 0 {
			b += uint64(bits.TrailingZeros64(^w))
			continue
		}
		s := b
		e := a.findUsed(s, end)
		b = e
		if punch {
			err := punchHole(f.w.f, int64(s)*BlockSize, int64(e-s)*BlockSize)
			if err == nil {
				continue
			}
			if err != errPunchUnsupported {
				return fmt.Errorf("clear free blocks %d-%d: %w", s, e-1, err)
			}
			punch = false
		}
		if err := f.zeroStale(s, e); err != nil {
			return err
		}
	}
	return nil
}

// zeroStale zeros blocks [s, e) that WriteData may have written before.
func (f *finisher) zeroStale(s, e uint64) error {
	e = min(e, f.w.dirty)
	for s < e {
		n := min(e-s, uint64(len(f.w.buf)/BlockSize))
		z := f.w.buf[:n*BlockSize]
		clear(z)
		if _, err := f.w.f.WriteAt(z, int64(s)*BlockSize); err != nil {
			return fmt.Errorf("zero blocks at %d: %w", s, err)
		}
		s += n
	}
	return nil
}

func (f *finisher) writeJournal(s *sink, in *inode) error {
	exts := in.extents()
	first := exts[0].physical
	if err := s.put(first, journalSuperblock(f.opts.JournalBlocks, f.opts.UUID)); err != nil {
		return err
	}
	for i, e := range exts {
		st := e.physical
		if i == 0 {
			st++
		}
		if err := f.zeroStale(st, e.physical+uint64(e.length)); err != nil {
			return fmt.Errorf("clear journal: %w", err)
		}
	}
	return nil
}
