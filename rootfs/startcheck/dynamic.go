package startcheck

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Bounds on reading shared objects. The loader reads an object's dynamic
// section and version tables through its program headers: the dynamic
// section lies after the code (86 MB into a node binary), the string and
// version tables near the start. The check reads only the pages it needs,
// whatever their offsets, and counts them.
const (
	// pageSize is the unit a fileReader reads in.
	pageSize = 4 << 10
	// maxFileRead bounds the bytes read of one file through its
	// fileReader; a shared object needs a few pages.
	maxFileRead = 4 << 20
	// maxCheckRead bounds the bytes one check reads through fileReaders
	// and of /etc/ld.so.cache, over all files.
	maxCheckRead = 32 << 20
	// maxDynamic bounds the dynamic section read: 4096 entries of 64-bit
	// objects, twenty times what large programs have.
	maxDynamic = 64 << 10
	// maxNeeded bounds the DT_NEEDED entries read of one object, four
	// times the libraries a check loads in all (maxLibraries): the
	// loading stops at that bound first, naming the library where it
	// stopped.
	maxNeeded = 1024
	// maxVersions bounds the version entries read of one object, needed
	// and defined (libc defines about 40, a program needs about 20).
	maxVersions = 1024
	// maxDynString bounds one string of the dynamic string table: a
	// library name or a search path list.
	maxDynString = 16 << 10
)

// Errors of reading a shared object, as warnings say them.
var (
	errFileBudget  = fmt.Errorf("more than %d MiB to read", maxFileRead>>20)
	errCheckBudget = fmt.Errorf("more than %d MiB read in one check", maxCheckRead>>20)
)

// readBudget is what one check may still read through its fileReaders.
type readBudget struct{ left int }

// fileReader reads parts of one regular file of the tree, a page at a
// time and each page once, within the per-file and per-check budgets.
type fileReader struct {
	fs     FS
	path   string
	budget *readBudget
	pages  map[int64][]byte // page index: content (shorter at the end of the file)
	read   int              // bytes read of this file
}

func newFileReader(fsys FS, p string, b *readBudget) *fileReader {
	return &fileReader{fs: fsys, path: p, budget: b, pages: make(map[int64][]byte)}
}

// page returns page i of the file: pageSize bytes, fewer at its end.
func (r *fileReader) page(i int64) ([]byte, error) {
	if b, ok := r.pages[i]; ok {
		return b, nil
	}
	switch {
	case r.read+pageSize > maxFileRead:
		return nil, errFileBudget
	case r.budget.left < pageSize:
		return nil, errCheckBudget
	}
	r.read += pageSize
	r.budget.left -= pageSize
	buf := make([]byte, pageSize)
	n, err := r.fs.ReadAt(r.path, buf, i*pageSize)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %s", quote(r.path), errText(err))
	}
	r.pages[i] = buf[:n]
	return buf[:n], nil
}

// at returns n bytes at off; io.ErrUnexpectedEOF when the file ends
// first.
func (r *fileReader) at(off uint64, n int) ([]byte, error) {
	if n < 0 || off > 1<<62 {
		return nil, io.ErrUnexpectedEOF
	}
	out := make([]byte, 0, n)
	for len(out) < n {
		pos := off + uint64(len(out))
		b, err := r.page(int64(pos / pageSize))
		if err != nil {
			return nil, err
		}
		in := int(pos % pageSize)
		if in >= len(b) {
			return nil, io.ErrUnexpectedEOF
		}
		out = append(out, b[in:min(len(b), in+n-len(out))]...)
	}
	return out, nil
}

// head returns the first n bytes of the file, fewer when it is shorter.
func (r *fileReader) head(n int) ([]byte, error) {
	out := make([]byte, 0, n)
	for len(out) < n {
		b, err := r.page(int64(len(out) / pageSize))
		if err != nil {
			return nil, err
		}
		out = append(out, b[:min(len(b), n-len(out))]...)
		if len(b) < pageSize {
			break
		}
	}
	return out, nil
}

// cstring returns the NUL-terminated string at off, of at most max bytes.
func (r *fileReader) cstring(off uint64, max int) (string, error) {
	var s []byte
	for {
		pos := off + uint64(len(s))
		if pos > 1<<62 {
			return "", io.ErrUnexpectedEOF
		}
		b, err := r.page(int64(pos / pageSize))
		if err != nil {
			return "", err
		}
		in := int(pos % pageSize)
		if in >= len(b) {
			return "", io.ErrUnexpectedEOF
		}
		if i := bytes.IndexByte(b[in:], 0); i >= 0 {
			s = append(s, b[in:in+i]...)
			if len(s) > max {
				return "", fmt.Errorf("string of more than %d bytes", max)
			}
			return string(s), nil
		}
		s = append(s, b[in:]...)
		if len(s) > max {
			return "", fmt.Errorf("string of more than %d bytes", max)
		}
	}
}

// headerOf parses the ELF headers at the start of fr's file, reading on
// (up to maxHead) when its program headers lie beyond the first page.
func headerOf(fr *fileReader) (elfInfo, error) {
	for n := pageSize; ; n *= 2 {
		b, err := fr.head(n)
		if err != nil {
			return elfInfo{}, err
		}
		info, err := parseHeaders(b)
		if !errors.Is(err, errShort) || len(b) < n || n >= maxHead {
			return info, err
		}
	}
}

// dynamic is what the loader reads of an object's dynamic section.
type dynamic struct {
	needed  []string // DT_NEEDED, in order
	soname  string
	rpath   string // DT_RPATH, unless there is a DT_RUNPATH (glibc ignores it then)
	runpath string
	// hasRPath and hasRunPath tell an empty path from none.
	hasRPath, hasRunPath bool
	flags1               elf.DynFlag1
	needs                []verNeed // DT_VERNEED: versions required of other objects
	defs                 []version // DT_VERDEF: versions defined
	// hasDefs is false for an object without version definitions, whose
	// version requirements the loader does not check.
	hasDefs bool
}

// verNeed is one DT_VERNEED entry: the versions needed of one file.
type verNeed struct {
	file string
	vers []version
}

// version is a version name with its ELF hash and flags, needed
// (Vernaux) or defined (Verdef).
type version struct {
	name  string
	hash  uint32
	flags uint16
}

// Version flags (elf.h).
const (
	verFlgBase = 0x1
	verFlgWeak = 0x2
)

// elfReader reads an object's structures through its program headers, as
// the loader finds them once the object is mapped.
type elfReader struct {
	r     *fileReader
	info  elfInfo
	order binary.ByteOrder
}

func newELFReader(r *fileReader, info elfInfo) *elfReader {
	var order binary.ByteOrder = binary.LittleEndian
	if info.data == elf.ELFDATA2MSB {
		order = binary.BigEndian
	}
	return &elfReader{r: r, info: info, order: order}
}

// offset maps a virtual address to its file offset through the PT_LOAD
// segment holding it in its file part.
func (e *elfReader) offset(vaddr uint64) (uint64, error) {
	for _, p := range e.info.progs {
		if p.Type == elf.PT_LOAD && vaddr >= p.Vaddr && vaddr-p.Vaddr < p.Filesz {
			return p.Off + (vaddr - p.Vaddr), nil
		}
	}
	return 0, fmt.Errorf("address %#x is in no loaded segment", vaddr)
}

// dynamicSegment returns the PT_DYNAMIC segment (the last one, as the
// loader takes it), ok false when there is none.
func (e *elfReader) dynamicSegment() (p elf.ProgHeader, ok bool) {
	for _, q := range e.info.progs {
		if q.Type == elf.PT_DYNAMIC {
			p, ok = q, true
		}
	}
	return p, ok
}

// dynEntry is one decoded dynamic section entry.
type dynEntry struct {
	tag elf.DynTag
	val uint64
}

// entries reads the dynamic section up to DT_NULL.
func (e *elfReader) entries() ([]dynEntry, error) {
	seg, ok := e.dynamicSegment()
	if !ok {
		return nil, nil
	}
	if seg.Filesz == 0 {
		return nil, errors.New("empty dynamic section")
	}
	off, err := e.offset(seg.Vaddr)
	if err != nil {
		return nil, fmt.Errorf("dynamic section: %w", err)
	}
	size := min(seg.Filesz, maxDynamic)
	b, err := e.r.at(off, int(size))
	if err != nil {
		return nil, fmt.Errorf("read dynamic section: %w", err)
	}
	return decodeDynamic(b, e.info.class, e.order, seg.Filesz > maxDynamic)
}

// decodeDynamic decodes the entries of b up to DT_NULL; cut says b is the
// first part of a longer section.
func decodeDynamic(b []byte, class elf.Class, order binary.ByteOrder, cut bool) ([]dynEntry, error) {
	size := 16
	if class == elf.ELFCLASS32 {
		size = 8
	}
	out := make([]dynEntry, 0, len(b)/size)
	for i := 0; i+size <= len(b); i += size {
		var d dynEntry
		if size == 16 {
			d = dynEntry{elf.DynTag(order.Uint64(b[i:])), order.Uint64(b[i+8:])}
		} else {
			d = dynEntry{elf.DynTag(int32(order.Uint32(b[i:]))), uint64(order.Uint32(b[i+4:]))}
		}
		if d.tag == elf.DT_NULL {
			return out, nil
		}
		out = append(out, d)
	}
	if cut {
		return nil, fmt.Errorf("dynamic section of more than %d bytes", maxDynamic)
	}
	return nil, errors.New("dynamic section without DT_NULL")
}

// readDynamic reads what the loader uses of the object's dynamic section:
// its needed libraries, name, search paths, flags and version tables.
func (e *elfReader) readDynamic() (dynamic, error) {
	ents, err := e.entries()
	if err != nil || len(ents) == 0 {
		return dynamic{}, err
	}
	var (
		d                               dynamic
		needed                          []uint64
		strtab, soname, rpath, runpath  uint64
		hasStrtab, hasSoname            bool
		verneed, verdef                 uint64
		hasVerneed, hasVerdef, hasFlags bool
		flags1                          uint64
	)
	for _, ent := range ents {
		switch ent.tag {
		case elf.DT_NEEDED:
			if len(needed) == maxNeeded {
				return dynamic{}, fmt.Errorf("more than %d DT_NEEDED entries", maxNeeded)
			}
			needed = append(needed, ent.val)
		case elf.DT_STRTAB:
			strtab, hasStrtab = ent.val, true
		case elf.DT_SONAME:
			soname, hasSoname = ent.val, true
		case elf.DT_RPATH:
			rpath, d.hasRPath = ent.val, true
		case elf.DT_RUNPATH:
			runpath, d.hasRunPath = ent.val, true
		case elf.DT_FLAGS_1:
			flags1, hasFlags = ent.val, true
		case elf.DT_VERNEED:
			verneed, hasVerneed = ent.val, true
		case elf.DT_VERDEF:
			verdef, hasVerdef = ent.val, true
		}
	}
	if hasFlags {
		d.flags1 = elf.DynFlag1(flags1)
	}
	// glibc ignores DT_RPATH when there is a DT_RUNPATH (musl too).
	d.hasRPath = d.hasRPath && !d.hasRunPath
	if !hasStrtab {
		if len(needed) > 0 || hasSoname || d.hasRPath || d.hasRunPath || hasVerneed || hasVerdef {
			return dynamic{}, errors.New("dynamic section without a string table")
		}
		return d, nil
	}
	st, err := e.offset(strtab)
	if err != nil {
		return dynamic{}, fmt.Errorf("string table: %w", err)
	}
	str := func(what string, off uint64) (string, error) {
		s, err := e.r.cstring(st+off, maxDynString)
		if err != nil {
			return "", fmt.Errorf("read %s: %w", what, err)
		}
		return s, nil
	}
	for _, off := range needed {
		s, err := str("DT_NEEDED", off)
		if err != nil {
			return dynamic{}, err
		}
		d.needed = append(d.needed, s)
	}
	if hasSoname {
		if d.soname, err = str("DT_SONAME", soname); err != nil {
			return dynamic{}, err
		}
	}
	if d.hasRPath {
		if d.rpath, err = str("DT_RPATH", rpath); err != nil {
			return dynamic{}, err
		}
	}
	if d.hasRunPath {
		if d.runpath, err = str("DT_RUNPATH", runpath); err != nil {
			return dynamic{}, err
		}
	}
	if hasVerneed {
		off, err := e.offset(verneed)
		if err != nil {
			return dynamic{}, fmt.Errorf("version needs: %w", err)
		}
		if d.needs, err = readVerneed(e.r, e.order, off, st); err != nil {
			return dynamic{}, err
		}
	}
	if hasVerdef {
		off, err := e.offset(verdef)
		if err != nil {
			return dynamic{}, fmt.Errorf("version definitions: %w", err)
		}
		if d.defs, err = readVerdef(e.r, e.order, off, st); err != nil {
			return dynamic{}, err
		}
		d.hasDefs = true
	}
	return d, nil
}

// readVerneed reads the chain of Verneed entries at off, with their
// Vernaux entries, names from the string table at strtab; it follows
// vn_next and vna_next as the loader does, within maxVersions entries.
func readVerneed(r *fileReader, order binary.ByteOrder, off, strtab uint64) ([]verNeed, error) {
	var out []verNeed
	count := 0
	for {
		b, err := r.at(off, 16) // Elf_Verneed, the same in both classes
		if err != nil {
			return nil, fmt.Errorf("read version needs: %w", err)
		}
		vnVersion, vnFile, vnAux, vnNext := order.Uint16(b), order.Uint32(b[4:]), order.Uint32(b[8:]), order.Uint32(b[12:])
		if vnVersion != 1 {
			return nil, fmt.Errorf("unsupported version %d of Verneed record", vnVersion)
		}
		file, err := r.cstring(strtab+uint64(vnFile), maxDynString)
		if err != nil {
			return nil, fmt.Errorf("read version needs: %w", err)
		}
		n := verNeed{file: file}
		aux := off + uint64(vnAux)
		for {
			if count++; count > maxVersions {
				return nil, fmt.Errorf("more than %d version entries", maxVersions)
			}
			a, err := r.at(aux, 16) // Elf_Vernaux
			if err != nil {
				return nil, fmt.Errorf("read version needs: %w", err)
			}
			name, err := r.cstring(strtab+uint64(order.Uint32(a[8:])), maxDynString)
			if err != nil {
				return nil, fmt.Errorf("read version needs: %w", err)
			}
			n.vers = append(n.vers, version{name: name, hash: order.Uint32(a), flags: order.Uint16(a[4:])})
			next := order.Uint32(a[12:])
			if next == 0 {
				break
			}
			aux += uint64(next)
		}
		out = append(out, n)
		if vnNext == 0 {
			return out, nil
		}
		off += uint64(vnNext)
	}
}

// readVerdef reads the chain of Verdef entries at off: each definition's
// name (its first Verdaux), hash and flags, within maxVersions entries.
func readVerdef(r *fileReader, order binary.ByteOrder, off, strtab uint64) ([]version, error) {
	var out []version
	for {
		if len(out) == maxVersions {
			return nil, fmt.Errorf("more than %d version definitions", maxVersions)
		}
		b, err := r.at(off, 20) // Elf_Verdef
		if err != nil {
			return nil, fmt.Errorf("read version definitions: %w", err)
		}
		vdVersion, vdFlags, vdHash, vdAux, vdNext := order.Uint16(b), order.Uint16(b[2:]), order.Uint32(b[8:]), order.Uint32(b[12:]), order.Uint32(b[16:])
		if vdVersion != 1 {
			return nil, fmt.Errorf("unsupported version %d of Verdef record", vdVersion)
		}
		a, err := r.at(off+uint64(vdAux), 8) // Elf_Verdaux
		if err != nil {
			return nil, fmt.Errorf("read version definitions: %w", err)
		}
		name, err := r.cstring(strtab+uint64(order.Uint32(a)), maxDynString)
		if err != nil {
			return nil, fmt.Errorf("read version definitions: %w", err)
		}
		out = append(out, version{name: name, hash: vdHash, flags: vdFlags})
		if vdNext == 0 {
			return out, nil
		}
		off += uint64(vdNext)
	}
}

// elfHash is the SysV ELF hash, which version entries carry.
func elfHash(name string) uint32 {
	var h uint32
	for i := 0; i < len(name); i++ {
		h = h<<4 + uint32(name[i])
		g := h & 0xf0000000
		if g != 0 {
			h ^= g >> 24
		}
		h &^= g
	}
	return h
}
