package main

import (
	"debug/elf"
	"encoding/binary"
)

// helloMessage is what the sample template's /bin/hello prints.
const helloMessage = "hello from a Cube template\n"

// helloELF returns /bin/hello of the sample image: a complete static
// x86-64 Linux program of a few hundred bytes (write(1, message), then
// exit(0)), so the template's command really runs and passes the start
// check, with no binary of the host in the image.
func helloELF() []byte {
	const (
		base     = 0x400000
		ehdrSize = 64
		phdrSize = 56
		entry    = base + ehdrSize + phdrSize
	)
	code := []byte{
		0xb8, 0x01, 0x00, 0x00, 0x00, // mov eax, 1 (write)
		0xbf, 0x01, 0x00, 0x00, 0x00, // mov edi, 1 (stdout)
		0x48, 0x8d, 0x35, 0x10, 0x00, 0x00, 0x00, // lea rsi, [rip+16]: the message after this code
		0xba, byte(len(helloMessage)), 0x00, 0x00, 0x00, // mov edx, len
		0x0f, 0x05, // syscall
		0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60 (exit)
		0x31, 0xff, // xor edi, edi
		0x0f, 0x05, // syscall
	}
	prog := append(code, helloMessage...)
	b := make([]byte, ehdrSize+phdrSize, ehdrSize+phdrSize+len(prog))
	le := binary.LittleEndian
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le.PutUint16(b[16:], uint16(elf.ET_EXEC))
	le.PutUint16(b[18:], uint16(elf.EM_X86_64))
	le.PutUint32(b[20:], uint32(elf.EV_CURRENT))
	le.PutUint64(b[24:], entry)    // e_entry
	le.PutUint64(b[32:], ehdrSize) // e_phoff
	le.PutUint16(b[52:], ehdrSize) // e_ehsize
	le.PutUint16(b[54:], phdrSize) // e_phentsize
	le.PutUint16(b[56:], 1)        // e_phnum
	le.PutUint16(b[58:], 64)       // e_shentsize
	// One PT_LOAD mapping the whole file, readable and executable.
	ph := b[ehdrSize:]
	le.PutUint32(ph[0:], uint32(elf.PT_LOAD))
	le.PutUint32(ph[4:], uint32(elf.PF_R|elf.PF_X))
	le.PutUint64(ph[16:], base) // p_vaddr
	le.PutUint64(ph[24:], base) // p_paddr
	size := uint64(ehdrSize + phdrSize + len(prog))
	le.PutUint64(ph[32:], size)   // p_filesz
	le.PutUint64(ph[40:], size)   // p_memsz
	le.PutUint64(ph[48:], 0x1000) // p_align
	return append(b, prog...)
}
