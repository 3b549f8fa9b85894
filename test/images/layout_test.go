package images

import (
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestWriteLayout: the layout's index lists each image once, by digest,
// the tagged one under its tag and the other without one.
func TestWriteLayout(t *testing.T) {
	tagged := New(t, Config{}, Layer{Tar: TarOf(t, map[string]string{"a": "tagged"})})
	plain := New(t, Config{}, Layer{Tar: TarOf(t, map[string]string{"a": "plain"})})
	dir := filepath.Join(t.TempDir(), "layout")
	WriteLayout(t, dir, map[string]v1.Image{"v1": tagged, "": plain})

	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	want := map[v1.Hash]string{}
	for tag, img := range map[string]v1.Image{"v1": tagged, "": plain} {
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		want[d] = tag
	}
	if len(m.Manifests) != len(want) {
		t.Fatalf("index lists %d manifests, want %d", len(m.Manifests), len(want))
	}
	for _, desc := range m.Manifests {
		tag, ok := want[desc.Digest]
		if !ok || desc.Annotations[refNameAnnotation] != tag {
			t.Errorf("index entry %s tagged %q; want one of the written images, tagged %q", desc.Digest, desc.Annotations[refNameAnnotation], tag)
		}
	}
}
