package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestHelloELF: the sample's /bin/hello is a valid x86-64 executable and,
// on an x86-64 host, prints its message and exits 0.
func TestHelloELF(t *testing.T) {
	prog := helloELF()
	path := filepath.Join(t.TempDir(), "hello")
	if err := os.WriteFile(path, prog, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("not an ELF: %v", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC || len(f.Progs) != 1 {
		t.Errorf("ELF %v %v with %d program headers, want a static x86-64 executable", f.Machine, f.Type, len(f.Progs))
	}
	if runtime.GOARCH != "amd64" || runtime.GOOS != "linux" {
		return
	}
	out, err := exec.Command(path).CombinedOutput()
	if err != nil || string(out) != helloMessage {
		t.Errorf("run: %q, %v; want %q", out, err, helloMessage)
	}
}
