package images

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
)

// elfMachines are the machines StaticELF writes, by GOARCH.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "riscv64": elf.EM_RISCV,
	"ppc64le": elf.EM_PPC64, "loong64": elf.EM_LOONGARCH,
}

// StaticELF returns size bytes (at least 64) that read as a static 64-bit
// little-endian executable of arch (a GOARCH): a valid ELF header and no
// program headers, then zeros. It does not run; it is what a start check
// reads of a real static binary, so test images can have commands that
// pass it without a binary of the host.
func StaticELF(arch string, size int) []byte {
	m, ok := elfMachines[arch]
	if !ok {
		panic(fmt.Sprintf("images: no ELF machine for %q", arch))
	}
	b := make([]byte, max(size, 64))
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le := binary.LittleEndian
	le.PutUint16(b[16:], uint16(elf.ET_EXEC))
	le.PutUint16(b[18:], uint16(m))
	le.PutUint32(b[20:], uint32(elf.EV_CURRENT))
	le.PutUint16(b[52:], 64) // e_ehsize
	le.PutUint16(b[54:], 56) // e_phentsize
	le.PutUint16(b[58:], 64) // e_shentsize
	return b
}
