package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestRemoveArtifact(t *testing.T) {
	write := func(t *testing.T, path string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name    string
		setup   func(t *testing.T, store Store)
		refused bool
	}{
		{"Missing", func(*testing.T, Store) {}, false},
		{"Empty", func(t *testing.T, s Store) { os.Mkdir(s.ArtifactDir("a"), 0o755) }, false},
		{"Image", func(t *testing.T, s Store) { write(t, s.ArtifactPath("a")) }, false},
		{"ImageAndTemporaries", func(t *testing.T, s Store) {
			write(t, s.ArtifactPath("a"))
			write(t, s.ArtifactPath("a")+".tmp-otherhost-0011")
			write(t, s.ArtifactPath("a")+tempMarker()+"aabb")
		}, false},
		{"ForeignFile", func(t *testing.T, s Store) {
			write(t, s.ArtifactPath("a"))
			write(t, filepath.Join(s.ArtifactDir("a"), "templates.json"))
		}, true},
		{"OtherArtifactsImage", func(t *testing.T, s Store) { write(t, filepath.Join(s.ArtifactDir("a"), "b.ext4")) }, true},
		{"Subdirectory", func(t *testing.T, s Store) { os.MkdirAll(filepath.Join(s.ArtifactDir("a"), "sub"), 0o755) }, true},
		{"ImageNamedDirectory", func(t *testing.T, s Store) { os.MkdirAll(s.ArtifactPath("a"), 0o755) }, true},
		{"ImageSymlink", func(t *testing.T, s Store) {
			os.Mkdir(s.ArtifactDir("a"), 0o755)
			os.Symlink("/etc/passwd", s.ArtifactPath("a"))
		}, true},
		{"DirectorySymlink", func(t *testing.T, s Store) {
			target := filepath.Join(filepath.Dir(string(s)), "elsewhere")
			write(t, filepath.Join(target, "a.ext4"))
			os.Symlink(target, s.ArtifactDir("a"))
		}, true},
		{"RegularFile", func(t *testing.T, s Store) { write(t, s.ArtifactDir("a")) }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := Store(filepath.Join(t.TempDir(), "store"))
			if err := os.MkdirAll(string(store), 0o755); err != nil {
				t.Fatal(err)
			}
			c.setup(t, store)
			before := treeOf(t, filepath.Dir(string(store)))
			err := store.RemoveArtifact("a")
			if c.refused {
				if !errors.Is(err, ErrNotArtifact) {
					t.Fatalf("RemoveArtifact = %v, want ErrNotArtifact", err)
				}
				if after := treeOf(t, filepath.Dir(string(store))); !slices.Equal(before, after) {
					t.Errorf("a refused delete changed the tree:\nbefore %v\nafter  %v", before, after)
				}
				return
			}
			if err != nil {
				t.Fatalf("RemoveArtifact = %v", err)
			}
			if _, err := os.Lstat(store.ArtifactDir("a")); !os.IsNotExist(err) {
				t.Errorf("artifact directory still there: %v", err)
			}
		})
	}
}

// treeOf lists every path below root (links not followed).
func treeOf(t *testing.T, root string) []string {
	t.Helper()
	var paths []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		paths = append(paths, p+" "+fi.Mode().String())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}
