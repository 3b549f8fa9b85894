package startcheck

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io/fs"
	"path"
)

// memFS is an image tree in memory: the FS the builder gives the check,
// without the builder.
type memFS struct {
	entries map[string]Entry
	data    map[string][]byte
	reads   map[string]int // largest n asked of ReadHead per path
}

var _ FS = (*memFS)(nil)

func newFS() *memFS {
	m := &memFS{entries: map[string]Entry{}, data: map[string][]byte{}, reads: map[string]int{}}
	m.entries["/"] = Entry{Mode: fs.ModeDir | 0o755}
	return m
}

func (m *memFS) Lstat(p string) (Entry, error) {
	if p != path.Clean(p) || !path.IsAbs(p) {
		return Entry{}, fmt.Errorf("lstat %q: not an absolute clean path", p)
	}
	e, ok := m.entries[p]
	if !ok {
		return Entry{}, fmt.Errorf("lstat %q: %w", p, fs.ErrNotExist)
	}
	return e, nil
}

func (m *memFS) ReadHead(p string, n int) ([]byte, error) {
	e, ok := m.entries[p]
	if !ok {
		return nil, fmt.Errorf("read %q: %w", p, fs.ErrNotExist)
	}
	if !e.Mode.IsRegular() {
		return nil, fmt.Errorf("read %q: not a regular file", p)
	}
	m.reads[p] = max(m.reads[p], n)
	d := m.data[p]
	return bytes.Clone(d[:min(n, len(d))]), nil
}

func (m *memFS) ReadAt(p string, b []byte, off int64) (int, error) {
	e, ok := m.entries[p]
	if !ok {
		return 0, fmt.Errorf("read %q: %w", p, fs.ErrNotExist)
	}
	if !e.Mode.IsRegular() {
		return 0, fmt.Errorf("read %q: not a regular file", p)
	}
	return bytes.NewReader(m.data[p]).ReadAt(b, off)
}

// mkdirs adds the parents of p.
func (m *memFS) mkdirs(p string) {
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		if _, ok := m.entries[d]; !ok {
			m.entries[d] = Entry{Mode: fs.ModeDir | 0o755}
		}
	}
}

func (m *memFS) dir(p string) *memFS {
	m.mkdirs(p)
	m.entries[p] = Entry{Mode: fs.ModeDir | 0o755}
	return m
}

func (m *memFS) file(p string, mode fs.FileMode, content []byte) *memFS {
	m.mkdirs(p)
	m.entries[p] = Entry{Mode: mode}
	m.data[p] = content
	return m
}

func (m *memFS) link(p, target string) *memFS {
	m.mkdirs(p)
	m.entries[p] = Entry{Mode: fs.ModeSymlink | 0o777, Target: target}
	return m
}

// elfOpts describes a crafted ELF.
type elfOpts struct {
	class   elf.Class
	order   binary.ByteOrder
	machine elf.Machine
	typ     elf.Type
	interp  string // PT_INTERP; "" for static
	pad     int    // bytes between the program headers and the loader path
}

// elfDefaults fills the identification a crafted ELF leaves out: 64-bit,
// little-endian, of type defaultType.
func elfDefaults(class *elf.Class, order *binary.ByteOrder, typ *elf.Type, defaultType elf.Type) {
	if *class == 0 {
		*class = elf.ELFCLASS64
	}
	if *order == nil {
		*order = binary.LittleEndian
	}
	if *typ == 0 {
		*typ = defaultType
	}
}

// mkELF crafts a minimal ELF: header, a PT_LOAD and an optional
// PT_INTERP program header, the loader path. Enough for the kernel's and
// the check's header reading; there is no code.
func mkELF(o elfOpts) []byte {
	elfDefaults(&o.class, &o.order, &o.typ, elf.ET_EXEC)
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, o.order, v) }
	data := elf.ELFDATA2LSB
	if o.order == binary.BigEndian {
		data = elf.ELFDATA2MSB
	}
	nph := 1
	if o.interp != "" {
		nph = 2
	}
	ident := [16]byte{0x7f, 'E', 'L', 'F', byte(o.class), byte(data), 1}
	if o.class == elf.ELFCLASS64 {
		phoff := uint64(64)
		interpOff := phoff + uint64(nph*56) + uint64(o.pad)
		w(elf.Header64{Ident: ident, Type: uint16(o.typ), Machine: uint16(o.machine), Version: 1,
			Entry: 0x401000, Phoff: phoff, Shoff: 1 << 20, Ehsize: 64, Phentsize: 56, Phnum: uint16(nph), Shentsize: 64, Shnum: 30, Shstrndx: 29})
		if o.interp != "" {
			w(elf.Prog64{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Off: interpOff, Vaddr: interpOff, Paddr: interpOff,
				Filesz: uint64(len(o.interp) + 1), Memsz: uint64(len(o.interp) + 1), Align: 1})
		}
		w(elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X), Vaddr: 0x400000, Paddr: 0x400000, Filesz: 0x1000, Memsz: 0x1000, Align: 0x1000})
	} else {
		phoff := uint32(52)
		interpOff := phoff + uint32(nph*32) + uint32(o.pad)
		w(elf.Header32{Ident: ident, Type: uint16(o.typ), Machine: uint16(o.machine), Version: 1,
			Entry: 0x8049000, Phoff: phoff, Shoff: 1 << 20, Ehsize: 52, Phentsize: 32, Phnum: uint16(nph), Shentsize: 40, Shnum: 30, Shstrndx: 29})
		if o.interp != "" {
			w(elf.Prog32{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Off: interpOff, Vaddr: interpOff, Paddr: interpOff,
				Filesz: uint32(len(o.interp) + 1), Memsz: uint32(len(o.interp) + 1), Align: 1})
		}
		w(elf.Prog32{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X), Vaddr: 0x8048000, Paddr: 0x8048000, Filesz: 0x1000, Memsz: 0x1000, Align: 0x1000})
	}
	if o.interp != "" {
		b.Write(make([]byte, o.pad))
		b.WriteString(o.interp)
		b.WriteByte(0)
	}
	// Code and data would follow; a little padding keeps the file from
	// looking truncated.
	b.Write(make([]byte, 512))
	return b.Bytes()
}

const (
	amd64Loader = "/lib64/ld-linux-x86-64.so.2"
	arm64Loader = "/lib/ld-linux-aarch64.so.1"
)

var (
	amd64Dyn    = mkELF(elfOpts{machine: elf.EM_X86_64, typ: elf.ET_DYN, interp: amd64Loader})
	amd64Static = mkELF(elfOpts{machine: elf.EM_X86_64})
	amd64Lib    = mkELF(elfOpts{machine: elf.EM_X86_64, typ: elf.ET_DYN})
	arm64Dyn    = mkELF(elfOpts{machine: elf.EM_AARCH64, typ: elf.ET_DYN, interp: arm64Loader})
	arm64Static = mkELF(elfOpts{machine: elf.EM_AARCH64})
)

// debianAmd64 is a merged-/usr amd64 tree as Debian and Ubuntu images lay
// it out: /bin, /sbin, /lib, /lib64 link into /usr, the loader sits in
// /usr/lib/x86_64-linux-gnu and /lib64 holds a link to it.
func debianAmd64() *memFS {
	m := newFS()
	m.link("/bin", "usr/bin").link("/sbin", "usr/sbin").link("/lib", "usr/lib").link("/lib64", "usr/lib64")
	m.file("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", 0o755, amd64Lib)
	m.link("/usr/lib64/ld-linux-x86-64.so.2", "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	m.file("/usr/bin/dash", 0o755, amd64Dyn)
	m.link("/usr/bin/sh", "dash")
	m.file("/usr/bin/bash", 0o755, amd64Dyn)
	m.file("/usr/bin/env", 0o755, amd64Dyn)
	m.file("/usr/bin/python3.11", 0o755, amd64Dyn)
	m.link("/usr/bin/python3", "python3.11")
	m.dir("/usr/local/bin").dir("/usr/local/sbin").dir("/usr/sbin").dir("/tmp")
	m.file("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/bash\nwww-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\n"))
	m.file("/etc/group", 0o644, []byte("root:x:0:\nwww-data:x:33:\n"))
	return m
}
