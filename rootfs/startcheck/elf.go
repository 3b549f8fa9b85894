package startcheck

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

const (
	// headSize is what the check reads of a file first: the ELF header
	// and, in practice, the program headers and PT_INTERP, or a "#!" line.
	headSize = 4 << 10
	// maxHead bounds the second read for an ELF whose program headers or
	// loader path lie beyond headSize.
	maxHead = 64 << 10
	// maxInterp is the kernel's limit on PT_INTERP (PATH_MAX).
	maxInterp = 4096
)

// elfInfo is what the check needs from an ELF header.
type elfInfo struct {
	class   elf.Class
	data    elf.Data
	machine elf.Machine
	typ     elf.Type
	interp  string // PT_INTERP without its NUL; "" for a static binary
	// ident is the header's e_ident, which glibc's loader compares whole
	// for a library (version, OS ABI, padding).
	ident [elf.EI_NIDENT]byte
	// version is e_version, phentsize e_phentsize: the loader refuses a
	// library whose values are not the current ones.
	version   uint32
	phentsize uint16
	// progs are the program headers: the loader finds the dynamic section
	// and maps addresses to file offsets through them.
	progs []elf.ProgHeader
}

// errShort means the header bytes end before the headers they describe.
var errShort = errors.New("ELF headers extend beyond the bytes read")

func isELF(head []byte) bool { return bytes.HasPrefix(head, []byte(elf.ELFMAG)) }

// parseELF reads the ELF header, program headers and PT_INTERP from head,
// the first bytes of a file.
func parseELF(head []byte) (elfInfo, error) {
	info, err := parseHeaders(head)
	if err != nil {
		return elfInfo{}, err
	}
	for _, p := range info.progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		if p.Filesz < 2 || p.Filesz > maxInterp {
			return elfInfo{}, fmt.Errorf("PT_INTERP of %d bytes", p.Filesz)
		}
		if p.Off > uint64(len(head)) || p.Filesz > uint64(len(head))-p.Off {
			return elfInfo{}, errShort
		}
		s := head[p.Off : p.Off+p.Filesz]
		// The kernel requires the NUL at the end and stops at the first.
		if s[len(s)-1] != 0 {
			return elfInfo{}, errors.New("PT_INTERP not NUL-terminated")
		}
		info.interp, _, _ = strings.Cut(string(s), "\x00")
		break
	}
	return info, nil
}

// parseHeaders reads the ELF header and program headers from head, the
// first bytes of a file: all the loader reads of a library before it
// maps it. It uses debug/elf on a copy whose section header fields are
// zeroed: section headers sit at the end of the file, beyond head, and
// the check needs none of them.
func parseHeaders(head []byte) (elfInfo, error) {
	if !isELF(head) || len(head) < elf.EI_NIDENT {
		return elfInfo{}, errors.New("not an ELF file")
	}
	b := bytes.Clone(head)
	var shoff, shoffLen, shnum, shend int
	switch elf.Class(b[elf.EI_CLASS]) {
	case elf.ELFCLASS32:
		shoff, shoffLen, shnum, shend = 32, 4, 48, 52
	case elf.ELFCLASS64:
		shoff, shoffLen, shnum, shend = 40, 8, 60, 64
	default:
		return elfInfo{}, fmt.Errorf("unknown ELF class %d", b[elf.EI_CLASS])
	}
	if len(b) < shend {
		return elfInfo{}, errShort
	}
	clear(b[shoff : shoff+shoffLen]) // e_shoff
	clear(b[shnum:shend])            // e_shnum, e_shstrndx
	// A program header count of PN_XNUM is stored in section 0, which is
	// not read; the kernel rejects such files too.
	if phnumField(b) == 0xffff {
		return elfInfo{}, errors.New("program header count in section 0 (PN_XNUM)")
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return elfInfo{}, errShort
		}
		return elfInfo{}, err
	}
	info := elfInfo{class: f.Class, data: f.Data, machine: f.Machine, typ: f.Type,
		version: uint32(f.Version), phentsize: phentsizeField(b), progs: make([]elf.ProgHeader, 0, len(f.Progs))}
	copy(info.ident[:], b)
	for _, p := range f.Progs {
		info.progs = append(info.progs, p.ProgHeader)
	}
	return info, nil
}

// phentsizeField returns e_phentsize of an ELF header long enough to
// hold it (parseELF checked).
func phentsizeField(b []byte) uint16 {
	off := 42
	if elf.Class(b[elf.EI_CLASS]) == elf.ELFCLASS64 {
		off = 54
	}
	if elf.Data(b[elf.EI_DATA]) == elf.ELFDATA2MSB {
		return binary.BigEndian.Uint16(b[off:])
	}
	return binary.LittleEndian.Uint16(b[off:])
}

// phnumField returns e_phnum of an ELF header at least 64 bytes long.
func phnumField(b []byte) uint16 {
	off := 44
	if elf.Class(b[elf.EI_CLASS]) == elf.ELFCLASS64 {
		off = 56
	}
	if len(b) < off+2 {
		return 0
	}
	if elf.Data(b[elf.EI_DATA]) == elf.ELFDATA2MSB {
		return binary.BigEndian.Uint16(b[off:])
	}
	return binary.LittleEndian.Uint16(b[off:])
}

// archSpec is what an image platform requires of an ELF.
type archSpec struct {
	machine elf.Machine
	class   elf.Class
	data    elf.Data
	// compat is a machine the platform's kernel usually runs too (32-bit
	// x86 on amd64, 32-bit ARM on arm64), depending on its configuration.
	compat elf.Machine
}

// arches maps GOARCH to ELF identification.
var arches = map[string]archSpec{
	"amd64":    {elf.EM_X86_64, elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_386},
	"arm64":    {elf.EM_AARCH64, elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_ARM},
	"386":      {elf.EM_386, elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_NONE},
	"arm":      {elf.EM_ARM, elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_NONE},
	"riscv64":  {elf.EM_RISCV, elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_NONE},
	"ppc64le":  {elf.EM_PPC64, elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_NONE},
	"ppc64":    {elf.EM_PPC64, elf.ELFCLASS64, elf.ELFDATA2MSB, elf.EM_NONE},
	"s390x":    {elf.EM_S390, elf.ELFCLASS64, elf.ELFDATA2MSB, elf.EM_NONE},
	"loong64":  {elf.EM_LOONGARCH, elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_NONE},
	"mips64le": {elf.EM_MIPS, elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_NONE},
	"mips64":   {elf.EM_MIPS, elf.ELFCLASS64, elf.ELFDATA2MSB, elf.EM_NONE},
	"mipsle":   {elf.EM_MIPS, elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_NONE},
	"mips":     {elf.EM_MIPS, elf.ELFCLASS32, elf.ELFDATA2MSB, elf.EM_NONE},
}

// machineNames are the names messages use, as file(1) prints them.
var machineNames = map[elf.Machine]string{
	elf.EM_X86_64:    "x86-64",
	elf.EM_AARCH64:   "AArch64",
	elf.EM_386:       "Intel 80386",
	elf.EM_ARM:       "ARM",
	elf.EM_RISCV:     "RISC-V",
	elf.EM_PPC64:     "64-bit PowerPC",
	elf.EM_PPC:       "PowerPC",
	elf.EM_S390:      "IBM S/390",
	elf.EM_LOONGARCH: "LoongArch",
	elf.EM_MIPS:      "MIPS",
}

func machineName(m elf.Machine) string {
	if n, ok := machineNames[m]; ok {
		return n
	}
	return m.String()
}

// elfHead reads the header of the ELF at p and parses it, reading more
// (up to maxHead) when its program headers or loader path lie beyond the
// first read.
func (c *checker) elfHead(p string, head []byte) (elfInfo, error) {
	info, err := parseELF(head)
	if errors.Is(err, errShort) && len(head) >= headSize {
		more, rerr := c.fs.ReadHead(p, maxHead)
		if rerr != nil {
			return elfInfo{}, fmt.Errorf("read header: %w", rerr)
		}
		info, err = parseELF(more)
	}
	return info, err
}

// checkELF checks an ELF's identification against the image platform,
// its loader and the libraries the loader would load, and returns the
// loader path.
func (c *checker) checkELF(lbl, p string, head []byte) string {
	info, err := c.elfHead(p, head)
	if err != nil {
		if errors.Is(err, errShort) && len(head) < headSize {
			c.fail("%s is a truncated ELF file (%d bytes)", lbl, len(head))
		} else {
			c.warn("%s: cannot parse ELF headers: %s", lbl, errText(err))
		}
		return ""
	}
	if info.typ != elf.ET_EXEC && info.typ != elf.ET_DYN {
		c.fail("%s is an ELF %s, not an executable", lbl, strings.ToLower(strings.TrimPrefix(info.typ.String(), "ET_")))
		return ""
	}
	if !c.machineOK(lbl, info) {
		return ""
	}
	if info.interp == "" {
		return ""
	}
	if loader, linfo, ok := c.checkLoader(lbl, info); ok {
		c.checkLibraries(lbl, p, info, info.interp, loader, linfo)
	}
	return info.interp
}

// machineOK records a problem when info's architecture is not the
// image's and reports whether checking should continue.
func (c *checker) machineOK(lbl string, info elfInfo) bool {
	want, ok := arches[c.spec.Arch]
	if !ok {
		if c.spec.Arch != "" {
			c.warn("%s: architecture %s unknown to the check; ELF machine not checked", lbl, quote(c.spec.Arch))
		}
		return true
	}
	switch {
	case info.machine == want.machine && info.class == want.class && info.data == want.data:
		return true
	case info.machine == want.compat && want.compat != elf.EM_NONE:
		c.warn("%s is an ELF for %s, the image is %s: it runs only if the kernel has %s compatibility", lbl, machineName(info.machine), c.spec.Arch, machineName(info.machine))
		return true
	case info.machine == want.machine:
		c.fail("%s is an ELF for %s (%s, %s), the image is %s", lbl, machineName(info.machine), classBits(info.class), endian(info.data), c.spec.Arch)
	default:
		c.fail("%s is an ELF for %s, the image is %s", lbl, machineName(info.machine), c.spec.Arch)
	}
	return false
}

func classBits(c elf.Class) string {
	if c == elf.ELFCLASS32 {
		return "32-bit"
	}
	return "64-bit"
}

func endian(d elf.Data) string {
	if d == elf.ELFDATA2MSB {
		return "big-endian"
	}
	return "little-endian"
}

// checkLoader checks that the PT_INTERP loader of an ELF resolves in the
// image to an ELF of the image's architecture the check's user may
// execute. It returns the loader's file and header, ok when the loader
// can run the program.
func (c *checker) checkLoader(lbl string, info elfInfo) (string, elfInfo, bool) {
	// The kernel opens a relative PT_INTERP from the process's working
	// directory.
	p := cleanAbs(c.wd, info.interp)
	t, rerr := c.lookup(p)
	switch {
	case rerr == nil:
	case rerr.kind == errLimit:
		return "", elfInfo{}, false
	case rerr.kind == errNotExist:
		c.fail("%s: loader %s not found%s", lbl, quote(info.interp), rerr.notFound())
		return "", elfInfo{}, false
	default:
		c.fail("%s: loader %s: %v", lbl, quote(info.interp), rerr)
		return "", elfInfo{}, false
	}
	llbl := fmt.Sprintf("%s: loader %s", lbl, label(p, t.resolved))
	if why := c.notExecutable(t); why != "" {
		c.fail("%s is %s", llbl, why)
		return "", elfInfo{}, false
	}
	head, err := c.fs.ReadHead(t.resolved, headSize)
	if err != nil {
		c.warn("%s: read header: %s", llbl, errText(err))
		return "", elfInfo{}, false
	}
	if !isELF(head) {
		c.fail("%s is not an ELF file", llbl)
		return "", elfInfo{}, false
	}
	linfo, err := c.elfHead(t.resolved, head)
	if err != nil {
		c.warn("%s: cannot parse ELF headers: %s", llbl, errText(err))
		return "", elfInfo{}, false
	}
	if !c.machineOK(llbl, linfo) {
		return "", elfInfo{}, false
	}
	// The loader loads objects of the program's kind: a 32-bit program
	// needs a 32-bit loader even where the platform is 64-bit.
	if identOf(linfo) != identOf(info) {
		c.fail("%s is an ELF for %s (%s, %s), the program for %s (%s, %s)", llbl,
			machineName(linfo.machine), classBits(linfo.class), endian(linfo.data), machineName(info.machine), classBits(info.class), endian(info.data))
		return "", elfInfo{}, false
	}
	return t.resolved, linfo, true
}
