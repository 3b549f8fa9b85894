package flatten_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fstest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// files is a layer of n empty files in one directory.
func files(n int) imagetest.Layer {
	l := imagetest.Layer{imagetest.Dir("d/")}
	for i := range n {
		l = append(l, imagetest.File(fmt.Sprintf("d/f%06d", i), ""))
	}
	return l
}

// limitErr asserts err is an EntryError for entry, caused by the named
// limit.
func limitErr(t *testing.T, err error, entry, limit string) {
	t.Helper()
	var ee *flatten.EntryError
	var le *flatten.LimitError
	if !errors.As(err, &ee) || !errors.As(err, &le) {
		t.Fatalf("err = %v, want an EntryError caused by a LimitError", err)
	}
	if ee.Name != entry || le.Limit != limit {
		t.Errorf("err names entry %q and limit %q, want %q and %q", ee.Name, le.Limit, entry, limit)
	}
	if !strings.Contains(err.Error(), limit) {
		t.Errorf("message %q does not name %s", err, limit)
	}
}

func TestMaxEntries(t *testing.T) {
	tree := flatten.New(fstest.NewMemStore(), flatten.Options{Limits: flatten.Limits{MaxEntries: 10}})
	flattenLayers(t, tree, []imagetest.Layer{files(9)}, images.Uncompressed) // 10 entries with d/
	err := applyLayer(tree, 1, imagetest.Layer{imagetest.Whiteout("d/f000000")}, images.Uncompressed)
	limitErr(t, err, "d/.wh.f000000", flatten.LimitEntries)
}

func TestMaxMemory(t *testing.T) {
	budget := 100 * flatten.EntryMemory
	t.Run("Files", func(t *testing.T) {
		tree := flatten.New(fstest.NewMemStore(), flatten.Options{Limits: flatten.Limits{MaxMemory: budget}})
		err := applyLayer(tree, 0, files(1000), images.Uncompressed)
		var le *flatten.LimitError
		if !errors.As(err, &le) || le.Limit != flatten.LimitMemory {
			t.Fatalf("err = %v, want the memory limit", err)
		}
		if tree.Memory() > budget+flatten.EntryMemory+64 {
			t.Errorf("tree grew to %d bytes past its %d-byte budget", tree.Memory(), budget)
		}
	})
	t.Run("ImplicitDirectories", func(t *testing.T) {
		// One entry whose parents the tree must create: they count too.
		deep := strings.Repeat("d/", 200) + "f"
		tree := flatten.New(fstest.NewMemStore(), flatten.Options{Limits: flatten.Limits{MaxMemory: budget}})
		err := applyLayer(tree, 0, imagetest.Layer{imagetest.File(deep, "")}, images.Uncompressed)
		limitErr(t, err, deep, flatten.LimitMemory)
	})
	t.Run("Xattrs", func(t *testing.T) {
		// Attributes count by their size: 100 files of 3 KiB attributes
		// are far over a budget that 100 plain files fit in.
		l := imagetest.Layer{}
		for i := range 100 {
			l = append(l, imagetest.File(fmt.Sprintf("f%03d", i), "").Xattr("user.pad", strings.Repeat("x", 3000)))
		}
		tree := flatten.New(fstest.NewMemStore(), flatten.Options{Limits: flatten.Limits{MaxMemory: budget + 100*100}})
		var le *flatten.LimitError
		if err := applyLayer(tree, 0, l, images.Uncompressed); !errors.As(err, &le) || le.Limit != flatten.LimitMemory {
			t.Fatalf("err = %v, want the memory limit", err)
		}
	})
}

// TestMemoryIsReturned checks that deleted content leaves the estimate, so
// images that replace their files layer after layer are not refused.
func TestMemoryIsReturned(t *testing.T) {
	tree := flatten.New(fstest.NewMemStore(), flatten.Options{})
	empty := tree.Memory()
	flattenLayers(t, tree, []imagetest.Layer{files(500)}, images.Uncompressed)
	full := tree.Memory()
	if full < empty+500*flatten.EntryMemory {
		t.Fatalf("500 files cost %d bytes of estimate, want at least %d", full-empty, 500*flatten.EntryMemory)
	}
	for i := 1; i <= 5; i++ { // the same files rewritten: no growth
		if err := applyLayer(tree, i, files(500), images.Uncompressed); err != nil {
			t.Fatal(err)
		}
	}
	if got := tree.Memory(); got != full {
		t.Errorf("after rewriting the same files the estimate is %d, want %d", got, full)
	}
	if err := applyLayer(tree, 6, imagetest.Layer{imagetest.Whiteout("d")}, images.Uncompressed); err != nil {
		t.Fatal(err)
	}
	if got := tree.Memory(); got != empty {
		t.Errorf("after deleting everything the estimate is %d, want %d", got, empty)
	}
}

// TestMemoryCountsExtras checks that a node with a link target, device
// numbers or xattrs is charged the allocation holding them, and gives it
// back once a later layer clears them.
func TestMemoryCountsExtras(t *testing.T) {
	extra := ext4.NewSymlink([]byte("x")).ExtraMemory()
	if extra <= 0 {
		t.Fatalf("ExtraMemory of a symlink = %d, want more than 0", extra)
	}
	memory := func(layers ...imagetest.Layer) int64 {
		t.Helper()
		tree := flatten.New(fstest.NewMemStore(), flatten.Options{})
		flattenLayers(t, tree, layers, images.Uncompressed)
		return tree.Memory()
	}
	plain := memory(imagetest.Layer{imagetest.Dir("d/"), imagetest.File("d/e", "")})
	if got, want := memory(imagetest.Layer{imagetest.Dir("d/"), imagetest.Symlink("d/e", "target")}), plain+extra+int64(len("target")); got != want {
		t.Errorf("symlink: estimate %d, want %d (a file's %d, the extras' %d and the target's 6)", got, want, plain, extra)
	}
	if got, want := memory(imagetest.Layer{imagetest.Dir("d/"), imagetest.Char("d/e", 1, 3)}), plain+extra; got != want {
		t.Errorf("device: estimate %d, want %d (a file's %d and the extras' %d)", got, want, plain, extra)
	}
	withX := imagetest.Layer{imagetest.Dir("d/").Xattr("user.a", "b"), imagetest.File("d/e", "")}
	if got, min := memory(withX), plain+extra+int64(len("user.a")+len("b")); got < min {
		t.Errorf("xattr: estimate %d, want at least %d", got, min)
	}
	if got := memory(withX, imagetest.Layer{imagetest.Dir("d/")}); got != plain {
		t.Errorf("xattr cleared by a later layer: estimate %d, want %d", got, plain)
	}
}

func TestPathLimits(t *testing.T) {
	cases := []struct {
		name, entry, want string
	}{
		{"TooLong", strings.Repeat("n/", 2100) + "f", "name longer than 4095 bytes"},
		{"TooDeep", strings.Repeat("d/", 1025) + "f", "more than 1024 path components"},
		// 400,000 levels in one PAX name: refused before one directory
		// is created.
		{"Huge", strings.Repeat("d/", 400_000) + "f", "name longer than 4095 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tree := flatten.New(fstest.NewMemStore(), flatten.Options{})
			before := tree.Memory()
			err := applyLayer(tree, 0, imagetest.Layer{imagetest.File(c.entry, "")}, images.Uncompressed)
			var ee *flatten.EntryError
			if !errors.As(err, &ee) || ee.Name != c.entry || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %.300v, want an EntryError saying %q", err, c.want)
			}
			if len(err.Error()) > 1024 {
				t.Errorf("the message carries %d bytes of the name; want it shortened", len(err.Error()))
			}
			if tree.Memory() != before {
				t.Errorf("a refused entry grew the tree's estimate from %d to %d", before, tree.Memory())
			}
		})
	}
}

func TestReadFileTooLarge(t *testing.T) {
	tree := flatten.New(fstest.NewMemStore(), flatten.Options{})
	size := int64(flatten.MaxReadFile + 1)
	if err := tree.WriteFile(context.Background(), "etc/big", bytes.NewReader(make([]byte, size)), size, flatten.FileAttr{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if _, err := tree.ReadFile("etc/big"); !errors.Is(err, flatten.ErrTooLarge) {
		t.Errorf("ReadFile of %d bytes = %v, want ErrTooLarge", size, err)
	}
}
