package startcheck

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"strings"
	"testing"
)

func TestParseShebang(t *testing.T) {
	long := "#!/" + strings.Repeat("x", 300) + "\n"
	longArg := "#!/bin/sh " + strings.Repeat("a", 300) + "\n"
	tests := []struct {
		in      string
		want    shebang
		wantErr string
	}{
		{"#!/bin/sh\n", shebang{interp: "/bin/sh"}, ""},
		{"#! /bin/sh\n", shebang{interp: "/bin/sh"}, ""},
		{"#!/bin/sh", shebang{interp: "/bin/sh"}, ""},
		{"#!\t/usr/bin/env  python3 -u \n", shebang{interp: "/usr/bin/env", arg: "python3 -u"}, ""},
		{"#!/bin/sh\r\n", shebang{interp: "/bin/sh\r"}, ""},
		{"#!/usr/bin/env python3\r\n", shebang{interp: "/usr/bin/env", arg: "python3\r"}, ""},
		{"#!/bin/sh\x00junk\n", shebang{interp: "/bin/sh"}, ""},
		{"#!\n", shebang{}, "no interpreter"},
		{"#!   \t\n/bin/sh\n", shebang{}, "no interpreter"},
		{"echo\n", shebang{}, `no "#!"`},
		{long, shebang{}, "longer than the 256 bytes"},
		{longArg, shebang{interp: "/bin/sh", arg: strings.Repeat("a", 256-len("#!/bin/sh "))}, ""},
	}
	for _, tt := range tests {
		got, err := parseShebang([]byte(tt.in))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseShebang(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseShebang(%q) = %+v, %v, want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestEnvName(t *testing.T) {
	tests := []struct {
		arg  string
		name string
		ok   bool
	}{
		{"python3", "python3", true},
		{"-S python3 -u", "python3", true},
		{"-S A=1 -i node", "node", true},
		{"-i python3", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		if name, ok := envName(tt.arg); name != tt.name || ok != tt.ok {
			t.Errorf("envName(%q) = %q, %v, want %q, %v", tt.arg, name, ok, tt.name, tt.ok)
		}
	}
}

func TestParseELF(t *testing.T) {
	// ident is what the tests compare of an elfInfo.
	type ident struct {
		class   elf.Class
		data    elf.Data
		machine elf.Machine
		typ     elf.Type
		interp  string
	}
	tests := []struct {
		name string
		in   []byte
		want ident
	}{
		{"Amd64Dynamic", amd64Dyn, ident{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_X86_64, elf.ET_DYN, amd64Loader}},
		{"Arm64Static", arm64Static, ident{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_AARCH64, elf.ET_EXEC, ""}},
		{"I386Dynamic", mkELF(elfOpts{class: elf.ELFCLASS32, machine: elf.EM_386, interp: "/lib/ld-linux.so.2"}),
			ident{elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_386, elf.ET_EXEC, "/lib/ld-linux.so.2"}},
		{"S390xBigEndian", mkELF(elfOpts{machine: elf.EM_S390, order: binary.BigEndian, interp: "/lib/ld64.so.1"}),
			ident{elf.ELFCLASS64, elf.ELFDATA2MSB, elf.EM_S390, elf.ET_EXEC, "/lib/ld64.so.1"}},
	}
	for _, tt := range tests {
		info, err := parseELF(tt.in)
		if got := (ident{info.class, info.data, info.machine, info.typ, info.interp}); err != nil || got != tt.want {
			t.Errorf("parseELF(%s) = %+v, %v, want %+v", tt.name, got, err, tt.want)
		}
	}
	short := mkELF(elfOpts{machine: elf.EM_X86_64, interp: amd64Loader, pad: 5000})
	if _, err := parseELF(short[:headSize]); err != errShort {
		t.Errorf("parseELF(loader beyond the head) error = %v, want errShort", err)
	}
	for _, bad := range [][]byte{[]byte("\x7fELF"), []byte("\x7fELF\x03\x01\x01" + strings.Repeat("\x00", 60)), []byte("MZ")} {
		if _, err := parseELF(bad); err == nil {
			t.Errorf("parseELF(%q) succeeded, want an error", bad)
		}
	}
	noNUL := bytes.Clone(amd64Dyn)
	i := bytes.Index(noNUL, []byte(amd64Loader))
	noNUL[i+len(amd64Loader)] = 'x'
	if _, err := parseELF(noNUL); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("parseELF(PT_INTERP without NUL) error = %v, want one about the NUL", err)
	}
}

// elfSeeds are the ELF fuzz seeds: crafted headers and, when present, the
// head of a real binary of the host.
func elfSeeds(f *testing.F) {
	for _, b := range [][]byte{amd64Dyn, amd64Static, arm64Dyn,
		mkELF(elfOpts{class: elf.ELFCLASS32, machine: elf.EM_ARM, interp: "/lib/ld-linux-armhf.so.3"}),
		mkELF(elfOpts{machine: elf.EM_PPC64, order: binary.BigEndian, interp: "/lib64/ld64.so.1"}),
	} {
		f.Add(b)
	}
	if b, err := os.ReadFile("/bin/true"); err == nil {
		f.Add(b[:min(len(b), headSize)])
	}
}

func FuzzParseELF(f *testing.F) {
	elfSeeds(f)
	f.Fuzz(func(t *testing.T, head []byte) {
		if len(head) > maxHead {
			head = head[:maxHead]
		}
		info, err := parseELF(head)
		if err != nil {
			return
		}
		if len(info.interp) >= maxInterp || strings.ContainsRune(info.interp, 0) {
			t.Fatalf("parseELF: loader path %q of %d bytes", info.interp, len(info.interp))
		}
		// Whatever parses, the check must handle without panicking or
		// reading past its bound.
		m := newFS()
		m.file("/x", 0o755, head)
		m.file("/lib/ld.so", 0o755, head)
		Check(m, Spec{Argv: []string{"/x"}, Arch: "amd64", Envd: "/x"})
		for p, n := range m.reads {
			if n > maxHead {
				t.Fatalf("Check read %d bytes of %s", n, p)
			}
		}
	})
}

func FuzzParseShebang(f *testing.F) {
	for _, s := range []string{"#!/bin/sh\n", "#!/usr/bin/env python3\r\n", "#! /usr/bin/env -S node --x\n", "#!\n", "#!/bin/sh -e\x00\n", "#!" + strings.Repeat("/a", 200)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		sb, err := parseShebang(head)
		if err != nil {
			return
		}
		if sb.interp == "" || strings.ContainsAny(sb.interp, " \t\n\x00") {
			t.Fatalf("parseShebang(%q): interpreter %q", head, sb.interp)
		}
		if strings.ContainsAny(sb.arg, "\n\x00") || len(sb.interp)+len(sb.arg) > shebangSize {
			t.Fatalf("parseShebang(%q): argument %q", head, sb.arg)
		}
		envName(sb.arg)
		m := debianAmd64()
		m.file("/app/run", 0o755, head)
		Check(m, Spec{Argv: []string{"/app/run"}, Arch: "amd64"})
	})
}
