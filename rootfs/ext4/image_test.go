package ext4

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/ext4"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReadWriteMount mounts a copy of the image read-write, changes it
// through the kernel, and checks e2fsck is still clean after unmounting.
func TestReadWriteMount(t *testing.T) {
	for _, journal := range []uint32{0, 4096} {
		t.Run(fmt.Sprintf("Journal%d", journal), func(t *testing.T) {
			o := testOptions()
			o.JournalBlocks = journal
			// Enough headroom for a second block group.
			o.HeadroomMinBlocks = 40000
			o.HeadroomInodes = 6000
			im := newImage(t, o)
			tr := richTree(im)
			// Full htree leaves the kernel has to split on insert.
			tr.root.Children["big"] = bigDir(3000, func(i int) string { return fmt.Sprintf("entry-%05d", i) })
			im.finish(tr.root)
			imagetest.Fsck(t, im.path)

			feat := debugfs(t, im.path, "features")
			if hasJ := strings.Contains(feat, "has_journal"); hasJ != (journal > 0) {
				t.Errorf("features %q: has_journal %v, want %v", feat, hasJ, journal > 0)
			}
			for _, want := range []string{"metadata_csum", "flex_bg", "dir_index", "extent", "64bit", "sparse_super", "huge_file", "dir_nlink", "extra_isize", "ext_attr", "filetype", "large_file"} {
				if !strings.Contains(feat, want) {
					t.Errorf("features %q lack %s", feat, want)
				}
			}
			for _, bad := range []string{"resize_inode", "inline_data", "read-only", "shared_blocks"} {
				if strings.Contains(feat, bad) {
					t.Errorf("features %q include %s", feat, bad)
				}
			}

			rw := filepath.Join(t.TempDir(), "rw.ext4")
			copyFile(t, im.path, rw)
			mnt := imagetest.MountRW(t, rw)
			for i := 0; i < 300; i++ {
				p := filepath.Join(mnt, "regular", fmt.Sprintf("new-%03d", i))
				if err := os.WriteFile(p, randBytes(uint64(i), 5000+i*100), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.MkdirAll(filepath.Join(mnt, "newdir", "a", "b"), 0o755); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 1000; i++ {
				if err := os.WriteFile(filepath.Join(mnt, "xattr", fmt.Sprintf("many-%04d", i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range []string{"regular/random-3m", "hard/a", "links/slow4095", "xattr/big", "xattr/shared1", "deep"} {
				if err := os.RemoveAll(filepath.Join(mnt, p)); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < 300; i += 2 {
				if err := os.Remove(filepath.Join(mnt, "regular", fmt.Sprintf("new-%03d", i))); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(mnt, "xattr", "shared2"), []byte("rewritten"), 0o644); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3000; i++ {
				if err := os.WriteFile(filepath.Join(mnt, "big", fmt.Sprintf("added-%05d", i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
				if i%3 == 0 {
					if err := os.Remove(filepath.Join(mnt, "big", fmt.Sprintf("entry-%05d", i))); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := syscall.Setxattr(filepath.Join(mnt, "xattr", "caps"), "user.added", []byte("later"), 0); err != nil {
				t.Fatal(err)
			}
			imagetest.Umount(t, mnt)
			imagetest.Fsck(t, rw)
		})
	}
}

// buildDeterministic builds the same image, including releases and a
// fragmented file, into path.
func buildDeterministic(t *testing.T, path string) {
	buildDeterministicWith(t, path, testOptions())
}

// buildDeterministicWith is buildDeterministic with opts (the journal
// size aside), and returns the tree's root.
func buildDeterministicWith(t *testing.T, path string, o Options) *Node {
	o.JournalBlocks = 2048
	im := newImageAt(t, path, o)
	tr := richTree(im)
	var tmp []*Node
	for i := 0; i < 50; i++ {
		tmp = append(tmp, im.file(0o644, randBytes(uint64(i), 4096*(1+i%3))))
	}
	for i := 0; i < 50; i += 2 {
		im.w.Release(tmp[i].Data)
	}
	tr.root.Children["frag"] = im.file(0o644, randBytes(99, 200*4096))
	tr.root.Children["big"] = bigDir(3000, func(i int) string { return fmt.Sprintf("entry-%d", i) })
	im.finish(tr.root)
	return tr.root
}

// TestConsumeTree checks that a Finish which empties the tree as it goes
// writes the same bytes as one that leaves it alone.
func TestConsumeTree(t *testing.T) {
	d := t.TempDir()
	a, b := filepath.Join(d, "a.ext4"), filepath.Join(d, "b.ext4")
	kept := buildDeterministicWith(t, a, testOptions())
	o := testOptions()
	o.ConsumeTree = true
	consumed := buildDeterministicWith(t, b, o)
	if sa, sb := imagetest.FileSHA256(t, a), imagetest.FileSHA256(t, b); sa != sb {
		out, _ := exec.Command("cmp", a, b).CombinedOutput()
		t.Errorf("images differ with ConsumeTree: %s vs %s (%s)", sa, sb, out)
	}
	if kept.Children == nil {
		t.Errorf("Finish without ConsumeTree emptied the root")
	}
	checkUnplanned(t, kept)
	if consumed.Children != nil {
		t.Errorf("Finish with ConsumeTree left the root's %d entries", len(consumed.Children))
	}
}

func TestDeterministic(t *testing.T) {
	d := t.TempDir()
	a, b := filepath.Join(d, "a.ext4"), filepath.Join(d, "b.ext4")
	buildDeterministic(t, a)
	buildDeterministic(t, b)
	imagetest.Fsck(t, a)
	if sa, sb := imagetest.FileSHA256(t, a), imagetest.FileSHA256(t, b); sa != sb {
		out, _ := exec.Command("cmp", a, b).CombinedOutput()
		t.Errorf("two builds differ: %s vs %s (%s)", sa, sb, out)
	}
}

// TestGoDiskfsReadsImage reads the image back with go-diskfs v1.9.4: a
// root listing, an htree directory and file contents, including one whose
// extent tree has index blocks. (go-diskfs loops forever on files ending
// in a hole, so this tree has none.)
//
// go-diskfs's File.Read panics on a read that starts mid-block at an
// extent boundary, which io.ReadAll (512-byte first read) triggers on any
// file of several extents; diskfsRead reads whole blocks instead.
func TestGoDiskfsReadsImage(t *testing.T) {
	o := testOptions()
	o.JournalBlocks = 1024
	im := newImage(t, o)
	small := im.file(0o644, []byte("hello from ext4\n"))
	medium := randBytes(11, 1<<20+5)
	med := im.file(0o644, medium)
	var all []*Node
	for i := 0; i < 20; i++ {
		all = append(all, im.file(0o644, randBytes(uint64(i), 4096)))
	}
	for i := 0; i < 20; i += 2 {
		im.w.Release(all[i].Data)
	}
	fragContent := randBytes(12, 30*4096)
	frag := im.file(0o644, fragContent)
	if len(frag.Data.extents) <= extRootMax {
		t.Fatalf("fragmented file has only %d extents", len(frag.Data.extents))
	}
	names := map[string]*Node{"small.txt": small, "medium.bin": med, "frag.bin": frag,
		"sub": bigDir(1000, func(i int) string { return fmt.Sprintf("n%04d", i) })}
	im.finish(dir(names))
	imagetest.Fsck(t, im.path)

	f, err := os.Open(im.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	fs, err := ext4.Read(file.New(f, true), fi.Size(), 0, 0)
	if err != nil {
		t.Fatalf("go-diskfs ext4.Read: %v", err)
	}
	ents, err := fs.ReadDir(".")
	if err != nil {
		t.Fatalf("go-diskfs ReadDir .: %v", err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	for _, want := range []string{"small.txt", "medium.bin", "frag.bin", "sub", "lost+found"} {
		if !strings.Contains(strings.Join(got, "\x00")+"\x00", want+"\x00") {
			t.Errorf("go-diskfs ReadDir .: %q lacks %q", got, want)
		}
	}
	sub, err := fs.ReadDir("sub")
	if err != nil || len(sub) != 1000 {
		t.Errorf("go-diskfs ReadDir /sub: %d entries, %v; want 1000", len(sub), err)
	}
	for name, want := range map[string][]byte{"small.txt": []byte("hello from ext4\n"), "medium.bin": medium, "frag.bin": fragContent} {
		b, err := diskfsRead(fs, name)
		if err != nil || !bytes.Equal(b, want) {
			t.Errorf("go-diskfs ReadFile %s: %d bytes, %v; want %d bytes equal", name, len(b), err, len(want))
		}
	}
}

func diskfsRead(fs *ext4.FileSystem, name string) ([]byte, error) {
	f, err := fs.OpenFile(name, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out bytes.Buffer
	buf := make([]byte, 16*BlockSize)
	for {
		n, err := f.Read(buf)
		out.Write(buf[:n])
		if err == io.EOF {
			return out.Bytes(), nil
		}
		if err != nil {
			return out.Bytes(), err
		}
	}
}
