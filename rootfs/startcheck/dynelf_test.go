package startcheck

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"io/fs"
)

// dynOpts describes a crafted dynamic ELF: a program or a shared object
// with a dynamic section, the tables the loader reads, and nothing else.
type dynOpts struct {
	class   elf.Class        // ELFCLASS64 when 0
	order   binary.ByteOrder // little-endian when nil
	machine elf.Machine      // EM_X86_64 when 0
	typ     elf.Type         // ET_DYN when 0
	interp  string           // PT_INTERP, "" for none
	needed  []string
	soname  string
	rpath   *string
	runpath *string
	flags1  elf.DynFlag1
	needs   []dynNeed
	defs    []string // version names defined; the first is the base (VER_FLG_BASE)
	// far puts the dynamic section this many bytes into the file, as in
	// a large program.
	far int
	// noDynamic leaves out PT_DYNAMIC.
	noDynamic bool
}

// dynNeed is a DT_VERNEED entry of dynOpts: versions of one file.
type dynNeed struct {
	file string
	vers []string // a "~" prefix marks a weak reference
}

// mkDynELF crafts the ELF dynOpts describes. Its layout: headers, loader
// path, string table, version tables, then (after far bytes) the dynamic
// section; one PT_LOAD maps the whole file.
func mkDynELF(o dynOpts) []byte {
	elfDefaults(&o.class, &o.order, &o.typ, elf.ET_DYN)
	if o.machine == 0 {
		o.machine = elf.EM_X86_64
	}
	is64 := o.class == elf.ELFCLASS64
	ehsize, phentsize, dynsize := 52, 32, 8
	if is64 {
		ehsize, phentsize, dynsize = 64, 56, 16
	}
	base := uint64(0)
	if o.typ == elf.ET_EXEC {
		base = 0x400000
	}
	nph := 1
	if o.interp != "" {
		nph++
	}
	if !o.noDynamic {
		nph++
	}
	// The string table, starting with the empty string.
	var strtab bytes.Buffer
	strtab.WriteByte(0)
	str := func(s string) uint64 {
		off := uint64(strtab.Len())
		strtab.WriteString(s)
		strtab.WriteByte(0)
		return off
	}
	var dyn [][2]uint64
	for _, n := range o.needed {
		dyn = append(dyn, [2]uint64{uint64(elf.DT_NEEDED), str(n)})
	}
	if o.soname != "" {
		dyn = append(dyn, [2]uint64{uint64(elf.DT_SONAME), str(o.soname)})
	}
	if o.rpath != nil {
		dyn = append(dyn, [2]uint64{uint64(elf.DT_RPATH), str(*o.rpath)})
	}
	if o.runpath != nil {
		dyn = append(dyn, [2]uint64{uint64(elf.DT_RUNPATH), str(*o.runpath)})
	}
	if o.flags1 != 0 {
		dyn = append(dyn, [2]uint64{uint64(elf.DT_FLAGS_1), uint64(o.flags1)})
	}
	// Version needs: Verneed (16 bytes) then its Vernaux (16 bytes each).
	var verneed bytes.Buffer
	w := func(b *bytes.Buffer, v any) { _ = binary.Write(b, o.order, v) }
	for i, n := range o.needs {
		next := uint32(16 + 16*len(n.vers))
		if i == len(o.needs)-1 {
			next = 0
		}
		w(&verneed, struct {
			Version, Cnt    uint16
			File, Aux, Next uint32
		}{1, uint16(len(n.vers)), uint32(str(n.file)), 16, next})
		for j, v := range n.vers {
			flags := uint16(0)
			if v[0] == '~' {
				v, flags = v[1:], verFlgWeak
			}
			anext := uint32(16)
			if j == len(n.vers)-1 {
				anext = 0
			}
			w(&verneed, struct {
				Hash         uint32
				Flags, Other uint16
				Name, Next   uint32
			}{elfHash(v), flags, uint16(2 + j), uint32(str(v)), anext})
		}
	}
	// Version definitions: Verdef (20 bytes) and one Verdaux (8 bytes).
	var verdef bytes.Buffer
	for i, name := range o.defs {
		flags := uint16(0)
		if i == 0 {
			flags = verFlgBase
		}
		next := uint32(28)
		if i == len(o.defs)-1 {
			next = 0
		}
		w(&verdef, struct {
			Version, Flags, Ndx, Cnt uint16
			Hash, Aux, Next          uint32
		}{1, flags, uint16(i + 1), 1, elfHash(name), 20, next})
		w(&verdef, struct{ Name, Next uint32 }{uint32(str(name)), 0})
	}
	// Layout.
	off := uint64(ehsize + nph*phentsize)
	interpOff := off
	if o.interp != "" {
		off += uint64(len(o.interp) + 1)
	}
	strOff := off
	off += uint64(strtab.Len())
	off = (off + 7) &^ 7
	needOff := off
	off += uint64(verneed.Len())
	defOff := off
	off += uint64(verdef.Len())
	off = (off + 7) &^ 7
	dynOff := off + uint64(o.far)
	dyn = append(dyn, [2]uint64{uint64(elf.DT_STRTAB), base + strOff}, [2]uint64{uint64(elf.DT_STRSZ), uint64(strtab.Len())})
	if len(o.needs) > 0 {
		dyn = append(dyn, [2]uint64{uint64(elf.DT_VERNEED), base + needOff}, [2]uint64{uint64(elf.DT_VERNEEDNUM), uint64(len(o.needs))})
	}
	if len(o.defs) > 0 {
		dyn = append(dyn, [2]uint64{uint64(elf.DT_VERDEF), base + defOff}, [2]uint64{uint64(elf.DT_VERDEFNUM), uint64(len(o.defs))})
	}
	dyn = append(dyn, [2]uint64{0, 0})
	end := dynOff + uint64(len(dyn)*dynsize) + 64

	var b bytes.Buffer
	data := elf.ELFDATA2LSB
	if o.order == binary.BigEndian {
		data = elf.ELFDATA2MSB
	}
	ident := [16]byte{0x7f, 'E', 'L', 'F', byte(o.class), byte(data), 1}
	type ph struct {
		typ            elf.ProgType
		off, va, fsize uint64
	}
	phs := []ph{}
	if o.interp != "" {
		phs = append(phs, ph{elf.PT_INTERP, interpOff, base + interpOff, uint64(len(o.interp) + 1)})
	}
	phs = append(phs, ph{elf.PT_LOAD, 0, base, end})
	if !o.noDynamic {
		phs = append(phs, ph{elf.PT_DYNAMIC, dynOff, base + dynOff, uint64(len(dyn) * dynsize)})
	}
	if is64 {
		w(&b, elf.Header64{Ident: ident, Type: uint16(o.typ), Machine: uint16(o.machine), Version: 1,
			Entry: base + 0x1000, Phoff: uint64(ehsize), Ehsize: uint16(ehsize), Phentsize: uint16(phentsize), Phnum: uint16(nph), Shentsize: 64})
		for _, p := range phs {
			w(&b, elf.Prog64{Type: uint32(p.typ), Flags: uint32(elf.PF_R), Off: p.off, Vaddr: p.va, Paddr: p.va, Filesz: p.fsize, Memsz: p.fsize, Align: 8})
		}
	} else {
		w(&b, elf.Header32{Ident: ident, Type: uint16(o.typ), Machine: uint16(o.machine), Version: 1,
			Entry: uint32(base + 0x1000), Phoff: uint32(ehsize), Ehsize: uint16(ehsize), Phentsize: uint16(phentsize), Phnum: uint16(nph), Shentsize: 40})
		for _, p := range phs {
			w(&b, elf.Prog32{Type: uint32(p.typ), Flags: uint32(elf.PF_R), Off: uint32(p.off), Vaddr: uint32(p.va), Paddr: uint32(p.va), Filesz: uint32(p.fsize), Memsz: uint32(p.fsize), Align: 4})
		}
	}
	if o.interp != "" {
		b.WriteString(o.interp)
		b.WriteByte(0)
	}
	b.Write(strtab.Bytes())
	b.Write(make([]byte, int(needOff)-b.Len()))
	b.Write(verneed.Bytes())
	b.Write(verdef.Bytes())
	b.Write(make([]byte, int(dynOff)-b.Len()))
	for _, d := range dyn {
		if is64 {
			w(&b, d)
		} else {
			w(&b, [2]uint32{uint32(d[0]), uint32(d[1])})
		}
	}
	b.Write(make([]byte, int(end)-b.Len()))
	return b.Bytes()
}

// ptr returns a pointer to s, for dynOpts' optional paths.
func ptr(s string) *string { return &s }

// glibcTree is a merged-/usr amd64 tree whose loader and libc are crafted
// dynamic objects: libc.so.6 defines GLIBC_2.2.5 to GLIBC_2.36 and needs
// the loader, as Debian's does. Programs are added with prog.
func glibcTree() *memFS {
	m := newFS()
	m.link("/bin", "usr/bin").link("/lib", "usr/lib").link("/lib64", "usr/lib64").link("/sbin", "usr/sbin")
	m.dir("/usr/sbin").dir("/usr/local/bin").dir("/usr/local/sbin").dir("/tmp")
	m.file("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", 0o755, mkDynELF(dynOpts{soname: "ld-linux-x86-64.so.2",
		defs: []string{"ld-linux-x86-64.so.2", "GLIBC_2.2.5", "GLIBC_2.3", "GLIBC_PRIVATE"}}))
	m.link("/usr/lib64/ld-linux-x86-64.so.2", "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	m.file("/usr/lib/x86_64-linux-gnu/libc.so.6", 0o755, mkDynELF(dynOpts{soname: "libc.so.6", interp: amd64Loader,
		needed: []string{"ld-linux-x86-64.so.2"}, needs: []dynNeed{{"ld-linux-x86-64.so.2", []string{"GLIBC_2.3", "GLIBC_PRIVATE"}}},
		defs: []string{"libc.so.6", "GLIBC_2.2.5", "GLIBC_2.3", "GLIBC_2.34", "GLIBC_2.36", "GLIBC_PRIVATE"}}))
	m.file("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\nweb:x:33:33::/var/www:/bin/sh\n"))
	m.file("/etc/group", 0o644, []byte("root:x:0:\napp:x:1000:\nweb:x:33:\nshared:x:2000:app,web\n"))
	return m
}

// prog adds a program at p with o's dynamic section, run by the amd64
// loader.
func (m *memFS) prog(p string, mode fs.FileMode, o dynOpts) *memFS {
	o.interp = amd64Loader
	if o.typ == 0 {
		o.typ = elf.ET_DYN
	}
	return m.file(p, mode, mkDynELF(o))
}

// lib adds a shared library at p.
func (m *memFS) lib(p string, o dynOpts) *memFS { return m.file(p, 0o644, mkDynELF(o)) }
