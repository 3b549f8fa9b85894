package startcheck

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// dirFS is a directory of the host seen as an image tree: a real
// merged-/usr layout with real loaders, passwd and scripts.
type dirFS string

var _ FS = dirFS("")

func (d dirFS) Lstat(p string) (Entry, error) {
	fi, err := os.Lstat(filepath.Join(string(d), p))
	if err != nil {
		return Entry{}, err
	}
	e := Entry{Mode: fi.Mode()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if e.Target, err = os.Readlink(filepath.Join(string(d), p)); err != nil {
			return Entry{}, err
		}
	}
	return e, nil
}

func (d dirFS) ReadHead(p string, n int) ([]byte, error) {
	f, err := os.Open(filepath.Join(string(d), p))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	k, err := io.ReadFull(f, b)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return b[:k], nil
}

func (d dirFS) ReadAt(p string, b []byte, off int64) (int, error) {
	f, err := os.Open(filepath.Join(string(d), p))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.ReadAt(b, off)
}

// TestCheckHostTree runs the check on the host's own root as the image:
// commands that run here must pass, with no warning (no false positive
// on a real distribution tree), and a missing one must fail.
func TestCheckHostTree(t *testing.T) {
	root := dirFS("/")
	for _, argv := range [][]string{{"sh", "-c", "true"}, {"env"}, {"/bin/sh"}, {"ls", "/"}, {"python3", "-V"}, {"perl", "-v"}} {
		if _, err := os.Stat(filepath.Join("/usr/bin", argv[0])); err != nil && argv[0][0] != '/' {
			continue
		}
		r := Check(root, Spec{Argv: argv, Arch: runtime.GOARCH, User: "root:root"})
		t.Logf("Check(%q) = %s", argv, mustJSON(t, r))
		if r.Result != ResultOK {
			t.Errorf("Check(host tree, %q) = %+v, want ok", argv, r)
		}
	}
	// The scripts in /usr/bin of the host: the check must agree with the
	// host kernel's own path resolution (os.Stat) on whether their
	// interpreter exists, whatever they name.
	elves, scripts, missing := 0, 0, 0
	entries, err := os.ReadDir("/usr/bin")
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range entries {
		p := "/usr/bin/" + de.Name()
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		head, err := root.ReadHead(p, 4)
		if err != nil {
			t.Fatal(err)
		}
		if isELF(head) {
			// Every ELF program of the host runs on it.
			elves++
			if r := Check(root, Spec{Argv: []string{p}, Arch: runtime.GOARCH}); r.Result != ResultOK {
				t.Errorf("Check(host program %s) = %+v, want ok", p, r)
			}
			continue
		}
		if string(head[:min(2, len(head))]) != "#!" {
			continue
		}
		scripts++
		head, _ = root.ReadHead(p, shebangSize)
		want := hostHasInterpreter(t, head)
		if !want {
			missing++
		}
		if r := Check(root, Spec{Argv: []string{p}, Arch: runtime.GOARCH}); (r.Result == ResultOK) != want {
			t.Errorf("Check(host script %s) = %+v, want ok = %v", p, r, want)
		}
	}
	t.Logf("checked %d ELF programs and %d scripts of the host, %d with a missing interpreter", elves, scripts, missing)
	r := Check(root, Spec{Argv: []string{"no-such-command-anywhere"}, Arch: runtime.GOARCH})
	if !r.Failed() {
		t.Errorf("Check(host tree, missing command) = %+v, want failed", r)
	}
}

// hostHasInterpreter reports whether the host has an executable file for
// the "#!" line in head, looked up with the host's own os.Stat: the
// interpreter, or NAME on DefaultPath for "#!/usr/bin/env NAME".
func hostHasInterpreter(t *testing.T, head []byte) bool {
	t.Helper()
	sb, err := parseShebang(head)
	if err != nil {
		return false
	}
	executable := func(p string) bool {
		fi, err := os.Stat(p)
		return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
	}
	if !executable(sb.interp) {
		return false
	}
	name, ok := envName(sb.arg)
	if filepath.Base(sb.interp) != "env" || !ok {
		return true
	}
	for _, dir := range filepath.SplitList(DefaultPath) {
		if executable(filepath.Join(dir, name)) {
			return true
		}
	}
	return false
}
