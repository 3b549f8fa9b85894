package flatten_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fstest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// fuzzLimits keep a crafted layer from exhausting the fuzzer's memory, as
// the build's limits do in production.
var fuzzLimits = flatten.Limits{MaxEntries: 10000, MaxMemory: 64 << 20}

// maxFuzzFile bounds one file's size in the fuzz store: a sparse entry can
// declare terabytes of holes, which archive/tar expands to zeros, so
// storing it would take minutes without testing anything more.
const maxFuzzFile = 64 << 20

// cappedStore is a MemStore refusing files larger than maxFuzzFile.
type cappedStore struct{ *fstest.MemStore }

var errFuzzFileTooLarge = errors.New("file larger than the fuzz store holds")

func (s cappedStore) WriteData(ctx context.Context, r io.Reader, size int64) (ext4.Data, error) {
	if size > maxFuzzFile {
		return ext4.Data{}, errFuzzFileTooLarge
	}
	return s.MemStore.WriteData(ctx, r, size)
}

// FuzzApplyLayer applies two arbitrary tar layers (their header checksums
// fixed up, see imagetest.FixTarChecksums). It checks that
// ApplyLayer never panics; that every error is an *EntryError or a failure
// to read the tar stream ("apply layer N: read ..."); and that after
// success every name in the tree is one clean path component (nothing
// outside the root), no directory is reachable twice, and the store holds
// exactly the data the tree refers to.
func FuzzApplyLayer(f *testing.F) {
	addPairs := func(layers []imagetest.Layer) {
		var tars [][]byte
		for _, l := range layers {
			raw, err := l.Tar()
			if err != nil {
				f.Fatal(err)
			}
			tars = append(tars, raw)
		}
		if len(tars) == 1 {
			f.Add([]byte{}, tars[0])
		}
		for i := 1; i < len(tars); i++ {
			f.Add(tars[i-1], tars[i])
		}
	}
	for _, img := range imagetest.Corpus() {
		if !img.Large {
			addPairs(img.Layers)
		}
	}
	for _, c := range imagetest.Hostile() {
		addPairs(c.Layers)
	}
	f.Fuzz(func(t *testing.T, lower, upper []byte) {
		store := fstest.NewMemStore()
		tree := flatten.New(cappedStore{store}, flatten.Options{Limits: fuzzLimits})
		for i, layer := range [][]byte{lower, upper} {
			err := tree.ApplyLayer(context.Background(), i, bytes.NewReader(imagetest.FixTarChecksums(layer)))
			if err == nil {
				continue
			}
			var ee *flatten.EntryError
			if !errors.As(err, &ee) && !strings.HasPrefix(err.Error(), fmt.Sprintf("apply layer %d: read ", i)) {
				t.Fatalf("ApplyLayer(%d) error %q (%T) is neither an *EntryError nor a tar read error", i, err, err)
			}
			if ee != nil && ee.Layer != i {
				t.Fatalf("ApplyLayer(%d) error names layer %d: %v", i, ee.Layer, err)
			}
			return // the tree is half-applied and must be discarded
		}
		checkTreeNames(t, tree.Root())
		checkStore(t, tree, store)
	})
}

// checkTreeNames fails unless every directory entry below root is a clean
// name ext4 can store, and no directory is linked twice (a cycle, or a
// hard link to a directory).
func checkTreeNames(t *testing.T, root *ext4.Node) {
	t.Helper()
	seen := map[*ext4.Node]string{root: "/"}
	var walk func(dir *ext4.Node, p string, depth int)
	walk = func(dir *ext4.Node, p string, depth int) {
		if depth > flatten.MaxDepth {
			t.Fatalf("%s is more than %d levels deep", p, flatten.MaxDepth)
		}
		for name, c := range dir.Children {
			cp := p + "/" + name
			if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 255 {
				t.Fatalf("directory %s has an entry named %q", p, name)
			}
			if c == nil {
				t.Fatalf("%s is a nil node", cp)
			}
			if c.Mode&ext4.ModeTypeMask != ext4.ModeDir {
				continue
			}
			if other, ok := seen[c]; ok {
				t.Fatalf("directory %s is also linked at %s", cp, other)
			}
			seen[c] = cp
			walk(c, cp, depth+1)
		}
	}
	walk(root, "", 0)
}
