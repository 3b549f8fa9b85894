package oci

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

func TestOCILayout(t *testing.T) {
	root := t.TempDir()
	img1 := testImage(t, 2, 1024)
	img2 := testImage(t, 3, 1024)
	two := filepath.Join(root, "two")
	images.WriteLayout(t, two, map[string]v1.Image{"v1": img1, "v2": img2})
	one := filepath.Join(root, "one")
	images.WriteLayout(t, one, map[string]v1.Image{"": img2})
	p := newTestPuller(t, Options{LocalRoots: []string{root}})

	t.Run("Tag", func(t *testing.T) {
		got := fetchAll(t, p, Source{Ref: "oci-layout:" + two + ":v1"}, compressedLayers(t, img1))
		checkImage(t, got, img1, "oci-layout:"+two)
	})
	t.Run("Digest", func(t *testing.T) {
		got := fetchAll(t, p, Source{Ref: "oci-layout:" + two + "@" + mustDigest(t, img2).String()}, compressedLayers(t, img2))
		checkImage(t, got, img2, "oci-layout:"+two)
	})
	t.Run("OnlyImage", func(t *testing.T) {
		got := fetchAll(t, p, Source{Ref: "oci-layout:" + one}, compressedLayers(t, img2))
		checkImage(t, got, img2, "oci-layout:"+one)
	})
	t.Run("AmbiguousListsTags", func(t *testing.T) {
		_, err := p.Resolve(context.Background(), Source{Ref: "oci-layout:" + two})
		if err == nil || !strings.Contains(err.Error(), `tags: "v1", "v2"`) {
			t.Fatalf("Resolve of a two-image layout without a tag: error = %v, want one listing the tags", err)
		}
	})
	t.Run("UnknownTag", func(t *testing.T) {
		_, err := p.Resolve(context.Background(), Source{Ref: "oci-layout:" + two + ":v3"})
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("Resolve of an unknown tag: error = %v, want ErrNotFound", err)
		}
	})
	t.Run("CorruptLayer", func(t *testing.T) {
		bad := filepath.Join(root, "bad")
		images.WriteLayout(t, bad, map[string]v1.Image{"": img1})
		d := layerDigests(t, img1)[0]
		if err := os.WriteFile(filepath.Join(bad, "blobs", "sha256", d.Hex), []byte("not the layer"), 0o644); err != nil {
			t.Fatal(err)
		}
		q := newTestPuller(t, Options{LocalRoots: []string{root}})
		img, err := q.Resolve(context.Background(), Source{Ref: "oci-layout:" + bad})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.Fetch(context.Background(), img, nil); !errors.Is(err, ErrDigestMismatch) {
			t.Fatalf("Fetch of a corrupt layout blob: error = %v, want ErrDigestMismatch", err)
		}
	})
}

func TestOCILayoutMultiPlatform(t *testing.T) {
	root := t.TempDir()
	amd := testImage(t, 1, 512)
	arm := testImage(t, 1, 512)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	dir := filepath.Join(root, "multi")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{refNameAnnotation: "latest"})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		arch string
		want v1.Image
	}{{"amd64", amd}, {"arm64", arm}} {
		p := newTestPuller(t, Options{LocalRoots: []string{root}, Platform: v1.Platform{OS: "linux", Architecture: tc.arch}})
		for _, ref := range []string{"oci-layout:" + dir, "oci-layout:" + dir + ":latest"} {
			got := fetchAll(t, p, Source{Ref: ref}, compressedLayers(t, tc.want))
			checkImage(t, got, tc.want, "oci-layout:"+dir)
		}
	}
	p := newTestPuller(t, Options{LocalRoots: []string{root}, Platform: v1.Platform{OS: "linux", Architecture: "s390x"}})
	if _, err := p.Resolve(context.Background(), Source{Ref: "oci-layout:" + dir}); !errors.Is(err, ErrNoPlatform) {
		t.Errorf("Resolve for s390x: error = %v, want ErrNoPlatform", err)
	}
}

func TestLocalRoots(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "ab"), filepath.Join(base, "abc")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img := testImage(t, 1, 256)
	dir := filepath.Join(outside, "img")
	images.WriteLayout(t, dir, map[string]v1.Image{"": img})
	link := filepath.Join(root, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		roots []string
		ref   string
	}{
		{"Disabled", nil, "oci-layout:" + dir},
		{"OutsideSiblingWithSamePrefix", []string{root}, "oci-layout:" + dir},
		{"SymlinkOut", []string{root}, "oci-layout:" + link},
		{"MissingRoot", []string{filepath.Join(base, "missing")}, "oci-layout:" + dir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPuller(t, Options{LocalRoots: tc.roots})
			_, err := p.Resolve(context.Background(), Source{Ref: tc.ref})
			if !errors.Is(err, ErrLocalDisabled) {
				t.Fatalf("Resolve(%s) with roots %v: error = %v, want ErrLocalDisabled", tc.ref, tc.roots, err)
			}
		})
	}
	for _, roots := range [][]string{{outside}, {root, base}} {
		p := newTestPuller(t, Options{LocalRoots: roots})
		fetchAll(t, p, Source{Ref: "oci-layout:" + dir}, compressedLayers(t, img))
	}
}

func TestDockerArchiveCompressed(t *testing.T) {
	root := t.TempDir()
	img := testImage(t, 3, 2048)
	file := filepath.Join(root, "app.tar")
	tag, err := name.NewTag("example.com/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatalf("write docker archive: %v", err)
	}
	p := newTestPuller(t, Options{LocalRoots: []string{root}})
	got := fetchAll(t, p, Source{Ref: "docker-archive:" + file}, compressedLayers(t, img))

	// The synthesized manifest is the one go-containerregistry derives.
	ti, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := mustDigest(t, ti)
	if got.Digest != "docker-archive:"+file+"@"+want.String() {
		t.Errorf("Digest = %q, want docker-archive:%s@%s", got.Digest, file, want)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got.Config.WorkingDir != cf.Config.WorkingDir || len(got.Config.Env) != len(cf.Config.Env) || !got.Created.Equal(cf.Created.Time) {
		t.Errorf("Config = %+v, Created = %v; want those of the saved image", got.Config, got.Created)
	}
	for i, l := range got.Layers {
		if l.MediaType != types.DockerLayer {
			t.Errorf("layer %d media type %s, want %s", i, l.MediaType, types.DockerLayer)
		}
	}
}

// writeLegacyArchive writes a `docker save`-style tarball by hand:
// uncompressed layer.tar members, a symlink for a repeated layer and a "./"
// member name, as older Docker versions produce.
func writeLegacyArchive(t *testing.T, file string, img v1.Image, corrupt bool) [][]byte {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	add := func(hdr *tar.Header, body []byte) {
		t.Helper()
		hdr.Size = int64(len(body))
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		hdr.Mode = 0o644
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	var blobs [][]byte
	var paths []string
	for i, l := range ls {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, b)
		p := string(rune('a'+i)) + "/layer.tar"
		paths = append(paths, p)
		if i == len(ls)-1 { // the last layer repeats the first
			add(&tar.Header{Name: p, Typeflag: tar.TypeSymlink, Linkname: "../a/layer.tar"}, nil)
			continue
		}
		body := b
		if corrupt && i == 1 {
			body = append([]byte(nil), b...)
			body[len(body)/2] ^= 0xff
		}
		add(&tar.Header{Name: "./" + p}, body)
	}
	add(&tar.Header{Name: cfgName.Hex + ".json"}, rawCfg)
	mf, err := json.Marshal(tarball.Manifest{{Config: cfgName.Hex + ".json", RepoTags: []string{"example.com/app:v1"}, Layers: paths}})
	if err != nil {
		t.Fatal(err)
	}
	add(&tar.Header{Name: "manifest.json"}, mf)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return blobs
}

func TestDockerArchiveUncompressed(t *testing.T) {
	root := t.TempDir()
	base := testImage(t, 2, 2048)
	ls, err := base.Layers()
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(base, ls[0]) // layers: L0 L1 L0
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "legacy.tar")
	blobs := writeLegacyArchive(t, file, img, false)
	p := newTestPuller(t, Options{LocalRoots: []string{root}})

	got := fetchAll(t, p, Source{Ref: "docker-archive:" + file}, blobs)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range got.Layers {
		if l.MediaType != types.DockerUncompressedLayer || l.Digest != cf.RootFS.DiffIDs[i] || l.Size != int64(len(blobs[i])) {
			t.Errorf("layer %d = %+v, want an uncompressed layer with digest %s and size %d", i, l, cf.RootFS.DiffIDs[i], len(blobs[i]))
		}
	}
	if !strings.HasPrefix(got.Digest, "docker-archive:"+file+"@sha256:") {
		t.Errorf("Digest = %q", got.Digest)
	}
	again, err := p.Resolve(context.Background(), Source{Ref: "docker-archive:" + file})
	if err != nil || again.Digest != got.Digest {
		t.Errorf("second Resolve: %v, digest %q vs %q (want stable)", err, again.Digest, got.Digest)
	}

	t.Run("Corrupt", func(t *testing.T) {
		bad := filepath.Join(root, "bad.tar")
		writeLegacyArchive(t, bad, img, true)
		q := newTestPuller(t, Options{LocalRoots: []string{root}})
		img, err := q.Resolve(context.Background(), Source{Ref: "docker-archive:" + bad})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.Fetch(context.Background(), img, nil); !errors.Is(err, ErrDigestMismatch) {
			t.Fatalf("Fetch of a layer that does not match its diff_id: error = %v, want ErrDigestMismatch", err)
		}
	})
}

func TestDockerArchiveMultiImage(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "two.tar")
	t1, _ := name.NewTag("example.com/a:1")
	t2, _ := name.NewTag("example.com/b:2")
	if err := tarball.MultiWriteToFile(file, map[name.Tag]v1.Image{t1: testImage(t, 1, 256), t2: testImage(t, 1, 256)}); err != nil {
		t.Fatal(err)
	}
	p := newTestPuller(t, Options{LocalRoots: []string{root}})
	_, err := p.Resolve(context.Background(), Source{Ref: "docker-archive:" + file})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "example.com/a:1") {
		t.Fatalf("Resolve of a two-image archive: error = %v, want ErrUnsupported listing the tags", err)
	}
}

// TestLocalMetadataCaps checks that index.json and the members of a
// docker-archive read whole are capped at maxMetaSize, and that a member
// whose header claims more than the tarball holds is an error (found by
// the tar index, or by readMember), never a buffer of the claimed size.
func TestLocalMetadataCaps(t *testing.T) {
	root := t.TempDir()
	p := newTestPuller(t, Options{LocalRoots: []string{root}})
	resolve := func(ref string) error {
		_, err := p.Resolve(context.Background(), Source{Ref: ref})
		return err
	}

	t.Run("LayoutIndex", func(t *testing.T) {
		dir := filepath.Join(root, "big-index")
		images.WriteLayout(t, dir, map[string]v1.Image{"": testImage(t, 1, 256)})
		raw, err := os.ReadFile(filepath.Join(dir, "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		// Valid JSON, padded past the cap with whitespace.
		big := append(raw, strings.Repeat(" ", maxMetaSize+1-len(raw))...)
		if err := os.WriteFile(filepath.Join(dir, "index.json"), big, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := resolve("oci-layout:" + dir); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "index.json is larger than") {
			t.Fatalf("Resolve of a layout with a %d-byte index.json: error = %v, want ErrUnsupported naming the cap", len(big), err)
		}
		if err := os.WriteFile(filepath.Join(dir, "index.json"), big[:maxMetaSize], 0o644); err != nil {
			t.Fatal(err)
		}
		if err := resolve("oci-layout:" + dir); err != nil {
			t.Fatalf("Resolve of a layout with an index.json of exactly the cap: %v", err)
		}
	})

	writeArchive := func(t *testing.T, name string, hdr *tar.Header, body []byte) string {
		t.Helper()
		file := filepath.Join(root, name)
		f, err := os.Create(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		tw := tar.NewWriter(f)
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(body); err != nil { // raw, so the body may fall short of hdr.Size
			t.Fatal(err)
		}
		return file
	}
	t.Run("ArchiveManifest", func(t *testing.T) {
		body := []byte(`[]` + strings.Repeat(" ", maxMetaSize-1))
		file := writeArchive(t, "big-manifest.tar", &tar.Header{Name: "manifest.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}, body)
		if err := resolve("docker-archive:" + file); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("Resolve of an archive with a %d-byte manifest.json: error = %v, want ErrUnsupported naming the cap", len(body), err)
		}
	})
	t.Run("ArchiveTruncatedMember", func(t *testing.T) {
		file := writeArchive(t, "short-manifest.tar", &tar.Header{Name: "manifest.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 20}, []byte(`[]`))
		if err := resolve("docker-archive:" + file); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("Resolve of an archive whose manifest.json is cut short: error = %v, want a truncation error", err)
		}
	})
}
