package images

import (
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// refNameAnnotation names an image inside an OCI layout's index.json: the
// tag of an oci-layout:DIR:TAG reference.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// WriteLayout writes imgs as an OCI image layout in dir, each image under
// the tag it is keyed by ("" for none).
func WriteLayout(tb testing.TB, dir string, imgs map[string]v1.Image) {
	tb.Helper()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		tb.Fatalf("images: write layout %s: %v", dir, err)
	}
	for tag, img := range imgs {
		var opts []layout.Option
		if tag != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{refNameAnnotation: tag}))
		}
		if err := lp.AppendImage(img, opts...); err != nil {
			tb.Fatalf("images: append image %q to layout %s: %v", tag, dir, err)
		}
	}
}
