package flatten_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fstest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// encodings rotate over the corpus so every rule is also exercised through
// Decompress with each layer encoding.
var encodings = []images.Compression{images.Gzip, images.Zstd, images.Uncompressed}

// flattenLayers applies layers in order, each encoded with enc and
// decoded by layercodec.Decompress.
func flattenLayers(t testing.TB, tree *flatten.Tree, layers []imagetest.Layer, enc images.Compression) {
	t.Helper()
	for i, l := range layers {
		if err := applyLayer(tree, i, l, enc); err != nil {
			t.Fatalf("ApplyLayer(%d): %v", i, err)
		}
	}
}

func applyLayer(tree *flatten.Tree, i int, l imagetest.Layer, enc images.Compression) error {
	raw, err := l.Tar()
	if err != nil {
		return err
	}
	blob, err := enc.Encode(raw)
	if err != nil {
		return err
	}
	rc, err := layercodec.Decompress(bytes.NewReader(blob), nil)
	if err != nil {
		return err
	}
	defer rc.Close()
	return tree.ApplyLayer(context.Background(), i, rc)
}

// checkStore verifies that the store holds exactly the data the tree
// refers to: nothing leaked, nothing released while still linked.
func checkStore(t testing.TB, tree *flatten.Tree, store *fstest.MemStore) {
	t.Helper()
	referenced := make(map[uint64]bool)
	var walk func(n *ext4.Node)
	walk = func(n *ext4.Node) {
		if n.Mode&ext4.ModeTypeMask == ext4.ModeRegular {
			referenced[store.DataID(n.Data)] = true
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(tree.Root())
	live := store.Live()
	for id := range referenced {
		if !live[id] {
			t.Errorf("tree refers to data %d, which is released", id)
		}
	}
	for id := range live {
		if !referenced[id] {
			t.Errorf("data %d is live but no path refers to it (leak)", id)
		}
	}
	for _, m := range store.Misuse() {
		t.Errorf("store misuse: %s", m)
	}
}

func snapshot(t testing.TB, tree *flatten.Tree, store flatten.DataStore) imagetest.Snapshot {
	t.Helper()
	s, err := fstest.SnapshotTree(tree.Root(), store.OpenData)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCorpus flattens every corpus image three ways and checks each
// against the hand-written expectation and against umoci's unpack:
// Memory (an in-memory store, also checking data is released exactly when
// the last link goes), Umoci (the reference itself) and Ext4 (the real image
// writer, then e2fsck, a read-only loop mount and a snapshot).
func TestCorpus(t *testing.T) {
	for i, img := range imagetest.Corpus() {
		t.Run(img.Name, func(t *testing.T) {
			if img.Large && testing.Short() {
				t.Skip("large image in -short mode")
			}
			var ref imagetest.Snapshot
			reference := func(t *testing.T) imagetest.Snapshot {
				t.Helper()
				if img.NoReference != "" {
					return nil
				}
				if ref == nil {
					s, err := imagetest.SnapshotDir(imagetest.UmociRootfs(t, img.Layers))
					if err != nil {
						t.Fatal(err)
					}
					ref = s
				}
				return ref
			}
			t.Run("Memory", func(t *testing.T) {
				store := fstest.NewMemStore()
				tree := flatten.New(store, flatten.Options{RootTime: imagetest.T1})
				flattenLayers(t, tree, img.Layers, encodings[i%len(encodings)])
				got := snapshot(t, tree, store)
				for _, d := range imagetest.Check(img.Want(), got) {
					t.Error(d)
				}
				checkStore(t, tree, store)
				if os.Geteuid() != 0 {
					return // umoci needs root; Umoci reports the skip
				}
				if ref := reference(t); ref != nil {
					for _, d := range imagetest.Diff(ref, got, img.ReferenceOptions(ref)) {
						t.Errorf("differs from umoci: %s", d)
					}
				}
			})
			t.Run("Umoci", func(t *testing.T) {
				if img.NoReference != "" {
					t.Skip(img.NoReference)
				}
				want := img.Want()
				for _, p := range img.UmociMtimeSkew {
					i := want[p]
					i.Mtime = time.Time{}
					want[p] = i
				}
				for _, d := range imagetest.Check(want, reference(t)) {
					t.Errorf("umoci disagrees with the expectation: %s", d)
				}
			})
			t.Run("Ext4", func(t *testing.T) {
				got := flattenToExt4(t, img.Layers)
				want := img.Want()
				for _, d := range imagetest.Diff(want, got, imagetest.CheckOptions(want).SkipLostFound()) {
					t.Error(d)
				}
				if ref := reference(t); ref != nil {
					for _, d := range imagetest.Diff(ref, got, img.ReferenceOptions(ref).SkipLostFound()) {
						t.Errorf("differs from umoci: %s", d)
					}
				}
			})
		})
	}
}

// ext4Options are the image options of the tests.
func ext4Options() ext4.Options {
	return ext4.Options{
		UUID:              [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		HashSeed:          [16]byte{16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1},
		Label:             "flatten-test",
		Time:              imagetest.T1,
		JournalBlocks:     1024,
		HeadroomPercent:   10,
		HeadroomMinBlocks: 256,
		HeadroomInodes:    64,
	}
}

// flattenToExt4 flattens layers into a real ext4 image, checks it with
// e2fsck, mounts it read-only and returns its snapshot.
func flattenToExt4(t *testing.T, layers []imagetest.Layer) imagetest.Snapshot {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.ext4")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := ext4.NewWriter(f, ext4Options())
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	tree := flatten.New(w, flatten.Options{RootTime: imagetest.T1})
	flattenLayers(t, tree, layers, images.Gzip)
	if _, err := w.Finish(context.Background(), tree.Root()); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	imagetest.Fsck(t, path)
	got, err := imagetest.SnapshotDir(imagetest.Mount(t, path))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestHostile(t *testing.T) {
	for _, c := range imagetest.Hostile() {
		t.Run(c.Name, func(t *testing.T) {
			store := fstest.NewMemStore()
			tree := flatten.New(store, flatten.Options{})
			last := len(c.Layers) - 1
			flattenLayers(t, tree, c.Layers[:last], images.Uncompressed)
			err := applyLayer(tree, last, c.Layers[last], images.Uncompressed)
			var ee *flatten.EntryError
			if !errors.As(err, &ee) {
				t.Fatalf("ApplyLayer(%d) = %v, want an *EntryError", last, err)
			}
			if ee.Layer != last || ee.Name != c.Entry {
				t.Errorf("EntryError names layer %d entry %q, want layer %d entry %q", ee.Layer, ee.Name, last, c.Entry)
			}
			msg := err.Error()
			for _, want := range []string{c.Err, fmt.Sprintf("layer %d", last), fmt.Sprintf("%q", c.Entry)} {
				if !bytes.Contains([]byte(msg), []byte(want)) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
		})
	}
}
