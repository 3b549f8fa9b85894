package rootfs_test

import (
	"go/build"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/cubesandbox/cubetemplatecenter/"

// imports returns the non-test imports of every package under root (a
// directory relative to this one), keyed by directory.
func imports(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := make(map[string][]string)
	err := filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if d.Name() == "testdata" {
			return filepath.SkipDir
		}
		pkg, err := build.ImportDir(dir, 0)
		if _, ok := err.(*build.NoGoError); ok {
			return nil
		}
		if err != nil {
			return err
		}
		out[dir] = pkg.Imports
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

// TestDependencyDirection keeps the layering the packages' docs state:
// agent and cmd build images through the rootfs facade only, rootfs never
// imports agent or spool, the layer cache does not know the image sources,
// and the codecs are a leaf.
func TestDependencyDirection(t *testing.T) {
	rules := []struct {
		root   string
		banned []string
	}{
		{"../agent", []string{"rootfs/oci", "rootfs/blobcache", "rootfs/layercodec"}},
		{"../cmd", []string{"rootfs/oci", "rootfs/blobcache", "rootfs/layercodec"}},
		{".", []string{"agent", "spool"}},
		{"blobcache", []string{"rootfs/oci"}},
		{"layercodec", []string{""}}, // no package of this module
	}
	for _, r := range rules {
		for dir, imps := range imports(t, r.root) {
			for _, imp := range imps {
				rest, ok := strings.CutPrefix(imp, module)
				if !ok {
					continue
				}
				for _, b := range r.banned {
					if b == "" || rest == b || strings.HasPrefix(rest, b+"/") {
						t.Errorf("%s imports %s", dir, imp)
					}
				}
			}
		}
	}
}
