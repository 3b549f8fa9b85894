package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// fuzzTar builds a tarball of regular members, for seeds.
func fuzzTar(tb testing.TB, members ...[2]string) []byte {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		if err := tw.WriteHeader(&tar.Header{Name: m[0], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(m[1]))}); err != nil {
			tb.Fatal(err)
		}
		if _, err := tw.Write([]byte(m[1])); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzReadArchive feeds arbitrary bytes to readArchive as a `docker save`
// tarball (its header checksums fixed up, see imagetest.FixTarChecksums),
// and what it accepts to describe. It checks that neither panics
// and that every layer member it locates lies inside the bytes given.
// Memory stays bounded because members are read whole only up to
// maxMetaSize and only as far as the data goes.
func FuzzReadArchive(f *testing.F) {
	config := `{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"]}}`
	layer := string(fuzzTar(f, [2]string{"etc/hostname", "box\n"}))
	manifest := `[{"Config":"c.json","RepoTags":["example.com/app:v1"],"Layers":["l/layer.tar"]}]`
	f.Add(fuzzTar(f, [2]string{"l/layer.tar", layer}, [2]string{"c.json", config}, [2]string{"manifest.json", manifest}))
	f.Add(fuzzTar(f, [2]string{"./l/layer.tar", "\x1f\x8b\x08\x00junk"}, [2]string{"c.json", config}, [2]string{"manifest.json", manifest}))
	f.Add(fuzzTar(f, [2]string{"manifest.json", `[{"Config":"a.json"},{"Config":"b.json"}]`}))
	f.Add(fuzzTar(f, [2]string{"manifest.json", `[{"Config":"../../etc/passwd","Layers":["/manifest.json"]}]`}))
	f.Add(fuzzTar(f, [2]string{"manifest.json", "null"}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		data = imagetest.FixTarChecksums(data)
		a, err := readArchive(context.Background(), bytes.NewReader(data))
		if err != nil {
			return
		}
		if len(a.config) > maxMetaSize {
			t.Fatalf("readArchive kept a %d-byte config", len(a.config))
		}
		for hex, e := range a.members {
			if e.off < 0 || e.size < 0 || e.off > int64(len(data)) {
				t.Fatalf("layer %s at %d+%d outside the %d bytes given", hex, e.off, e.size, len(data))
			}
		}
		describe("docker-archive:/fuzz.tar", a.manifest, a.config) // must not panic
	})
}

// FuzzLayoutIndex feeds arbitrary bytes to parseLayoutIndex as the
// index.json of an OCI layout and picks an entry the ways a reference can
// (the only image, a tag, a digest); it also treats the bytes as a blob of
// the layout, as resolve does when it follows an index. It checks that
// nothing panics and that a picked entry is one the index lists, or the
// digest asked for.
func FuzzLayoutIndex(f *testing.F) {
	const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	d := func(mt, tag string, p *v1.Platform) v1.Descriptor {
		desc := v1.Descriptor{MediaType: types.MediaType("application/vnd.oci.image." + mt + ".v1+json"), Size: 10, Digest: v1.Hash{Algorithm: "sha256", Hex: hex64}, Platform: p}
		if tag != "" {
			desc.Annotations = map[string]string{refNameAnnotation: tag}
		}
		return desc
	}
	for _, im := range []v1.IndexManifest{
		{SchemaVersion: 2},
		{SchemaVersion: 2, Manifests: []v1.Descriptor{d("manifest", "", nil)}},
		{SchemaVersion: 2, Manifests: []v1.Descriptor{d("manifest", "v1", nil), d("manifest", "v2", nil)}},
		{SchemaVersion: 2, Manifests: []v1.Descriptor{d("index", "latest", nil)}},
		{SchemaVersion: 2, Manifests: []v1.Descriptor{d("manifest", "", &v1.Platform{OS: "linux", Architecture: "amd64"}), d("manifest", "", &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"})}},
	} {
		raw, err := json.Marshal(im)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	for _, s := range []string{"", "null", "[]", `{"manifests":null}`, `{"manifests":[null]}`, `{"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"platform":{}}]} trailing`} {
		f.Add([]byte(s))
	}
	refs := []ParsedRef{
		{Kind: KindOCILayout, Path: "/fuzz"},
		{Kind: KindOCILayout, Path: "/fuzz", Tag: "latest"},
		{Kind: KindOCILayout, Path: "/fuzz", Tag: "v1"},
		{Kind: KindOCILayout, Path: "/fuzz", Digest: "sha256:" + hex64},
	}
	platform := v1.Platform{OS: "linux", Architecture: "amd64"}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if top, err := parseLayoutIndex(raw); err == nil {
			for _, pr := range refs {
				desc, err := chooseLayoutEntry(top, pr, platform, "fuzz")
				if err != nil {
					continue
				}
				listed := false
				for _, m := range top.Manifests {
					listed = listed || m.Digest == desc.Digest
				}
				if !listed && desc.Digest.String() != pr.Digest {
					t.Fatalf("chooseLayoutEntry(%+v) = %+v, neither listed nor asked for", pr, desc)
				}
			}
		}
		mt := sniffMediaType(raw)
		switch {
		case mt.IsIndex():
			if im, err := v1.ParseIndexManifest(bytes.NewReader(raw)); err == nil {
				pickPlatform(im, platform, "fuzz")
			}
		case mt.IsImage():
			describe("oci-layout:/fuzz", raw, raw)
		}
	})
}
