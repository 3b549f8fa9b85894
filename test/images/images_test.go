package images

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestEncode checks that every encoding but Uncompressed changes the
// stream, and that an unknown one is refused.
func TestEncode(t *testing.T) {
	raw := TarOf(t, map[string]string{"a": strings.Repeat("compressible text ", 6000)})
	for _, c := range []Compression{Uncompressed, Gzip, Zstd} {
		blob, err := c.Encode(raw)
		if err != nil {
			t.Fatal(err)
		}
		if (c == Uncompressed) != bytes.Equal(blob, raw) {
			t.Errorf("Encode(%s) returned the input unchanged: %v", c, bytes.Equal(blob, raw))
		}
	}
	if _, err := Compression("lz4").Encode(raw); err == nil {
		t.Error("Encode accepted an unknown encoding")
	}
}

// TestTarOf reads TarOf's stream back: regular files in name order.
func TestTarOf(t *testing.T) {
	tr := tar.NewReader(bytes.NewReader(TarOf(t, map[string]string{"b": "bee", "a": "ay"})))
	for _, want := range []struct{ name, body string }{{"a", "ay"}, {"b", "bee"}} {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("Next: %v, want %s", err, want.name)
		}
		body, _ := io.ReadAll(tr)
		if h.Name != want.name || h.Typeflag != tar.TypeReg || h.Mode != 0o644 || string(body) != want.body {
			t.Errorf("entry %+v with %q, want regular file %s 0644 with %q", h, body, want.name, want.body)
		}
	}
	if _, err := tr.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("Next after the last entry = %v, want EOF", err)
	}
}

// TestNewImage checks media types, digests and diff ids of each encoding
// with go-containerregistry's validator, through a registry round trip.
func TestNewImage(t *testing.T) {
	cfg := Config{Config: v1.Config{Cmd: []string{"x"}}, Created: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		Platform: v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}
	img := New(t, cfg,
		Layer{Tar: TarOf(t, map[string]string{"a": "gzip"})},
		Layer{Tar: TarOf(t, map[string]string{"b": "zstd"}), Compression: Zstd},
		Layer{Tar: TarOf(t, map[string]string{"c": "none"}), Compression: Uncompressed},
	)
	checkLayers(t, img)
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	want := []types.MediaType{types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer}
	for i, l := range m.Layers {
		if l.MediaType != want[i] {
			t.Errorf("layer %d media type = %s, want %s", i, l.MediaType, want[i])
		}
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("manifest media types = %s, %s; want OCI", m.MediaType, m.Config.MediaType)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Architecture != "arm64" || cf.Variant != "v8" || !cf.Created.Time.Equal(cfg.Created) || cf.Config.Cmd[0] != "x" {
		t.Errorf("config = %+v", cf)
	}
	again := New(t, cfg,
		Layer{Tar: TarOf(t, map[string]string{"a": "gzip"})},
		Layer{Tar: TarOf(t, map[string]string{"b": "zstd"}), Compression: Zstd},
		Layer{Tar: TarOf(t, map[string]string{"c": "none"}), Compression: Uncompressed},
	)
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("same input, digests %s and %s", d1, d2)
	}

	reg := StartRegistry(t, nil)
	ref := reg.Push(t, "x/y:1", img)
	pulled, err := remote.Image(mustRef(t, ref))
	if err != nil {
		t.Fatal(err)
	}
	checkLayers(t, pulled)
	if got := reg.BlobGETs(m.Layers[1].Digest); got != 2 {
		t.Errorf("BlobGETs(layer 1) = %d after reading it compressed and uncompressed, want 2", got)
	}
	if !bytes.Equal(LayerBlob(t, img, m.Layers[2].Digest), TarOf(t, map[string]string{"c": "none"})) {
		t.Error("the uncompressed layer's blob is not its tar stream")
	}

	idx := NewIndex(t, PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: "arm64"}, Image: img})
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex || len(im.Manifests) != 1 || im.Manifests[0].Platform.Architecture != "arm64" || im.Manifests[0].Digest != d1 {
		t.Errorf("index = %+v", im)
	}
}

// checkLayers fails unless every layer's blob hashes to its digest and
// its tar stream to the config's diff id.
func checkLayers(t *testing.T, img v1.Image) {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.RootFS.DiffIDs) != len(m.Layers) {
		t.Fatalf("%d diff ids for %d layers", len(cf.RootFS.DiffIDs), len(m.Layers))
	}
	for i, d := range m.Layers {
		l, err := img.LayerByDigest(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			open func() (io.ReadCloser, error)
			want v1.Hash
			size int64
		}{{l.Compressed, d.Digest, d.Size}, {l.Uncompressed, cf.RootFS.DiffIDs[i], -1}} {
			rc, err := c.open()
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			n, err := io.Copy(h, rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != c.want.String() || (c.size >= 0 && n != c.size) {
				t.Errorf("layer %d: content hashes to %s (%d bytes), want %s (%d)", i, got, n, c.want, c.size)
			}
		}
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestBasicAuth(t *testing.T) {
	reg := StartRegistry(t, BasicAuth("u", "p4ss"))
	img := New(t, Config{}, Layer{Tar: TarOf(t, map[string]string{"a": "x"})})
	ref := reg.Push(t, "x/y:1", img, remote.WithAuth(&authn.Basic{Username: "u", Password: "p4ss"}))
	if _, err := remote.Image(mustRef(t, ref)); err == nil {
		t.Error("anonymous pull succeeded")
	}
	if _, err := remote.Image(mustRef(t, ref), remote.WithAuth(&authn.Basic{Username: "u", Password: "bad"})); err == nil {
		t.Error("pull with a wrong password succeeded")
	}
	if _, err := remote.Image(mustRef(t, ref), remote.WithAuth(&authn.Basic{Username: "u", Password: "p4ss"})); err != nil {
		t.Errorf("pull with the password: %v", err)
	}
	resp, err := http.Get("http://" + reg.Host + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
		t.Errorf("GET /v2/ = %d %q, want 401 with a Basic challenge", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
}

// readLayers returns every header of every layer, by layer.
func readLayers(t *testing.T, img v1.Image) [][]*tar.Header {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]*tar.Header
	for _, l := range ls {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		var hs []*tar.Header
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		rc.Close()
		out = append(out, hs)
	}
	return out
}

// TestTreeImage packs a small tree with every file kind, a hard link
// group spanning the usr/ and bin/ layers, and xattrs.
func TestTreeImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("device nodes and ownership need root")
	}
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chmod(dir, 0o755))
	for _, d := range []string{"usr/bin", "etc", "var/log", "bin", "dev"} {
		must(os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	must(os.WriteFile(filepath.Join(dir, "bin/tool"), []byte("tool"), 0o755))
	must(os.Link(filepath.Join(dir, "bin/tool"), filepath.Join(dir, "usr/bin/tool")))
	must(os.Link(filepath.Join(dir, "bin/tool"), filepath.Join(dir, "bin/tool2")))
	must(os.WriteFile(filepath.Join(dir, "usr/bin/su"), []byte("su"), 0o644))
	must(unix.Chmod(filepath.Join(dir, "usr/bin/su"), 0o4755))
	must(os.WriteFile(filepath.Join(dir, "etc/shadow"), []byte("s"), 0o640))
	must(os.Chown(filepath.Join(dir, "etc/shadow"), 0, 42))
	must(unix.Setxattr(filepath.Join(dir, "etc/shadow"), "user.k", []byte("v"), 0))
	must(os.Symlink("usr/lib", filepath.Join(dir, "lib")))
	must(unix.Mknod(filepath.Join(dir, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mkfifo(filepath.Join(dir, "var/log/fifo"), 0o600))
	mtime := time.Date(2021, 2, 3, 4, 5, 6, 789, time.UTC)
	must(os.Chtimes(filepath.Join(dir, "etc/shadow"), mtime, mtime))

	img := TreeImage(t, dir, Config{}, Zstd)
	layers := readLayers(t, img)
	if len(layers) != 3 {
		t.Fatalf("%d layers, want 3", len(layers))
	}
	where := map[string]int{}
	byName := map[string]*tar.Header{}
	for i, hs := range layers {
		for _, h := range hs {
			if _, dup := where[h.Name]; dup {
				t.Errorf("%s in two layers", h.Name)
			}
			where[h.Name], byName[h.Name] = i, h
		}
	}
	wantLayer := map[string]int{"usr/": 0, "usr/bin/su": 0, "etc/shadow": 1, "var/log/fifo": 1,
		"./": 2, "bin/tool": 2, "bin/tool2": 2, "usr/bin/tool": 2, "lib": 2, "dev/null": 2}
	for n, l := range wantLayer {
		if got, ok := where[n]; !ok || got != l {
			t.Errorf("%s in layer %d (present %v), want %d", n, got, ok, l)
		}
	}
	if h := byName["usr/bin/tool"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "bin/tool" {
		t.Errorf("usr/bin/tool = %+v, want a hard link to bin/tool", h)
	}
	if h := byName["bin/tool2"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "bin/tool" {
		t.Errorf("bin/tool2 = %+v, want a hard link to bin/tool", h)
	}
	if h := byName["usr/bin/su"]; h == nil || h.Mode != 0o4755 {
		t.Errorf("usr/bin/su = %+v, want mode 04755", h)
	}
	if h := byName["etc/shadow"]; h == nil || h.Gid != 42 || h.PAXRecords["SCHILY.xattr.user.k"] != "v" || !h.ModTime.Equal(mtime) {
		t.Errorf("etc/shadow = %+v", h)
	}
	if h := byName["dev/null"]; h == nil || h.Typeflag != tar.TypeChar || h.Devmajor != 1 || h.Devminor != 3 {
		t.Errorf("dev/null = %+v", h)
	}
	if h := byName["lib"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/lib" {
		t.Errorf("lib = %+v", h)
	}
	if h := byName["var/log/fifo"]; h == nil || h.Typeflag != tar.TypeFifo || h.Mode != 0o600 {
		t.Errorf("var/log/fifo = %+v", h)
	}
	if h := byName["./"]; h == nil || h.Mode != 0o755 {
		t.Errorf("root = %+v", h)
	}
}

// TestDebianRootfs makes (or finds) the cached debootstrap tree.
func TestDebianRootfs(t *testing.T) {
	if testing.Short() {
		t.Skip("debootstrap in -short mode")
	}
	dir := DebianRootfs(t)
	b, err := os.ReadFile(filepath.Join(dir, "etc/os-release"))
	if err != nil || !strings.Contains(string(b), "VERSION_CODENAME="+DebianSuite) {
		t.Errorf("etc/os-release = %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "usr/bin/dpkg")); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("usr/bin/dpkg: %v, %v", fi, err)
	}
}
