package ext4

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// TestFragmentedFileExtentTree fills the holes left by released files with
// one big file, whose extent tree then needs index blocks (depth 2).
func TestFragmentedFileExtentTree(t *testing.T) {
	im := newImage(t, testOptions())
	root := dir(map[string]*Node{})
	const small = 3000
	var all []*Node
	for i := 0; i < small; i++ {
		all = append(all, im.file(0o644, randBytes(uint64(i+100), 4096)))
	}
	for i, n := range all {
		if i%2 == 1 {
			im.w.Release(n.Data)
		} else {
			root.Children[fmt.Sprintf("small%04d", i)] = n
		}
	}
	bigContent := randBytes(7, (small/2+300)*4096+123)
	big := im.file(0o644, bigContent)
	root.Children["big"] = big
	// 1500 one-block holes then a tail run: about 1501 extents.
	if n := len(big.Data.extents); n < small/2 {
		t.Fatalf("big file has %d extents, want at least %d (holes not reused)", n, small/2)
	}
	got, err := io.ReadAll(im.w.OpenData(big.Data, big.Size))
	if err != nil || !bytes.Equal(got, bigContent) {
		t.Fatalf("OpenData: %d bytes, %v; content differs", len(got), err)
	}
	// A reader seeks anywhere among the extents, backwards too.
	r := im.w.OpenData(big.Data, big.Size).(io.ReadSeeker)
	for _, off := range []int64{int64(len(bigContent)) - 200, 4096*700 + 5, 4095, 0, 4096 * 1501} {
		if _, err := r.Seek(off, io.SeekStart); err != nil {
			t.Fatalf("Seek(%d): %v", off, err)
		}
		b := make([]byte, 100)
		if _, err := io.ReadFull(r, b); err != nil || !bytes.Equal(b, bigContent[off:off+100]) {
			t.Errorf("read 100 bytes at %d after a seek: %v; content differs", off, err)
		}
	}
	st := im.finish(root)
	imagetest.Fsck(t, im.path)

	stat := debugfs(t, im.path, "stat /big")
	if m := regexp.MustCompile(`Level Entries`).FindString(stat); m == "" && !strings.Contains(stat, "(ETB") {
		t.Errorf("stat /big shows no extent tree blocks:\n%.600s", stat)
	}
	depth := debugfs(t, im.path, "ex /big")
	if !strings.Contains(depth, " 2/ 2 ") {
		t.Errorf("extent tree of /big is not depth 2:\n%.600s", depth)
	}
	// Compact: data blocks plus metadata, not the released space on top.
	dataBlocks := uint64(small/2 + small/2 + 300 + 1)
	if used := st.BlocksTotal - st.BlocksFree; used > dataBlocks+200 {
		t.Errorf("%d blocks used for %d data blocks", used, dataBlocks)
	}
	mnt := imagetest.Mount(t, im.path)
	b, err := os.ReadFile(filepath.Join(mnt, "big"))
	if err != nil || sha(b) != sha(bigContent) {
		t.Errorf("read big through the kernel: %v, sha %s want %s", err, sha(b), sha(bigContent))
	}
	for name, n := range root.Children {
		if name == "big" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || !bytes.Equal(b, randBytes(uint64(100+atoi(name[5:])), 4096)) || n.Size != 4096 {
			t.Fatalf("read %s: %v, content differs", name, err)
		}
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// sparseReader yields size bytes of zeros with marker blocks at offsets.
type sparseReader struct {
	pos, size int64
	markers   map[int64][]byte // block-aligned offset -> one block
}

func (r *sparseReader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	n := int64(len(p))
	if n > r.size-r.pos {
		n = r.size - r.pos
	}
	clear(p[:n])
	for off, m := range r.markers {
		if off+int64(len(m)) > r.pos && off < r.pos+n {
			lo := max(off, r.pos)
			hi := min(off+int64(len(m)), r.pos+n)
			copy(p[lo-r.pos:hi-r.pos], m[lo-off:hi-off])
		}
	}
	r.pos += n
	return int(n), nil
}

// TestSparse5GiB writes a 5 GiB file that is mostly zeros: only the marker
// blocks take space, and the kernel reads the holes back as zeros.
func TestSparse5GiB(t *testing.T) {
	im := newImage(t, testOptions())
	const size = 5<<30 + 1000
	markers := map[int64][]byte{
		0:              randBytes(1, 4096),
		2 << 30:        randBytes(2, 4096),
		4<<30 + 8192:   randBytes(3, 8192),
		size &^ 4095:   randBytes(4, 1000), // partial last block
		3<<30 + 409600: randBytes(5, 4096),
	}
	d, err := im.w.WriteData(context.Background(), &sparseReader{size: size, markers: markers}, size)
	if err != nil {
		t.Fatal(err)
	}
	if d.Blocks() != 6 {
		t.Fatalf("sparse file uses %d blocks, want 6", d.Blocks())
	}
	n := &Node{Mode: ModeRegular | 0o644, Size: size, Data: d, Mtime: Nanos(testTime)}
	st := im.finish(dir(map[string]*Node{"sparse": n}))
	if st.Size > 64<<20 {
		t.Errorf("image of a sparse file is %d bytes", st.Size)
	}
	imagetest.Fsck(t, im.path)
	mnt := imagetest.Mount(t, im.path)
	f, err := os.Open(filepath.Join(mnt, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	if fi.Size() != size {
		t.Errorf("size %d, want %d", fi.Size(), int64(size))
	}
	for off, m := range markers {
		got := make([]byte, len(m)+8192)
		want := append(append(make([]byte, 4096), m...), make([]byte, 4096)...)
		start := off - 4096
		if off == 0 {
			start, got, want = 0, got[4096:], want[4096:]
		}
		k, err := f.ReadAt(got, start)
		if err != nil && err != io.EOF {
			t.Fatalf("read at %d: %v", off, err)
		}
		if int64(k) != min(int64(len(got)), size-start) || !bytes.Equal(got[:k], want[:k]) {
			t.Errorf("content around offset %d differs", off)
		}
	}
	// Holes read as zeros through OpenData too, read through or
	// seeked over.
	r := im.w.OpenData(d, size)
	if _, err := io.CopyN(io.Discard, r, 2<<30); err != nil {
		t.Fatal(err)
	}
	blk := make([]byte, 4096)
	if _, err := io.ReadFull(r, blk); err != nil || !bytes.Equal(blk, markers[2<<30]) {
		t.Errorf("OpenData at 2 GiB: %v, content differs", err)
	}
	rs := im.w.OpenData(d, size).(io.ReadSeeker)
	for _, off := range []int64{2 << 30, 2<<30 - 4096} {
		if _, err := rs.Seek(off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, 4096)
		if m, ok := markers[off]; ok {
			want = m
		}
		if _, err := io.ReadFull(rs, blk); err != nil || !bytes.Equal(blk, want) {
			t.Errorf("OpenData after a seek to %d: %v, content differs", off, err)
		}
	}
}

// TestReleaseReusesBlocks checks that released blocks are handed out again
// so the image does not grow with overwritten files.
func TestReleaseReusesBlocks(t *testing.T) {
	im := newImage(t, testOptions())
	a := im.file(0o644, randBytes(1, 10<<20))
	first := a.Data.extents[0].physical
	im.w.Release(a.Data)
	b := im.file(0o644, randBytes(2, 10<<20))
	if b.Data.extents[0].physical != first {
		t.Errorf("second file starts at block %d, want reused block %d", b.Data.extents[0].physical, first)
	}
	c := im.file(0o644, randBytes(3, 1<<20))
	im.w.Release(c.Data)
	st := im.finish(dir(map[string]*Node{"b": b}))
	imagetest.Fsck(t, im.path)
	if st.Size > 16<<20 {
		t.Errorf("image is %d bytes for 10 MiB of live data", st.Size)
	}
	mnt := imagetest.Mount(t, im.path)
	got, err := os.ReadFile(filepath.Join(mnt, "b"))
	if err != nil || sha(got) != sha(randBytes(2, 10<<20)) {
		t.Errorf("read b: %v, content differs", err)
	}
}

func TestEmptyTree(t *testing.T) {
	for _, journal := range []uint32{0, 1024} {
		t.Run(fmt.Sprintf("Journal%d", journal), func(t *testing.T) {
			o := testOptions()
			o.JournalBlocks = journal
			im := newImage(t, o)
			st := im.finish(&Node{Mode: ModeDir | 0o755})
			imagetest.Fsck(t, im.path)
			if st.InodesTotal-st.InodesFree != firstIno {
				t.Errorf("%d inodes used, want %d", st.InodesTotal-st.InodesFree, firstIno)
			}
			mnt := imagetest.Mount(t, im.path)
			ents, err := os.ReadDir(mnt)
			if err != nil || len(ents) != 1 || ents[0].Name() != "lost+found" {
				t.Errorf("root holds %v, %v; want only lost+found", ents, err)
			}
		})
	}
}

// TestCopyFromOpenData streams one file's content into another through
// OpenData while the first file's blocks may still be queued for writing.
func TestCopyFromOpenData(t *testing.T) {
	im := newImage(t, testOptions())
	content := randBytes(8, 50000)
	a := im.file(0o644, content)
	d, err := im.w.WriteData(context.Background(), im.w.OpenData(a.Data, a.Size), a.Size)
	if err != nil {
		t.Fatalf("WriteData from OpenData: %v", err)
	}
	b := &Node{Mode: ModeRegular | 0o644, Size: a.Size, Data: d}
	got, err := io.ReadAll(im.w.OpenData(d, b.Size))
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("OpenData of the copy: %v, content differs", err)
	}
	im.finish(dir(map[string]*Node{"a": a, "b": b}))
	imagetest.Fsck(t, im.path)
	mnt := imagetest.Mount(t, im.path)
	for _, name := range []string{"a", "b"} {
		if got, err := os.ReadFile(filepath.Join(mnt, name)); err != nil || !bytes.Equal(got, content) {
			t.Errorf("read %s: %v, content differs", name, err)
		}
	}
}

// TestFreedContentIsCleared checks that content of released and of
// unreferenced data does not survive in the image's free space.
func TestFreedContentIsCleared(t *testing.T) {
	im := newImage(t, testOptions())
	secret := bytes.Repeat([]byte("SECRET-CONTENT!!"), 2<<20/16)
	a := im.file(0o600, secret)
	im.w.Release(a.Data)
	keep := im.file(0o644, randBytes(1, 100<<10))
	im.file(0o644, bytes.Repeat([]byte("UNREFERENCED-DATA"), 1000)) // written, never linked
	im.finish(dir(map[string]*Node{"keep": keep}))
	imagetest.Fsck(t, im.path)
	img, err := os.ReadFile(im.path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"SECRET-CONTENT!!", "UNREFERENCED-DATA"} {
		if bytes.Contains(img, []byte(s)) {
			t.Errorf("image still holds %q in free space", s)
		}
	}
}

// TestConcurrentUse runs WriteData in one goroutine while another reads
// finished files back through OpenData and releases some of them.
func TestConcurrentUse(t *testing.T) {
	im := newImage(t, testOptions())
	type written struct {
		d    Data
		want []byte
	}
	ch := make(chan written, 8)
	errc := make(chan error, 1)
	go func() {
		defer close(ch)
		for i := 0; i < 200; i++ {
			want := randBytes(uint64(i), 1000+i*997)
			d, err := im.w.WriteData(context.Background(), bytes.NewReader(want), int64(len(want)))
			if err != nil {
				errc <- err
				return
			}
			ch <- written{d, want}
		}
	}()
	root := dir(map[string]*Node{})
	i := 0
	for wr := range ch {
		got, err := io.ReadAll(im.w.OpenData(wr.d, int64(len(wr.want))))
		if err != nil || !bytes.Equal(got, wr.want) {
			t.Fatalf("OpenData of file %d: %v, content differs", i, err)
		}
		if i%3 == 0 {
			im.w.Release(wr.d)
		} else {
			root.Children[itoa(i)] = &Node{Mode: ModeRegular | 0o644, Size: int64(len(wr.want)), Data: wr.d}
		}
		i++
	}
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	im.finish(root)
	imagetest.Fsck(t, im.path)
}
