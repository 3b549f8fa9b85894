package ext4

import (
	"bytes"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// residentPages counts the pages of f's bytes [off, off+n) in the page
// cache.
func residentPages(t *testing.T, f *os.File, off, n int64) int {
	t.Helper()
	m, err := unix.Mmap(int(f.Fd()), off, int(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (n+int64(os.Getpagesize())-1)/int64(os.Getpagesize()))
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	resident := 0
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident
}

// TestDirectDataWrites: file data goes to the image with direct I/O by
// default (none of it in the page cache), through the page cache with
// BufferedData, and both give the same image, holes and a partial last
// block included.
func TestDirectDataWrites(t *testing.T) {
	content := append(randBytes(7, 3<<20), make([]byte, 64<<10)...) // a hole at the end
	content = append(content, randBytes(8, 5000)...)                // and a partial last block
	build := func(buffered bool) []byte {
		opts := testOptions()
		opts.BufferedData = buffered
		im := newImage(t, opts)
		if direct := im.w.q.direct != nil; direct == buffered {
			t.Fatalf("BufferedData %v: direct descriptor open = %v (does the test's file system refuse O_DIRECT?)", buffered, direct)
		}
		n := im.file(0o644, content)
		if err := im.w.flushPending(); err != nil {
			t.Fatal(err)
		}
		first := n.Data.extents[0]
		resident := residentPages(t, im.f, int64(first.physical)*BlockSize, int64(first.length)*BlockSize)
		switch {
		case !buffered && resident != 0:
			t.Errorf("direct writes: %d of %d data pages in the page cache, want none", resident, first.length)
		case buffered && resident == 0:
			t.Errorf("buffered writes: no data page in the page cache")
		}
		im.finish(dir(map[string]*Node{"f": n}))
		if im.w.q.direct != nil {
			t.Error("the direct descriptor is still open after Finish")
		}
		imagetest.Fsck(t, im.path)
		b, err := os.ReadFile(im.path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if direct, buffered := build(false), build(true); !bytes.Equal(direct, buffered) {
		t.Error("direct and buffered data writes give different images")
	}
}
