package imagetest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// refTag is the tag of the image in layouts written by WriteLayout.
const refTag = "test"

// WriteLayout writes layers as a single-image OCI layout in dir, tagged
// "test", each layer encoded with c.
func WriteLayout(dir string, layers []Layer, c images.Compression) error {
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	put := func(b []byte) (v1.Hash, error) {
		sum := sha256.Sum256(b)
		h := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
		return h, os.WriteFile(filepath.Join(blobs, h.Hex), b, 0o644)
	}
	mediaType := map[images.Compression]types.MediaType{
		images.Uncompressed: types.OCIUncompressedLayer,
		images.Gzip:         types.OCILayer,
		images.Zstd:         types.OCILayerZStd,
	}[c]
	if mediaType == "" {
		return fmt.Errorf("write layout: unknown compression %q", c)
	}
	cfg := v1.ConfigFile{Architecture: "amd64", OS: "linux", RootFS: v1.RootFS{Type: "layers"}}
	man := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1}
	for i, l := range layers {
		raw, err := l.Tar()
		if err != nil {
			return fmt.Errorf("write layout: layer %d: %w", i, err)
		}
		sum := sha256.Sum256(raw)
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])})
		blob, err := c.Encode(raw)
		if err != nil {
			return fmt.Errorf("write layout: layer %d: %w", i, err)
		}
		h, err := put(blob)
		if err != nil {
			return fmt.Errorf("write layout: layer %d: %w", i, err)
		}
		man.Layers = append(man.Layers, v1.Descriptor{MediaType: mediaType, Digest: h, Size: int64(len(blob))})
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	ch, err := put(cfgJSON)
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	man.Config = v1.Descriptor{MediaType: types.OCIConfigJSON, Digest: ch, Size: int64(len(cfgJSON))}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	mh, err := put(manJSON)
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{{
		MediaType:   types.OCIManifestSchema1,
		Digest:      mh,
		Size:        int64(len(manJSON)),
		Annotations: map[string]string{"org.opencontainers.image.ref.name": refTag},
	}}}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "index.json"), idxJSON, 0o644); err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	return nil
}

// UmociRootfs flattens layers with `umoci unpack` (Debian package umoci;
// run as root so ownership is kept) and returns the rootfs directory, under
// t.TempDir(). It is the reference the flattening is compared against.
func UmociRootfs(t testing.TB, layers []Layer) string {
	t.Helper()
	if _, err := exec.LookPath("umoci"); err != nil {
		t.Fatalf("umoci not found (apt-get install -y umoci): %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("umoci keeps ownership and creates device nodes only as root")
	}
	dir := t.TempDir()
	layout := filepath.Join(dir, "layout")
	if err := WriteLayout(layout, layers, images.Gzip); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	// umask 022: umoci creates implied parent directories with 0777 &^ umask.
	cmd := exec.Command("sh", "-c", `umask 022 && exec umoci unpack --image "$1" "$2"`, "sh", layout+":"+refTag, bundle)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("umoci unpack: %v\n%s", err, out.String())
	}
	return filepath.Join(bundle, "rootfs")
}

// ReferenceOptions are how a flattening of img is compared with ref, its
// unpack by UmociRootfs. They ignore directory mtimes only: those of
// directories no layer declares (the root included), because umoci stamps
// implied parents with the time of the unpack while the flattening uses a
// fixed time; and those listed in UmociMtimeSkew, which umoci gets wrong.
func (img Image) ReferenceOptions(ref Snapshot) DiffOptions {
	declared := DeclaredDirs(img.Layers)
	skew := make(map[string]bool)
	for _, p := range img.UmociMtimeSkew {
		skew[p] = true
	}
	return DiffOptions{
		IgnoreMtime: func(p string) bool { return ref[p].Type == "dir" && (!declared[p] || skew[p]) },
	}
}
