package inspect

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
)

// mkfsImage builds a reference image with e2fsprogs (metadata_csum is the
// mke2fs default) from a small tree.
func mkfsImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	for _, d := range []string{"etc", "usr/bin"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "etc/motd"), []byte("hello\n"), 0o640)
	os.WriteFile(filepath.Join(root, "usr/bin/tool"), bytes.Repeat([]byte("x"), 10000), 0o4755)
	syscall.Chmod(filepath.Join(root, "usr/bin/tool"), 0o4755)
	os.Chown(filepath.Join(root, "etc/motd"), 1000, 1001)
	os.Symlink("../etc/motd", filepath.Join(root, "usr/motd-link"))
	if err := syscall.Mknod(filepath.Join(root, "null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatalf("mknod (needs root): %v", err)
	}
	syscall.Chmod(filepath.Join(root, "null"), 0o666)
	img := filepath.Join(dir, "img.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "metadata_csum", "-d", root, img, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	return img
}

func TestListStatAndRead(t *testing.T) {
	im, err := Open(mkfsImage(t))
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	root, err := im.List("/")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]Entry{}
	for _, e := range root {
		names[e.Name] = e
	}
	if e := names["etc"]; !e.Mode.IsDir() || e.Mode.Perm() != 0o755 {
		t.Errorf("etc = %+v", e)
	}
	if e := names["null"]; e.Mode&fs.ModeCharDevice == 0 || e.Major != 1 || e.Minor != 3 || e.Mode.Perm() != 0o666 {
		t.Errorf("null = %+v", e)
	}
	if _, ok := names["lost+found"]; !ok {
		t.Error("lost+found missing from the listing")
	}
	motd, err := im.Stat("/etc/motd")
	if err != nil || motd.UID != 1000 || motd.GID != 1001 || motd.Mode.Perm() != 0o640 || motd.Size != 6 {
		t.Errorf("Stat(/etc/motd) = %+v, %v", motd, err)
	}
	tool, _ := im.Stat("usr/bin/tool")
	if tool.Mode&fs.ModeSetuid == 0 {
		t.Errorf("setuid bit lost: %v", tool.Mode)
	}
	link, _ := im.List("/usr")
	if len(link) != 2 || link[1].Name != "motd-link" || link[1].LinkTarget != "../etc/motd" {
		t.Errorf("List(/usr) = %+v", link)
	}
	data, err := im.ReadFile("/usr/bin/tool")
	if err != nil || !bytes.Equal(data, bytes.Repeat([]byte("x"), 10000)) {
		t.Errorf("ReadFile = %d bytes, %v", len(data), err)
	}
	if _, err := im.ReadFile("/etc"); err == nil {
		t.Error("ReadFile of a directory succeeded")
	}
	if _, err := im.Stat("/nope"); err == nil {
		t.Error("Stat of a missing path succeeded")
	}
}

func TestOpenRejectsNonExt4(t *testing.T) {
	p := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(p, bytes.Repeat([]byte{0xAA}, 1<<20), 0o644)
	if _, err := Open(p); err == nil {
		t.Error("Open of a non-ext4 file succeeded")
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Open of a missing file succeeded")
	}
}

// TestReadsWhatTheWriterWrites reads back images from this project's own
// writer: a file spread over several extents (released holes refilled) and
// a file ending in zero blocks, whose last block the writer keeps.
func TestReadsWhatTheWriterWrites(t *testing.T) {
	ctx := context.Background()
	img := filepath.Join(t.TempDir(), "img.ext4")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ext4.NewWriter(f, ext4.Options{Time: time.Unix(1700000000, 0)})
	if err != nil {
		t.Fatal(err)
	}
	root := &ext4.Node{Mode: ext4.ModeDir | 0o755, Children: map[string]*ext4.Node{}}
	var fillers []ext4.Data
	for i := 0; i < 8; i++ { // fragment the free space
		d, err := w.WriteData(ctx, bytes.NewReader(bytes.Repeat([]byte{byte(i + 1)}, 8192)), 8192)
		if err != nil {
			t.Fatal(err)
		}
		fillers = append(fillers, d)
	}
	for i := 0; i < 8; i += 2 {
		w.Release(fillers[i])
	}
	spread := bytes.Repeat([]byte("0123456789abcdef"), 3000) // 48000 bytes: more than one hole can take
	d, err := w.WriteData(ctx, bytes.NewReader(spread), int64(len(spread)))
	if err != nil {
		t.Fatal(err)
	}
	root.Children["spread"] = &ext4.Node{Mode: ext4.ModeRegular | 0o644, Size: int64(len(spread)), Data: d}
	tail := append([]byte("head"), make([]byte, 3*4096)...)
	d, err = w.WriteData(ctx, bytes.NewReader(tail), int64(len(tail)))
	if err != nil {
		t.Fatal(err)
	}
	root.Children["zero-tail"] = &ext4.Node{Mode: ext4.ModeRegular | 0o600, Size: int64(len(tail)), Data: d}
	for i := 1; i < 8; i += 2 {
		root.Children[fmt.Sprintf("filler-%d", i)] = &ext4.Node{Mode: ext4.ModeRegular | 0o644, Size: 8192, Data: fillers[i]}
	}
	if _, err := w.Finish(ctx, root); err != nil {
		t.Fatal(err)
	}
	f.Close()
	im, err := Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if got, err := im.ReadFile("/spread"); err != nil || !bytes.Equal(got, spread) {
		t.Errorf("ReadFile(/spread) = %d bytes, %v; want the %d bytes written", len(got), err, len(spread))
	}
	// ReadAt anywhere, across the extents' boundaries and to the end.
	for off := 0; off < len(spread); off += 997 {
		b := make([]byte, 5000)
		n, err := im.ReadAt("/spread", b, int64(off))
		want := spread[off:min(len(spread), off+len(b))]
		if !bytes.Equal(b[:n], want) || (n < len(b)) != errors.Is(err, io.EOF) || (err != nil && !errors.Is(err, io.EOF)) {
			t.Fatalf("ReadAt(/spread, %d bytes at %d) = %d, %v; want %d bytes of the file", len(b), off, n, err, len(want))
		}
	}
	if n, err := im.ReadAt("/spread", make([]byte, 10), int64(len(spread))); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("ReadAt at the end = %d, %v; want io.EOF", n, err)
	}
	// The interior zero blocks are holes; ReadFile refuses them rather
	// than misreading.
	if _, err := im.ReadFile("/zero-tail"); err == nil || !strings.Contains(err.Error(), "sparse") {
		t.Errorf("ReadFile(/zero-tail) = %v, want the sparse-file refusal", err)
	}
}

// TestOpenRejectsBadSuperblock feeds Open images of the project's writer
// whose superblock (checksum kept valid) claims what go-diskfs would
// trust: each must fail with ErrNotImage before go-diskfs allocates or
// indexes anything from it.
func TestOpenRejectsBadSuperblock(t *testing.T) {
	base := writerImage(t, 0)
	if im, err := Open(base.file(t, t.TempDir())); err != nil {
		t.Fatalf("Open of the unmodified image: %v", err)
	} else {
		im.Close()
	}
	put32 := func(off int, v uint32) func([]byte) {
		return func(sb []byte) { binary.LittleEndian.PutUint32(sb[off:], v) }
	}
	put16 := func(off int, v uint16) func([]byte) {
		return func(sb []byte) { binary.LittleEndian.PutUint16(sb[off:], v) }
	}
	for _, c := range []struct {
		name   string
		mutate func(sb []byte)
		want   string
	}{
		{"Magic", put16(0x38, 0x1234), "no ext4 magic"},
		{"BlockSize", put32(0x18, 7), "block size"},
		{"Bigalloc", put32(0x1C, 4), "bigalloc"},
		{"MetaBg", put32(0x60, 0x2|0x40|0x80|0x200|0x10), "unsupported incompatible features"},
		{"BlocksBeyondFile", put32(0x04, 1<<31), "do not fit"},
		{"BlocksHigh", put32(0x150, 1), "do not fit"},
		{"NoBlocksPerGroup", put32(0x20, 0), "blocks per group"},
		{"NoInodesPerGroup", put32(0x28, 0), "inodes per group"},
		{"TooManyInodes", put32(0x00, 1<<31), "inodes for"},
		{"InodeSize", put16(0x58, 100), "inode size"},
		{"DescSize", put16(0xFE, 48), "group descriptor size"},
		{"FirstDataBlock", put32(0x14, 1), "first data block"},
	} {
		t.Run(c.name, func(t *testing.T) {
			img := base
			img.head = bytes.Clone(base.head)
			c.mutate(img.head[1024:2048])
			img.head = fixChecksums(img.head)
			_, err := Open(img.file(t, t.TempDir()))
			if !errors.Is(err, ErrNotImage) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open = %v, want ErrNotImage saying %q", err, c.want)
			}
		})
	}
	t.Run("TooSmall", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "small")
		os.WriteFile(p, base.head[:1500], 0o644)
		if _, err := Open(p); !errors.Is(err, ErrNotImage) {
			t.Fatalf("Open of a 1500-byte file = %v, want ErrNotImage", err)
		}
	})
}
