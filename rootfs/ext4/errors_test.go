package ext4

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

func TestFinishRejectsInvalidNodes(t *testing.T) {
	reg := func() *Node { return &Node{Mode: ModeRegular | 0o644} }
	withX := func(name string, v []byte) *Node {
		n := reg()
		n.SetXattrs([]Xattr{{Name: name, Value: v}})
		return n
	}
	shared := dir(nil)
	// foreign is content another Writer laid out.
	foreign := newImage(t, testOptions()).file(0o644, []byte("x")).Data
	cases := []struct {
		name string
		root *Node
		path string // must appear in the error
	}{
		{"SlashInName", dir(map[string]*Node{"a/b": reg()}), "/a/b"},
		{"NULInName", dir(map[string]*Node{"d": dir(map[string]*Node{"a\x00b": reg()})}), "/d/a\\x00b"},
		{"NameTooLong", dir(map[string]*Node{strings.Repeat("x", 256): reg()}), "/" + strings.Repeat("x", 256)},
		{"DotName", dir(map[string]*Node{"..": reg()}), "/"},
		{"EmptyName", dir(map[string]*Node{"": reg()}), "/"},
		{"UnknownXattrPrefix", dir(map[string]*Node{"f": withX("foo.bar", []byte("1"))}), "/f"},
		{"InlineDataXattr", dir(map[string]*Node{"f": withX("system.data", nil)}), "/f"},
		{"BadACL", dir(map[string]*Node{"f": withX("system.posix_acl_access", []byte{1, 2, 3})}), "/f"},
		{"XattrTooBig", dir(map[string]*Node{"f": withX("user.big", make([]byte, 5000))}), "/f"},
		{"BadTypeBits", dir(map[string]*Node{"f": {Mode: 0o170644}}), "/f"},
		{"NoTypeBits", dir(map[string]*Node{"f": {Mode: 0o644}}), "/f"},
		{"SymlinkTooLong", dir(map[string]*Node{"l": NewSymlink(bytes.Repeat([]byte("a"), 4096))}), "/l"},
		{"EmptySymlink", dir(map[string]*Node{"l": {Mode: ModeSymlink | 0o777}}), "/l"},
		{"DirectoryHardLink", dir(map[string]*Node{"a": shared, "b": dir(map[string]*Node{"c": shared})}), "/b/c"},
		{"ChildrenOnFile", dir(map[string]*Node{"f": {Mode: ModeRegular, Children: map[string]*Node{"x": reg()}}}), "/f"},
		{"NilChild", dir(map[string]*Node{"n": nil}), "/n"},
		{"DeviceOutOfRange", dir(map[string]*Node{"d": NewDevice(ModeChar|0o600, 5000, 0)}), "/d"},
		{"RootNotDir", reg(), "/"},
		{"ForeignData", dir(map[string]*Node{"f": {Mode: ModeRegular | 0o644, Size: 1, Data: foreign}}), "/f"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			im := newImage(t, testOptions())
			_, err := im.w.Finish(context.Background(), c.root)
			if !errors.Is(err, ErrInvalidNode) {
				t.Fatalf("Finish: %v, want ErrInvalidNode", err)
			}
			if want := strings.Trim(fmtQ(c.path), `"`); !strings.Contains(err.Error(), want) {
				t.Errorf("Finish error %q does not name %q", err, want)
			}
			checkUnplanned(t, c.root)
			if _, err := im.w.Finish(context.Background(), dir(nil)); !errors.Is(err, ErrFinished) {
				t.Errorf("second Finish: %v, want ErrFinished", err)
			}
		})
	}
}

// checkUnplanned fails when a node of the tree under n still carries the
// inode number a Finish gave it.
func checkUnplanned(t *testing.T, n *Node) {
	t.Helper()
	seen := map[*Node]bool{}
	var walk func(p string, n *Node)
	walk = func(p string, n *Node) {
		if n == nil || seen[n] {
			return
		}
		seen[n] = true
		if n.planned != 0 {
			t.Errorf("%s: still planned as inode %d after Finish", p, n.planned)
		}
		for name, c := range n.Children {
			walk(p+"/"+name, c)
		}
	}
	walk("", n)
}

func fmtQ(s string) string { return strings.ReplaceAll(s, "\x00", `\x00`) }

func TestDirectoryWithoutChildrenIsEmpty(t *testing.T) {
	im := newImage(t, testOptions())
	im.finish(dir(map[string]*Node{"empty": {Mode: ModeDir | 0o755}}))
	imagetest.Fsck(t, im.path)
	if out := debugfs(t, im.path, "ls -p /empty"); len(strings.Fields(out)) != 2 {
		t.Errorf("ls /empty:\n%s", out)
	}
}

func TestDataClaimedTwiceFails(t *testing.T) {
	im := newImage(t, testOptions())
	a := im.file(0o644, []byte("shared blocks"))
	b := *a // a second inode over the same blocks
	_, err := im.w.Finish(context.Background(), dir(map[string]*Node{"a": a, "b": &b}))
	if err == nil || !strings.Contains(err.Error(), "claimed twice") {
		t.Fatalf("Finish: %v, want a claimed-twice error", err)
	}
}

func TestShortReadReleasesBlocks(t *testing.T) {
	im := newImage(t, testOptions())
	_, err := im.w.WriteData(context.Background(), bytes.NewReader(randBytes(1, 10000)), 20000)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("WriteData of a short reader: %v, want ErrUnexpectedEOF", err)
	}
	n := im.file(0o644, randBytes(2, 4096))
	if got := n.Data.extents[0].physical; got != 1+im.w.gdtReserve {
		t.Errorf("next file at block %d, want the first data block %d (blocks of the failed write released)", got, 1+im.w.gdtReserve)
	}
}

// cancelReader cancels its context after limit bytes and then keeps
// producing data forever.
type cancelReader struct {
	n, limit int64
	cancel   func()
}

func (r *cancelReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i | 1)
	}
	r.n += int64(len(p))
	if r.n >= r.limit {
		r.cancel()
	}
	return len(p), nil
}

func TestCancel(t *testing.T) {
	im := newImage(t, testOptions())
	ctx, cancel := context.WithCancel(context.Background())
	r := &cancelReader{limit: 8 << 20, cancel: cancel}
	_, err := im.w.WriteData(ctx, r, 1<<40)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("WriteData: %v, want context.Canceled", err)
	}
	if r.n > 8<<20+2*ioBufSize {
		t.Errorf("WriteData read %d bytes after cancellation at 8 MiB", r.n)
	}
	n := im.file(0o644, []byte("after"))
	if got := n.Data.extents[0].physical; got != 1+im.w.gdtReserve {
		t.Errorf("blocks of the cancelled write not released: next file at %d", got)
	}

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := im.w.Finish(ctx, dir(map[string]*Node{"f": n})); !errors.Is(err, context.Canceled) {
		t.Fatalf("Finish: %v, want context.Canceled", err)
	}
	if _, err := im.w.WriteData(context.Background(), strings.NewReader("x"), 1); !errors.Is(err, ErrFinished) {
		t.Errorf("WriteData after Finish: %v, want ErrFinished", err)
	}
}

// TestCancelLargeFinish cancels a Finish of many inodes while it runs: at
// the first cancellation check after the start, half way through and at
// the last check. The cancellation lands at a known check, so every run
// asserts the outcome.
func TestCancelLargeFinish(t *testing.T) {
	tree := func() *Node {
		return bigDir(200000, func(i int) string { return string(rune('a'+i%26)) + strings.Repeat("q", i%50) + itoa(i) })
	}
	// Count the checks of an uncancelled Finish of the same tree.
	counting := &cancelAtCheck{Context: context.Background(), cancel: func() {}}
	if _, err := newImage(t, testOptions()).w.Finish(counting, tree()); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	checks := int(counting.calls.Load())
	if checks < 3 {
		t.Fatalf("Finish checked its context %d times, want it checked while it runs", checks)
	}
	for _, at := range []int{2, checks / 2, checks} {
		ctx, cancel := context.WithCancel(context.Background())
		c := &cancelAtCheck{Context: ctx, cancel: cancel, at: int32(at)}
		_, err := newImage(t, testOptions()).w.Finish(c, tree())
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Finish cancelled at check %d of %d: %v, want context.Canceled", at, checks, err)
		}
		if n := int(c.calls.Load()); n != at {
			t.Errorf("Finish cancelled at check %d went on to check %d times, want it to stop at once", at, n)
		}
	}
}

// cancelAtCheck is a context that cancels itself on its at-th Err call (never
// when at is zero) and counts the calls: Finish checks with Err, so the
// cancellation lands at a known point of the work.
type cancelAtCheck struct {
	context.Context
	cancel func()
	at     int32
	calls  atomic.Int32
}

func (c *cancelAtCheck) Err() error {
	if c.calls.Add(1) == c.at {
		c.cancel()
	}
	return c.Context.Err()
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

func TestMaxSize(t *testing.T) {
	o := testOptions()
	o.MaxSize = 16 << 20
	im := newImage(t, o)
	a := im.file(0o644, randBytes(1, 8<<20))
	if _, err := im.w.WriteData(context.Background(), bytes.NewReader(randBytes(2, 10<<20)), 10<<20); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("WriteData beyond MaxSize: %v, want ErrTooLarge", err)
	}
	// Fits as data, but not with the headroom asked for.
	b := im.file(0o644, randBytes(3, 6<<20))
	o.HeadroomMinBlocks = 2048
	im.w.opts.HeadroomMinBlocks = 2048
	if _, err := im.w.Finish(context.Background(), dir(map[string]*Node{"a": a, "b": b})); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Finish beyond MaxSize: %v, want ErrTooLarge", err)
	}
}

func TestMaxSizeFits(t *testing.T) {
	o := testOptions()
	o.MaxSize = 16 << 20
	o.HeadroomMinBlocks = 0
	o.HeadroomPercent = 0
	im := newImage(t, o)
	a := im.file(0o644, randBytes(1, 14<<20))
	st := im.finish(dir(map[string]*Node{"a": a}))
	if st.Size != 16<<20 {
		t.Errorf("image is %d bytes, want %d", st.Size, 16<<20)
	}
	imagetest.Fsck(t, im.path)
}

// TestNoSpace fills a small tmpfs. Data is written asynchronously, so the
// ENOSPC surfaces in a later WriteData or at the latest in Finish, wrapped
// with what was being written.
func TestNoSpace(t *testing.T) {
	d := imagetest.Tmpfs(t, "4m")
	im := newImageAt(t, filepath.Join(d, "fs.ext4"), testOptions())
	root := dir(map[string]*Node{})
	var err error
	for i := 0; i < 8 && err == nil; i++ {
		var data Data
		data, err = im.w.WriteData(context.Background(), bytes.NewReader(randBytes(uint64(i), 1<<20)), 1<<20)
		root.Children[itoa(i)] = &Node{Mode: ModeRegular | 0o644, Size: 1 << 20, Data: data}
	}
	if err == nil {
		_, err = im.w.Finish(context.Background(), root)
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing 8 MiB into 4 MiB: %v, want ENOSPC", err)
	}
	if !strings.Contains(err.Error(), "write data at block") {
		t.Errorf("error %q does not say what was written", err)
	}

	// Finish itself runs out of space: data leaves fewer free pages than
	// the metadata blocks (superblock, descriptors, bitmaps, inode table,
	// directories) need.
	d2 := imagetest.Tmpfs(t, "2m")
	im2 := newImageAt(t, filepath.Join(d2, "fs.ext4"), testOptions())
	n := im2.file(0o644, randBytes(2, 2040<<10))
	_, err = im2.w.Finish(context.Background(), dir(map[string]*Node{"f": n}))
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Finish on a full disk: %v, want ENOSPC", err)
	}
	if !strings.Contains(err.Error(), "write metadata at block") {
		t.Errorf("error %q does not say what was written", err)
	}
}
