package flatten_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fstest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// pathLayer is the fixture of the path tests.
func pathLayer() imagetest.Layer {
	l := imagetest.Layer{
		imagetest.Dir("etc/"), imagetest.Dir("etc/ssl/"), imagetest.Dir("etc/ssl/certs/"),
		imagetest.File("etc/ssl/certs/ca.crt", "CA"),
		imagetest.Symlink("etc/ssl/cert.pem", "certs/ca.crt"),
		imagetest.Symlink("abs", "/etc/ssl/certs/ca.crt"),
		imagetest.Symlink("up", "../../../../etc"),
		imagetest.Symlink("loop1", "loop2"), imagetest.Symlink("loop2", "loop1"),
		imagetest.Symlink("dangling", "nowhere/x"),
		imagetest.Symlink("dir", "etc/ssl"),
		imagetest.File("file", "f"),
		imagetest.Symlink("chain1", "chain2"), imagetest.Symlink("chain2", "abs"),
		imagetest.Link("hard", "file"),
	}
	// hop0 -> hop1 -> ... -> hop40 -> file: 41 symlinks from hop0, 40 from hop1.
	for i := range 41 {
		target := fmt.Sprintf("hop%d", i+1)
		if i == 40 {
			target = "file"
		}
		l = append(l, imagetest.Symlink(fmt.Sprintf("hop%d", i), target))
	}
	return l
}

func newPathTree(t *testing.T) (*flatten.Tree, *fstest.MemStore) {
	t.Helper()
	store := fstest.NewMemStore()
	tree := flatten.New(store, flatten.Options{RootTime: imagetest.T1})
	flattenLayers(t, tree, []imagetest.Layer{pathLayer()}, images.Uncompressed)
	return tree, store
}

func TestResolve(t *testing.T) {
	tree, _ := newPathTree(t)
	tests := []struct {
		path     string
		wantPath string
		wantErr  error
	}{
		{"etc/ssl/cert.pem", "etc/ssl/certs/ca.crt", nil},
		{"/abs", "etc/ssl/certs/ca.crt", nil},
		{"up/ssl/certs/ca.crt", "etc/ssl/certs/ca.crt", nil},
		{"../../etc/ssl/certs/ca.crt", "etc/ssl/certs/ca.crt", nil},
		{"dir/certs/../cert.pem", "etc/ssl/certs/ca.crt", nil},
		{"chain1", "etc/ssl/certs/ca.crt", nil},
		{"hop1", "file", nil},
		{"hop0", "", flatten.ErrLoop},
		{"loop1", "", flatten.ErrLoop},
		{"dangling", "", fs.ErrNotExist},
		{"etc/ssl/certs/missing", "etc/ssl/certs/missing", fs.ErrNotExist},
		{"dir/missing", "etc/ssl/missing", fs.ErrNotExist},
		{"file/x", "", flatten.ErrNotDir},
		{".", ".", nil},
		{"/", ".", nil},
		{"", ".", nil},
	}
	for _, tc := range tests {
		t.Run(strings.ReplaceAll(tc.path, "/", "_"), func(t *testing.T) {
			n, p, err := tree.Resolve(tc.path)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("Resolve(%q) error = %v, want %v", tc.path, err, tc.wantErr)
			}
			if tc.wantPath != "" && p != tc.wantPath {
				t.Errorf("Resolve(%q) path = %q, want %q", tc.path, p, tc.wantPath)
			}
			if err != nil {
				if n != nil {
					t.Errorf("Resolve(%q) returned a node with error %v", tc.path, err)
				}
				return
			}
			want, err := tree.Lookup(tc.wantPath)
			if err != nil {
				t.Fatal(err)
			}
			if n != want {
				t.Errorf("Resolve(%q) node is not Lookup(%q)", tc.path, tc.wantPath)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	tree, _ := newPathTree(t)
	tests := []struct {
		path     string
		wantType uint32
		wantErr  error
	}{
		{"etc/ssl/cert.pem", ext4.ModeSymlink, nil},
		{"/etc/../etc/ssl", ext4.ModeDir, nil},
		{"./etc/ssl/certs/ca.crt", ext4.ModeRegular, nil},
		{"", ext4.ModeDir, nil},
		{"/", ext4.ModeDir, nil},
		{"dir/certs", 0, flatten.ErrSymlink},
		{"file/x", 0, flatten.ErrNotDir},
		{"missing", 0, fs.ErrNotExist},
		{"etc/missing/x", 0, fs.ErrNotExist},
	}
	for _, tc := range tests {
		n, err := tree.Lookup(tc.path)
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
			t.Errorf("Lookup(%q) error = %v, want %v", tc.path, err, tc.wantErr)
			continue
		}
		if err == nil && n.Mode&ext4.ModeTypeMask != tc.wantType {
			t.Errorf("Lookup(%q) type = %#o, want %#o", tc.path, n.Mode&ext4.ModeTypeMask, tc.wantType)
		}
	}
	if root, _ := tree.Lookup("."); root != tree.Root() {
		t.Error("Lookup(\".\") is not Root()")
	}
}

func TestWriteFile(t *testing.T) {
	ctx := context.Background()
	attr := flatten.FileAttr{Mode: 0o4750, UID: 3, GID: 4, Mtime: imagetest.T2,
		Xattrs: []ext4.Xattr{{Name: "user.a", Value: []byte("b")}}}
	write := func(tree *flatten.Tree, p, content string) error {
		return tree.WriteFile(ctx, p, strings.NewReader(content), int64(len(content)), attr)
	}

	t.Run("CreatesParents", func(t *testing.T) {
		tree, store := newPathTree(t)
		if err := write(tree, "new/deep/file", "x"); err != nil {
			t.Fatal(err)
		}
		want := imagetest.Expect(
			imagetest.WDir("new", 0o755).At(imagetest.T2),
			imagetest.WDir("new/deep", 0o755).At(imagetest.T2),
			imagetest.WFile("new/deep/file", 0o4750, "x").Owner(3, 4).WithXattr("user.a", "b").At(imagetest.T2),
		)
		got := snapshot(t, tree, store)
		for p := range got {
			if !strings.HasPrefix(p, "new") {
				delete(got, p)
			}
		}
		for _, d := range imagetest.Check(want, got) {
			t.Error(d)
		}
		checkStore(t, tree, store)
	})

	t.Run("ReplacesFileAndReleasesData", func(t *testing.T) {
		tree, store := newPathTree(t)
		before := store.Released()
		if err := write(tree, "etc/ssl/certs/ca.crt", "new CA"); err != nil {
			t.Fatal(err)
		}
		if got, err := tree.ReadFile("etc/ssl/certs/ca.crt"); err != nil || string(got) != "new CA" {
			t.Errorf("ReadFile = %q, %v; want %q", got, err, "new CA")
		}
		if got := store.Released() - before; got != 1 {
			t.Errorf("Released %d data, want 1", got)
		}
		checkStore(t, tree, store)
	})

	t.Run("BreaksHardLink", func(t *testing.T) {
		tree, store := newPathTree(t)
		before := store.Released()
		if err := write(tree, "file", "new"); err != nil {
			t.Fatal(err)
		}
		if got, _ := tree.ReadFile("hard"); string(got) != "f" {
			t.Errorf("other link reads %q, want %q", got, "f")
		}
		if got := store.Released() - before; got != 0 {
			t.Errorf("Released %d data while a link remains, want 0", got)
		}
		checkStore(t, tree, store)
	})

	t.Run("ReplacesSymlinkLeaf", func(t *testing.T) {
		tree, store := newPathTree(t)
		if err := write(tree, "etc/ssl/cert.pem", "own"); err != nil {
			t.Fatal(err)
		}
		n, err := tree.Lookup("etc/ssl/cert.pem")
		if err != nil || n.Mode&ext4.ModeTypeMask != ext4.ModeRegular {
			t.Fatalf("Lookup after WriteFile: %v, %v; want a regular file", n, err)
		}
		if got, _ := tree.ReadFile("etc/ssl/certs/ca.crt"); string(got) != "CA" {
			t.Errorf("symlink target changed to %q", got)
		}
		checkStore(t, tree, store)
	})

	t.Run("FollowsSymlinkedParent", func(t *testing.T) {
		tree, store := newPathTree(t)
		if err := write(tree, "dir/certs/other.crt", "o"); err != nil {
			t.Fatal(err)
		}
		if _, err := tree.Lookup("etc/ssl/certs/other.crt"); err != nil {
			t.Errorf("file not written through the symlinked parent: %v", err)
		}
		checkStore(t, tree, store)
	})

	errTests := []struct {
		name, path string
		want       error
	}{
		{"DanglingParent", "dangling/f", fs.ErrNotExist},
		{"ParentIsFile", "file/x", flatten.ErrNotDir},
		{"LeafIsDir", "etc", flatten.ErrIsDir},
		{"Root", "/", flatten.ErrIsDir},
		{"ParentLoop", "loop1/x", flatten.ErrLoop},
	}
	for _, tc := range errTests {
		t.Run(tc.name, func(t *testing.T) {
			tree, store := newPathTree(t)
			before := snapshot(t, tree, store)
			err := write(tree, tc.path, "x")
			if !errors.Is(err, tc.want) {
				t.Fatalf("WriteFile(%q) = %v, want %v", tc.path, err, tc.want)
			}
			for _, d := range imagetest.Diff(before, snapshot(t, tree, store), imagetest.DiffOptions{}) {
				t.Errorf("failed WriteFile changed the tree: %s", d)
			}
		})
	}

	t.Run("StoreError", func(t *testing.T) {
		store := &failingStore{MemStore: fstest.NewMemStore(), failAt: 1}
		tree := flatten.New(store, flatten.Options{})
		err := tree.WriteFile(ctx, "f", strings.NewReader("x"), 1, attr)
		if !errors.Is(err, errStore) {
			t.Fatalf("WriteFile = %v, want %v", err, errStore)
		}
		if _, err := tree.Lookup("f"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Lookup after failed WriteFile = %v, want not found", err)
		}
	})
}

func TestReadFile(t *testing.T) {
	tree, _ := newPathTree(t)
	if got, err := tree.ReadFile("chain1"); err != nil || string(got) != "CA" {
		t.Errorf("ReadFile(chain1) = %q, %v; want %q", got, err, "CA")
	}
	if _, err := tree.ReadFile("etc"); err == nil {
		t.Error("ReadFile(etc) succeeded on a directory")
	}
	if _, err := tree.ReadFile("missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile(missing) = %v, want not found", err)
	}
}

// TestStats checks the counts against what the corpus expectations list.
func TestStats(t *testing.T) {
	for _, img := range imagetest.Corpus() {
		if img.Large {
			continue
		}
		t.Run(img.Name, func(t *testing.T) {
			store := fstest.NewMemStore()
			tree := flatten.New(store, flatten.Options{})
			flattenLayers(t, tree, img.Layers, images.Uncompressed)
			var want flatten.Stats
			want.Dirs = 1 // the root
			groups := make(map[string]bool)
			for p, i := range img.Want() {
				if p == "." {
					continue
				}
				if i.Group != "" {
					if groups[i.Group] {
						want.HardLinks++
						continue
					}
					groups[i.Group] = true
				}
				switch i.Type {
				case "dir":
					want.Dirs++
				case "file":
					want.Files++
					want.Bytes += i.Size
				case "symlink":
					want.Symlinks++
				case "char", "block":
					want.Devices++
				case "fifo":
					want.FIFOs++
				}
			}
			want.Inodes = want.Dirs + want.Files + want.Symlinks + want.Devices + want.FIFOs
			for _, l := range img.Layers {
				for _, e := range l {
					base := path.Base(e.Name)
					switch {
					case e.Type == tar.TypeXGlobalHeader:
					case strings.HasPrefix(base, ".wh..wh.") && base != ".wh..wh..opq":
						// AUFS metadata, skipped
					case strings.HasPrefix(base, ".wh."):
						want.Whiteouts++
						want.Entries++
					default:
						want.Entries++
					}
				}
			}
			if got := tree.Stats(); got != want {
				t.Errorf("Stats() = %+v, want %+v", got, want)
			}
		})
	}
}

// errStore is the error failingStore injects.
var errStore = errors.New("injected store failure")

// failingStore fails its failAt-th WriteData call (1-based).
type failingStore struct {
	*fstest.MemStore
	calls, failAt int
}

func (s *failingStore) WriteData(ctx context.Context, r io.Reader, size int64) (ext4.Data, error) {
	s.calls++
	if s.calls == s.failAt {
		return ext4.Data{}, errStore
	}
	return s.MemStore.WriteData(ctx, r, size)
}
