package inject_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/inject"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fstest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

var bakeTime = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func pemOf(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func newCA(t testing.TB) *inject.CA {
	t.Helper()
	ca, err := inject.ParseCA(pemOf(images.NewCACert(t, "cube egress root")))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// newTree flattens layers into an in-memory tree.
func newTree(t testing.TB, layers ...imagetest.Layer) (*flatten.Tree, *fstest.MemStore) {
	t.Helper()
	store := fstest.NewMemStore()
	tree := flatten.New(store, flatten.Options{RootTime: imagetest.T1})
	for i, l := range layers {
		raw, err := l.Tar()
		if err != nil {
			t.Fatal(err)
		}
		if err := tree.ApplyLayer(context.Background(), i, bytes.NewReader(raw)); err != nil {
			t.Fatal(err)
		}
	}
	return tree, store
}

func snap(t testing.TB, tree *flatten.Tree, store *fstest.MemStore) imagetest.Snapshot {
	t.Helper()
	s, err := fstest.SnapshotTree(tree.Root(), store.OpenData)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// changes lists the paths whose state differs between two snapshots.
func changes(before, after imagetest.Snapshot) map[string]bool {
	m := make(map[string]bool)
	for _, d := range imagetest.Diff(before, after, imagetest.DiffOptions{}) {
		p := d[:strings.Index(d, ": ")]
		m[strings.Trim(p, `"`)] = true
	}
	return m
}

// checkLive fails when the store holds data no path refers to.
func checkLive(t testing.TB, tree *flatten.Tree, store *fstest.MemStore) {
	t.Helper()
	refs := 0
	seen := make(map[*ext4.Node]bool)
	var walk func(n *ext4.Node)
	walk = func(n *ext4.Node) {
		if seen[n] {
			return
		}
		seen[n] = true
		if n.Mode&ext4.ModeTypeMask == ext4.ModeRegular {
			refs++
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(tree.Root())
	if live := len(store.Live()); live != refs {
		t.Errorf("store holds %d data, the tree refers to %d", live, refs)
	}
	for _, m := range store.Misuse() {
		t.Errorf("store misuse: %s", m)
	}
}

func TestEnvd(t *testing.T) {
	ctx := context.Background()
	payload := []byte("\x7fELF envd binary")
	wantEnvd := imagetest.WFile(inject.EnvdPath, 0o755, string(payload)).At(bakeTime)

	t.Run("ScratchImage", func(t *testing.T) {
		tree, store := newTree(t)
		if err := inject.Envd(ctx, tree, payload, bakeTime); err != nil {
			t.Fatal(err)
		}
		want := imagetest.Expect(
			imagetest.WDir("usr", 0o755).At(bakeTime),
			imagetest.WDir("usr/local", 0o755).At(bakeTime),
			imagetest.WDir("usr/local/bin", 0o755).At(bakeTime),
			wantEnvd,
		)
		for _, d := range imagetest.Check(want, snap(t, tree, store)) {
			t.Error(d)
		}
		checkLive(t, tree, store)
	})

	t.Run("ReplacesFile", func(t *testing.T) {
		tree, store := newTree(t, imagetest.Layer{
			imagetest.Dir("usr/"), imagetest.Dir("usr/local/").Perm(0o700), imagetest.Dir("usr/local/bin/").Perm(0o750).Owner(5, 5),
			imagetest.File("usr/local/bin/envd", "old envd").Perm(0o600).Owner(1000, 1000),
			imagetest.File("usr/local/bin/other", "other"),
		})
		before := snap(t, tree, store)
		if err := inject.Envd(ctx, tree, payload, bakeTime); err != nil {
			t.Fatal(err)
		}
		after := snap(t, tree, store)
		for _, d := range imagetest.Check(imagetest.Expect(wantEnvd), imagetest.Snapshot{inject.EnvdPath: after[inject.EnvdPath]}) {
			t.Error(d)
		}
		if c := changes(before, after); len(c) != 1 || !c[inject.EnvdPath] {
			t.Errorf("Envd changed %v, want only %s", c, inject.EnvdPath)
		}
		if store.Released() != 1 {
			t.Errorf("old envd data released %d times, want 1", store.Released())
		}
		checkLive(t, tree, store)
	})

	t.Run("ReplacesSymlink", func(t *testing.T) {
		tree, store := newTree(t, imagetest.Layer{
			imagetest.File("bin/busybox", "busybox"),
			imagetest.Symlink("usr/local/bin/envd", "/bin/busybox"),
		})
		if err := inject.Envd(ctx, tree, payload, bakeTime); err != nil {
			t.Fatal(err)
		}
		s := snap(t, tree, store)
		for _, d := range imagetest.Check(imagetest.Expect(wantEnvd, imagetest.WFile("bin/busybox", 0o644, "busybox")),
			imagetest.Snapshot{inject.EnvdPath: s[inject.EnvdPath], "bin/busybox": s["bin/busybox"]}) {
			t.Error(d)
		}
	})

	t.Run("SymlinkedParent", func(t *testing.T) {
		tree, store := newTree(t, imagetest.Layer{
			imagetest.Dir("opt/"), imagetest.Dir("opt/local/"),
			imagetest.Dir("usr/"), imagetest.Symlink("usr/local", "/opt/local"),
		})
		if err := inject.Envd(ctx, tree, payload, bakeTime); err != nil {
			t.Fatal(err)
		}
		s := snap(t, tree, store)
		if s["opt/local/bin/envd"].SHA256 != wantEnvd.Info.SHA256 || s["usr/local"].Type != "symlink" {
			t.Errorf("envd not written through the usr/local symlink: %v, %v", s["opt/local/bin/envd"], s["usr/local"])
		}
	})

	t.Run("Errors", func(t *testing.T) {
		tree, _ := newTree(t, imagetest.Layer{imagetest.Dir("usr/local/bin/envd/")})
		if err := inject.Envd(ctx, tree, payload, bakeTime); !errors.Is(err, flatten.ErrIsDir) {
			t.Errorf("Envd over a directory = %v, want ErrIsDir", err)
		}
		if err := inject.Envd(ctx, tree, nil, bakeTime); err == nil {
			t.Error("Envd with an empty payload succeeded")
		}
	})
}

func TestParseCA(t *testing.T) {
	der := images.NewCACert(t, "a")
	p := pemOf(der)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})

	t.Run("Canonical", func(t *testing.T) {
		messy := "Subject: a\r\n" + strings.ReplaceAll(string(p), "\n", "\r\n") + "trailing text\n"
		ca, err := inject.ParseCA([]byte(messy))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(der)
		if !bytes.Equal(ca.DER, der) || !bytes.Equal(ca.PEM, p) || ca.Fingerprint != hex.EncodeToString(sum[:]) {
			t.Errorf("ParseCA = %+v, want DER, canonical PEM and sha256 fingerprint of the input", ca)
		}
	})

	bad := map[string][]byte{
		"TwoCerts":    append(append([]byte{}, p...), pemOf(images.NewCACert(t, "b"))...),
		"Garbage":     []byte("not a certificate at all"),
		"Empty":       nil,
		"PrivateKey":  keyPEM,
		"CertAndKey":  append(append([]byte{}, p...), keyPEM...),
		"BadDER":      pemOf([]byte("garbage inside a certificate block")),
		"DERNotPEM":   der,
		"TruncatedPE": p[:len(p)/2],
	}
	for name, in := range bad {
		t.Run(name, func(t *testing.T) {
			if ca, err := inject.ParseCA(in); err == nil {
				t.Errorf("ParseCA accepted it: %+v", ca)
			}
		})
	}
}

func TestLoadCA(t *testing.T) {
	dir := t.TempDir()
	p := pemOf(images.NewCACert(t, "a"))
	path := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(path, p, 0o644); err != nil {
		t.Fatal(err)
	}
	ca, err := inject.LoadCA(path)
	if err != nil || !bytes.Equal(ca.PEM, p) {
		t.Errorf("LoadCA = %v, %v; want the certificate", ca, err)
	}
	if _, err := inject.LoadCA(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("LoadCA(missing) = %v, want not found", err)
	}
	if err := os.WriteFile(path, []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := inject.LoadCA(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("LoadCA(junk) = %v, want an error naming the file", err)
	}
}

func TestBakeCA(t *testing.T) {
	ctx := context.Background()
	ca := newCA(t)
	other := string(pemOf(images.NewCACert(t, "some public root")))
	bake := func(t *testing.T, tree *flatten.Tree) inject.CAResult {
		t.Helper()
		res, err := inject.BakeCA(ctx, tree, ca, bakeTime)
		if err != nil {
			t.Fatal(err)
		}
		if res.Fingerprint != ca.Fingerprint {
			t.Errorf("Fingerprint = %s, want %s", res.Fingerprint, ca.Fingerprint)
		}
		return res
	}
	read := func(t *testing.T, tree *flatten.Tree, p string) string {
		t.Helper()
		b, err := tree.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	t.Run("AppendsToExistingBundle", func(t *testing.T) {
		old := strings.TrimSuffix(other, "\n") // no final newline: one must be added
		tree, store := newTree(t, imagetest.Layer{
			imagetest.File("etc/ssl/certs/ca-certificates.crt", old).Perm(0o444).Owner(0, 7),
		})
		before := snap(t, tree, store)
		res := bake(t, tree)
		if !res.Baked || res.TargetsWritten != 1 || res.Seeded {
			t.Errorf("BakeCA = %+v, want baked, 1 target, not seeded", res)
		}
		const p = "etc/ssl/certs/ca-certificates.crt"
		if got, want := read(t, tree, p), old+"\n"+string(ca.PEM); got != want {
			t.Errorf("bundle = %q, want %q", got, want)
		}
		after := snap(t, tree, store)
		if c := changes(before, after); len(c) != 1 || !c[p] {
			t.Errorf("BakeCA changed %v, want only %s", c, p)
		}
		if i := after[p]; i.Perm != 0o444 || i.UID != 0 || i.GID != 7 || !i.Mtime.Equal(bakeTime) {
			t.Errorf("bundle is %v, want mode 0444 owner 0:7 mtime %v", i, bakeTime)
		}
		checkLive(t, tree, store)
	})

	t.Run("AnchorsOnlyWhereDirsExist", func(t *testing.T) {
		tree, store := newTree(t, imagetest.Layer{
			imagetest.Dir("usr/local/share/ca-certificates/").Perm(0o755),
			imagetest.Dir("etc/pki/ca-trust/source/anchors/"),
			imagetest.File("etc/ca-certificates/trust-source", "a file, not a directory"),
		})
		before := snap(t, tree, store)
		res := bake(t, tree)
		if !res.Baked || res.TargetsWritten != 2 || res.Seeded || len(res.Skipped) != 1 {
			t.Errorf("BakeCA = %+v, want baked, 2 targets, not seeded, 1 skipped", res)
		}
		a1 := "usr/local/share/ca-certificates/" + inject.AnchorName
		a2 := "etc/pki/ca-trust/source/anchors/" + inject.AnchorName
		after := snap(t, tree, store)
		want := imagetest.Expect(
			imagetest.WFile(a1, 0o644, string(ca.PEM)).At(bakeTime),
			imagetest.WFile(a2, 0o644, string(ca.PEM)).At(bakeTime),
		)
		for _, d := range imagetest.Check(want, imagetest.Snapshot{a1: after[a1], a2: after[a2]}) {
			t.Error(d)
		}
		if c := changes(before, after); len(c) != 2 {
			t.Errorf("BakeCA changed %v, want only the two anchors", c)
		}
	})

	t.Run("SeedsScratchImage", func(t *testing.T) {
		tree, store := newTree(t, imagetest.Layer{imagetest.File("app", "static binary")})
		res := bake(t, tree)
		if !res.Baked || !res.Seeded || res.TargetsWritten != 1 {
			t.Errorf("BakeCA = %+v, want baked and seeded", res)
		}
		want := imagetest.Expect(
			imagetest.WFile("app", 0o644, "static binary"),
			imagetest.WDir("etc", 0o755).At(bakeTime),
			imagetest.WDir("etc/ssl", 0o755).At(bakeTime),
			imagetest.WDir("etc/ssl/certs", 0o755).At(bakeTime),
			imagetest.WFile(inject.SeedBundle, 0o644, string(ca.PEM)).At(bakeTime),
		)
		for _, d := range imagetest.Check(want, snap(t, tree, store)) {
			t.Error(d)
		}
	})

	t.Run("SeedSkippedBelowDanglingSymlink", func(t *testing.T) {
		tree, _ := newTree(t, imagetest.Layer{imagetest.Symlink("etc", "/nonexistent")})
		res := bake(t, tree)
		if res.Baked || res.Seeded || res.TargetsWritten != 0 || len(res.Skipped) != 1 {
			t.Errorf("BakeCA = %+v, want not baked and one skip reason", res)
		}
	})

	t.Run("Idempotent", func(t *testing.T) {
		tree, store := newTree(t, imagetest.Layer{
			imagetest.File("etc/ssl/certs/ca-certificates.crt", other),
			imagetest.Dir("usr/local/share/ca-certificates/"),
		})
		first := bake(t, tree)
		if !first.Baked || first.TargetsWritten != 2 {
			t.Fatalf("first BakeCA = %+v, want 2 targets", first)
		}
		before := snap(t, tree, store)
		second := bake(t, tree)
		if !second.Baked || second.TargetsWritten != 0 || second.Seeded {
			t.Errorf("second BakeCA = %+v, want baked with nothing written", second)
		}
		if c := changes(before, snap(t, tree, store)); len(c) != 0 {
			t.Errorf("second BakeCA changed %v", c)
		}
	})

	t.Run("AlreadyPresentInImage", func(t *testing.T) {
		// The image's bundle holds the CA already, in another text form.
		crlf := strings.ReplaceAll(string(ca.PEM), "\n", "\r\n")
		tree, store := newTree(t, imagetest.Layer{
			imagetest.File("etc/ssl/certs/ca-certificates.crt", other+"# cube\r\n"+crlf),
		})
		before := snap(t, tree, store)
		res := bake(t, tree)
		if !res.Baked || res.TargetsWritten != 0 || res.Seeded {
			t.Errorf("BakeCA = %+v, want baked (already present), nothing written, not seeded", res)
		}
		if c := changes(before, snap(t, tree, store)); len(c) != 0 {
			t.Errorf("BakeCA changed %v", c)
		}
	})

	t.Run("SymlinkedBundles", func(t *testing.T) {
		// The RHEL layout: ca-bundle.crt is an absolute symlink to the
		// extracted bundle, so the CA must land there once.
		const real = "etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem"
		tree, store := newTree(t, imagetest.Layer{
			imagetest.File(real, other),
			imagetest.Symlink("etc/pki/tls/certs/ca-bundle.crt", "/"+real),
			imagetest.Symlink("etc/ssl/certs/ca-certificates.crt", "../../../../../../../nowhere.pem"),
		})
		res := bake(t, tree)
		if !res.Baked || res.TargetsWritten != 1 || res.Seeded || len(res.Skipped) != 1 ||
			!strings.Contains(res.Skipped[0], "etc/ssl/certs/ca-certificates.crt") {
			t.Errorf("BakeCA = %+v, want 1 target and the dangling bundle skipped", res)
		}
		if got, want := read(t, tree, real), other+string(ca.PEM); got != want {
			t.Errorf("real bundle = %q, want %q", got, want)
		}
		s := snap(t, tree, store)
		if s["etc/pki/tls/certs/ca-bundle.crt"].Type != "symlink" || s["etc/ssl/certs/ca-certificates.crt"].Type != "symlink" {
			t.Error("BakeCA replaced a bundle symlink")
		}
		if _, err := tree.Lookup("nowhere.pem"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("BakeCA created the dangling symlink's target: %v", err)
		}
		checkLive(t, tree, store)
	})

	t.Run("BundleIsDirectory", func(t *testing.T) {
		tree, _ := newTree(t, imagetest.Layer{
			imagetest.Dir("etc/pki/tls/certs/ca-bundle.crt/"),
			imagetest.File("etc/ssl/certs/ca-certificates.crt", other),
		})
		res := bake(t, tree)
		if !res.Baked || res.TargetsWritten != 1 || len(res.Skipped) != 1 {
			t.Errorf("BakeCA = %+v, want 1 target and the directory skipped", res)
		}
	})
}

// TestInjectExt4 injects into a real image and reads the result back
// through a loop mount.
func TestInjectExt4(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "image.ext4")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := ext4.NewWriter(f, ext4.Options{Time: bakeTime, HeadroomMinBlocks: 64, HeadroomInodes: 16})
	if err != nil {
		t.Fatal(err)
	}
	tree := flatten.New(w, flatten.Options{RootTime: imagetest.T1})
	layer := imagetest.Layer{
		imagetest.File("etc/ssl/certs/ca-certificates.crt", "# empty bundle\n"),
		imagetest.File("usr/local/bin/envd", "old"),
		imagetest.Dir("usr/local/share/ca-certificates/"),
	}
	raw, err := layer.Tar()
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.ApplyLayer(ctx, 0, bytes.NewReader(raw)); err != nil {
		t.Fatal(err)
	}
	ca := newCA(t)
	if err := inject.Envd(ctx, tree, []byte("new envd"), bakeTime); err != nil {
		t.Fatal(err)
	}
	if res, err := inject.BakeCA(ctx, tree, ca, bakeTime); err != nil || res.TargetsWritten != 2 {
		t.Fatalf("BakeCA = %+v, %v; want 2 targets", res, err)
	}
	if _, err := w.Finish(ctx, tree.Root()); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	imagetest.Fsck(t, path)
	mnt := imagetest.Mount(t, path)
	got, err := imagetest.SnapshotDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	want := imagetest.Expect(
		imagetest.WFile("etc/ssl/certs/ca-certificates.crt", 0o644, "# empty bundle\n"+string(ca.PEM)).At(bakeTime),
		imagetest.WFile("usr/local/bin/envd", 0o755, "new envd").At(bakeTime),
		imagetest.WFile("usr/local/share/ca-certificates/"+inject.AnchorName, 0o644, string(ca.PEM)).At(bakeTime),
	)
	for p := range want {
		if d := imagetest.Check(imagetest.Snapshot{p: want[p]}, imagetest.Snapshot{p: got[p]}); len(d) > 0 {
			t.Error(d)
		}
	}
}
