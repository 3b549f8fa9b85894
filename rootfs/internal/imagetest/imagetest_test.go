package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLayerEncodings reads built layers back with archive/tar: the
// hand-made headers (sparse, legacy) must parse as intended.
func TestLayerEncodings(t *testing.T) {
	gnu := Sparse("g", 1<<20, SparseGNU, Fragment{10, []byte("ab")}, Fragment{70000, []byte("cd")})
	pax := Sparse("dir/p", 5<<20, SparsePAX, Fragment{4 << 20, []byte("xyz")})
	legacy := Entry{Name: "old", Type: TypeLegacy, Mode: 0o600, ModTime: Epoch, Body: []byte("v7")}
	lib := File("lib", "l").LibXattr("user.a b=%", []byte{0, 1, 2})
	raw, err := Layer{gnu, pax, legacy, lib, File("after", "after")}.Tar()
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	want := []struct {
		name    string
		typ     byte
		content io.Reader
	}{
		{"g", tar.TypeGNUSparse, gnu.Content()},
		{"dir/p", tar.TypeReg, pax.Content()},
		{"old", tar.TypeReg, strings.NewReader("v7")},
		{"lib", tar.TypeReg, strings.NewReader("l")},
		{"after", tar.TypeReg, strings.NewReader("after")},
	}
	for _, w := range want {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("Next before %q: %v", w.name, err)
		}
		got, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		wantContent, _ := io.ReadAll(w.content)
		if hdr.Name != w.name || hdr.Typeflag != w.typ || !bytes.Equal(got, wantContent) {
			t.Errorf("entry %q type %q with %d bytes, want %q type %q with %d bytes",
				hdr.Name, hdr.Typeflag, len(got), w.name, w.typ, len(wantContent))
		}
		if w.name == "lib" {
			if v := hdr.PAXRecords["LIBARCHIVE.xattr.user.a%20b%3D%25"]; v != "AAEC" {
				t.Errorf("LIBARCHIVE record = %q in %v", v, hdr.PAXRecords)
			}
		}
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("Next after the last entry = %v, want EOF", err)
	}
	if i := bytes.Index(raw, []byte("old\x00")); i < 0 || raw[i+156] != 0 {
		t.Error("legacy entry was not written with typeflag NUL")
	}
}

// TestSnapshotDir snapshots a directory made with syscalls, and diffs it.
func TestSnapshotDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("device nodes and ownership need root")
	}
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p := func(s string) string { return filepath.Join(root, s) }
	must(os.WriteFile(p("f"), []byte("content"), 0o644))
	must(unix.Chmod(p("f"), 0o4755))
	must(os.Link(p("f"), p("g")))
	must(os.Symlink("f", p("s")))
	must(unix.Mkfifo(p("fifo"), 0o600))
	must(unix.Mknod(p("dev"), unix.S_IFCHR|0o620, int(unix.Mkdev(300, 70000))))
	must(unix.Chmod(p("dev"), 0o620))
	must(os.Mkdir(p("d"), 0o755))
	must(unix.Chmod(p("d"), 0o1777))
	must(os.Lchown(p("s"), 7, 8))
	must(unix.Lsetxattr(p("f"), "user.k", []byte("v"), 0))
	mt := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	must(os.Chtimes(p("d"), mt, mt))
	got, err := SnapshotDir(root)
	if err != nil {
		t.Fatal(err)
	}
	want := Expect(
		WFile("f", 0o4755, "content").Linked("f").WithXattr("user.k", "v"),
		WFile("g", 0o4755, "content").Linked("f").WithXattr("user.k", "v"),
		WSymlink("s", "f").Owner(7, 8),
		WFifo("fifo", 0o600),
		WChar("dev", 0o620, 300, 70000),
		WDir("d", 0o1777).At(mt),
	)
	for _, d := range Check(want, got) {
		t.Error(d)
	}
	// Diff must notice each kind of difference.
	changed := Expect(
		WFile("f", 0o755, "other").Linked("f"),
		WFile("g", 0o4755, "content").Linked("f").WithXattr("user.k", "v"),
		WSymlink("s", "g").Owner(7, 8),
		WBlock("fifo", 0o600, 0, 0),
		WChar("dev", 0o620, 300, 70001),
		WDir("d", 0o1777).At(mt.Add(1)),
		WDir("extra", 0o755),
	)
	d := strings.Join(Check(changed, got), "\n")
	for _, frag := range []string{`"f": perm`, `"f": sha256`, `"f": xattrs`, `"s": target`, `"fifo": type`,
		`"dev": device`, `"d": mtime`, `"extra": missing`} {
		if !strings.Contains(d, frag) {
			t.Errorf("Diff does not report %s; it says:\n%s", frag, d)
		}
	}
}
