package rootfs_test

// Helpers of the end-to-end tests of the Builder: turning corpus layers
// into registry images, building them, and checking the published
// artifact, its mount and its go-diskfs read-back.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/inspect"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/inflatetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// imageCreated is the creation time of the test images: the Builder
// stamps implied directories and injected files with it.
var imageCreated = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// corpusImage turns fstest layers into an OCI image whose layers are
// encoded in turn with encs (gzip when empty). The corpus holds no
// program, so the image has no command: its start check finds nothing to
// check (no_command).
func corpusImage(t testing.TB, layers []imagetest.Layer, encs ...images.Compression) v1.Image {
	t.Helper()
	ls := make([]images.Layer, len(layers))
	for i, l := range layers {
		raw, err := l.Tar()
		if err != nil {
			t.Fatalf("tar layer %d: %v", i, err)
		}
		ls[i] = images.Layer{Tar: raw}
		if len(encs) > 0 {
			ls[i].Compression = encs[i%len(encs)]
		}
	}
	return images.New(t, images.Config{Created: imageCreated, Config: v1.Config{
		Env: []string{"A=b"}, WorkingDir: "/", User: "0"}}, ls...)
}

// builderOptions are the options of a test Builder: a fresh store and
// cache under t.TempDir(), hosts spoken to over plain HTTP, no keychain.
func builderOptions(t testing.TB, insecure ...string) rootfs.Options {
	t.Helper()
	return rootfs.Options{
		Store: rootfs.Store(t.TempDir()),
		Pull: rootfs.PullOptions{CacheDir: t.TempDir(), Insecure: insecure,
			Keychain: authn.NewMultiKeychain(), AllowNetworks: testNetworks, Gzip: inflatetest.Inflater(t)},
		HeadroomPercent: 10,
		HeadroomInodes:  256,
	}
}

// testNetworks lets builderOptions reach the tests' registries, which
// listen on loopback: the network policy denies it by default.
var testNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// newBuilder opens a Builder that is closed when the test ends.
func newBuilder(t testing.TB, opts rootfs.Options) *rootfs.Builder {
	t.Helper()
	b, err := rootfs.NewBuilder(opts)
	if err != nil {
		t.Fatalf("NewBuilder: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

// specOf makes the build spec of img the way the agent does: planned
// (rootfs.Plan) with the request's naming, the fingerprint by upstream's
// formula and the artifact id from it.
func specOf(img *rootfs.Image, ref string, envd []byte, ca *rootfs.CA) rootfs.Spec {
	req := api.Build{Template: api.TemplateRequest{SourceImageRef: ref, WritableLayerSize: "1Gi", InstanceType: "cubebox"}}
	if envd != nil {
		sum := sha256.Sum256(envd)
		req.EnvdSHA = hex.EncodeToString(sum[:])
	}
	spec, err := rootfs.Plan(context.Background(), loadedCA{ca}, img, ca != nil, req.Name)
	if err != nil {
		// specOf runs in build goroutines too, where t.Fatal may not.
		panic(err)
	}
	spec.Envd = envd
	return spec
}

// loadedCA hands out a CA the test loaded already.
type loadedCA struct{ ca *rootfs.CA }

func (l loadedCA) LoadCA(context.Context) (*rootfs.CA, error) { return l.ca, nil }

// progressLog records the progress reports of one build.
type progressLog struct {
	mu   sync.Mutex
	all  []rootfs.Progress
	hook func(rootfs.Progress)
}

func (p *progressLog) record(pr rootfs.Progress) {
	p.mu.Lock()
	if pr.Pull != nil {
		c := *pr.Pull
		pr.Pull = &c
	}
	p.all = append(p.all, pr)
	hook := p.hook
	p.mu.Unlock()
	if hook != nil {
		hook(pr)
	}
}

// check fails unless every report lies in 40..99 and the download phase
// ended with a Done report counting every layer.
func (p *progressLog) check(t testing.TB, layers int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	done := false
	for _, pr := range p.all {
		if pr.Percent < 40 || pr.Percent > 99 {
			t.Errorf("progress %d%% outside 40..99", pr.Percent)
		}
		if pr.Pull != nil && pr.Pull.Done() {
			done = true
			if pr.Pull.TotalLayers != layers || pr.Pull.CompletedLayers != layers || pr.Pull.DownloadedBytes != pr.Pull.TotalBytes {
				t.Errorf("final pull progress = %+v, want %d of %d layers and all bytes", *pr.Pull, layers, layers)
			}
		}
	}
	if !done {
		t.Errorf("no final pull progress among %d reports", len(p.all))
	}
}

// built is a published test build.
type built struct {
	art *rootfs.Artifact
	img *rootfs.Image
	// mnt is the read-only loop mount of the image.
	mnt string
	// snap is the snapshot of the mount.
	snap imagetest.Snapshot
}

// resolve resolves src, failing the test on error.
func resolve(t testing.TB, b *rootfs.Builder, src rootfs.Source) *rootfs.Image {
	t.Helper()
	img, err := b.Resolve(context.Background(), src)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", src.Ref, err)
	}
	return img
}

// buildOK resolves and builds src (an image of layers layers), then
// checks the progress reports, the artifact in store (checkArtifact),
// e2fsck -fn, mounts it read-only and snapshots the mount.
func buildOK(t testing.TB, b *rootfs.Builder, store rootfs.Store, src rootfs.Source, layers int, envd []byte, ca *rootfs.CA) built {
	t.Helper()
	img := resolve(t, b, src)
	var prog progressLog
	art, err := b.Build(context.Background(), specOf(img, src.Ref, envd, ca), prog.record)
	if err != nil {
		t.Fatalf("Build(%s): %v", src.Ref, err)
	}
	prog.check(t, layers)
	checkArtifact(t, store, art)
	imagetest.Fsck(t, art.Path)
	mnt := imagetest.Mount(t, art.Path)
	snap, err := imagetest.SnapshotDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	return built{art: art, img: img, mnt: mnt, snap: snap}
}

var artifactIDPattern = regexp.MustCompile(`^rfs-[0-9a-f]{24}$`)

// checkArtifact fails unless art is published as the only content of
// store: <store>/<id>/<id>.ext4, its size a multiple of 2 MiB and equal to
// art.Size, its sha256 equal to art.SHA256, its mtime art.ModTime, and no
// temporary file beside it.
func checkArtifact(t testing.TB, store rootfs.Store, art *rootfs.Artifact) {
	t.Helper()
	if !artifactIDPattern.MatchString(art.ID) {
		t.Errorf("artifact id %q is not rfs- and 24 hex digits", art.ID)
	}
	want := filepath.Join(string(store), art.ID, art.ID+".ext4")
	if art.Path != want || store.ArtifactPath(art.ID) != want {
		t.Errorf("artifact path = %q, want %q", art.Path, want)
	}
	fi, err := os.Stat(want)
	if err != nil {
		t.Fatalf("stat artifact: %v", err)
	}
	if !fi.Mode().IsRegular() {
		t.Errorf("artifact mode = %v, want a regular file", fi.Mode())
	}
	if fi.Size() != art.Size || fi.Size()%(2<<20) != 0 || fi.Size() == 0 {
		t.Errorf("artifact size = %d (Artifact.Size %d), want the same non-zero multiple of 2 MiB", fi.Size(), art.Size)
	}
	if !fi.ModTime().Equal(art.ModTime) {
		t.Errorf("artifact mtime = %v, Artifact.ModTime = %v", fi.ModTime(), art.ModTime)
	}
	if got := imagetest.FileSHA256(t, want); got != art.SHA256 {
		t.Errorf("sha256 of the artifact = %s, Artifact.SHA256 = %s", got, art.SHA256)
	}
	if got := storeFiles(t, store); !slices.Equal(got, []string{art.ID, art.ID + "/" + art.ID + ".ext4"}) {
		t.Errorf("store holds %q, want only the artifact", got)
	}
}

// storeFiles lists every path below dir, relative and sorted; artifacts
// of earlier builds of the same test are not expected to exist.
func storeFiles(t testing.TB, store rootfs.Store) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(string(store), func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(string(store), p); rel != "." {
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk store: %v", err)
	}
	slices.Sort(out)
	return out
}

// checkStoreEmpty fails unless the store holds nothing at all.
func checkStoreEmpty(t testing.TB, store rootfs.Store) {
	t.Helper()
	if got := storeFiles(t, store); len(got) != 0 {
		t.Errorf("store holds %q after a failed build, want nothing", got)
	}
}

// checkCacheClean fails unless the layer cache holds no temporary file,
// no blob in bad and only blobs whose content matches their name.
func checkCacheClean(t testing.TB, cacheDir string, bad ...v1.Hash) {
	t.Helper()
	blobs := filepath.Join(cacheDir, "blobs", "sha256")
	err := filepath.WalkDir(cacheDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(cacheDir, p)
		switch {
		case d.IsDir() || rel == "lock":
			return nil
		case strings.Contains(d.Name(), "tmp"):
			t.Errorf("cache holds a temporary file %s", rel)
		case filepath.Dir(p) != blobs:
			t.Errorf("cache holds an unexpected file %s", rel)
		default:
			for _, h := range bad {
				if d.Name() == h.Hex {
					t.Errorf("cache holds the bad blob %s", h)
				}
			}
			if got := imagetest.FileSHA256(t, p); got != d.Name() {
				t.Errorf("cache blob %s hashes to %s", d.Name(), got)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk cache: %v", err)
	}
}

// maxReadBack bounds the files read back whole through go-diskfs.
const maxReadBack = 1 << 20

// readBack reads the image at imagePath through rootfs/inspect (go-diskfs)
// and compares it with the loop mount at mnt: every directory is listed,
// and each entry's name, mode, owner, size, link count, inode number,
// link target and device numbers must match the mount; every regular file
// under 1 MiB is read whole and compared byte for byte, except sparse
// ones, which inspect must refuse. It returns how many entries it
// compared, counting those of directories go-diskfs is known not to read
// (see unreadable), and how many files it read.
func readBack(t testing.TB, imagePath, mnt string) (entries, files int) {
	t.Helper()
	im, err := inspect.Open(imagePath)
	if err != nil {
		t.Fatalf("inspect.Open: %v", err)
	}
	defer im.Close()
	var walk func(dir string)
	walk = func(dir string) {
		hostDir := filepath.Join(mnt, filepath.FromSlash(dir))
		des, err := os.ReadDir(hostDir)
		if err != nil {
			t.Fatalf("read mounted %s: %v", dir, err)
		}
		var list []inspect.Entry
		err = safely(func() (err error) { list, err = im.List(dir); return err })
		if err != nil {
			if reason := unreadable(dir, des); reason != "" && !errors.Is(err, errPanic) {
				t.Logf("inspect List(%q) fails as expected (%s): %v", dir, reason, err)
				filepath.WalkDir(hostDir, func(_ string, _ fs.DirEntry, _ error) error { entries++; return nil })
				entries-- // hostDir itself was counted by its parent
				return
			}
			t.Errorf("inspect List(%q): %v", dir, err)
			return
		}
		var gotNames, wantNames []string
		for _, e := range list {
			gotNames = append(gotNames, e.Name)
		}
		for _, de := range des {
			wantNames = append(wantNames, de.Name())
		}
		slices.Sort(wantNames)
		if !slices.Equal(gotNames, wantNames) {
			t.Errorf("inspect List(%q) = %q, the mount has %q", dir, gotNames, wantNames)
			return
		}
		for _, e := range list {
			p := path.Join(dir, e.Name)
			entries++
			files += compareEntry(t, im, p, e, filepath.Join(hostDir, e.Name))
			if e.Mode.IsDir() && e.Name != "lost+found" {
				walk(p)
			}
		}
	}
	walk("/")
	return entries, files
}

// goDiskfsMaxName is the first name length go-diskfs v1.9.4 cannot read:
// it computes 8+name_len in a byte, so longer names overflow (and panic).
const goDiskfsMaxName = 248

// errPanic marks an inspect call that panicked.
var errPanic = errors.New("panic")

// safely runs an inspect call, turning a panic of the ext4 reader into an
// error wrapping errPanic, so one bad directory fails the test instead of
// the whole test binary.
func safely(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errPanic, r)
		}
	}()
	return f()
}

// unreadable says why go-diskfs v1.9.4 cannot read the directory p holding
// des, or "" if it should: it refuses paths that are not UTF-8
// (fs.ValidPath), and cannot parse names of goDiskfsMaxName bytes or more.
func unreadable(p string, des []os.DirEntry) string {
	if !utf8.ValidString(p) {
		return "path is not UTF-8"
	}
	for _, de := range des {
		if len(de.Name()) >= goDiskfsMaxName {
			return fmt.Sprintf("a name of %d bytes", len(de.Name()))
		}
	}
	return ""
}

// compareEntry compares one inspect entry with the mounted path host and
// reads a small regular file back; it returns 1 if it compared content.
func compareEntry(t testing.TB, im *inspect.Image, p string, e inspect.Entry, host string) int {
	t.Helper()
	fi, err := os.Lstat(host)
	if err != nil {
		t.Errorf("lstat mounted %q: %v", p, err)
		return 0
	}
	st := fi.Sys().(*syscall.Stat_t)
	bad := func(field string, got, want any) {
		t.Errorf("inspect %q: %s = %v, the mount has %v", p, field, got, want)
	}
	if e.Mode != fi.Mode() {
		bad("mode", e.Mode, fi.Mode())
	}
	if e.UID != st.Uid || e.GID != st.Gid {
		bad("owner", fmt.Sprintf("%d:%d", e.UID, e.GID), fmt.Sprintf("%d:%d", st.Uid, st.Gid))
	}
	if uint64(e.Inode) != st.Ino {
		bad("inode", e.Inode, st.Ino)
	}
	if uint64(e.Nlink) != uint64(st.Nlink) {
		bad("nlink", e.Nlink, st.Nlink)
	}
	if (fi.Mode().IsRegular() || fi.Mode()&fs.ModeSymlink != 0) && e.Size != fi.Size() {
		bad("size", e.Size, fi.Size())
	}
	if e.Blocks != st.Blocks {
		bad("blocks", e.Blocks, st.Blocks)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(host)
		if err != nil {
			t.Fatal(err)
		}
		if e.LinkTarget != target {
			bad("link target", fmt.Sprintf("%q", e.LinkTarget), fmt.Sprintf("%q", target))
		}
	}
	if fi.Mode()&fs.ModeDevice != 0 && (e.Major != unix.Major(st.Rdev) || e.Minor != unix.Minor(st.Rdev)) {
		bad("device", fmt.Sprintf("%d:%d", e.Major, e.Minor), fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
	}
	if !fi.Mode().IsRegular() || fi.Size() >= maxReadBack {
		return 0
	}
	var data []byte
	err = safely(func() (err error) { data, err = im.ReadFile(p); return err })
	if errors.Is(err, errPanic) {
		t.Errorf("inspect ReadFile(%q): %v", p, err)
		return 0
	}
	if !utf8.ValidString(p) {
		if err == nil {
			t.Errorf("inspect ReadFile(%q) of a non-UTF-8 path succeeded; update unreadable", p)
		}
		return 0
	}
	if sparse := st.Blocks*512 < (fi.Size()+4095)/4096*4096; sparse {
		if err == nil || !strings.Contains(err.Error(), "sparse") {
			t.Errorf("inspect ReadFile(%q) of a sparse file = %d bytes, %v; want a 'sparse file' error", p, len(data), err)
		}
		return 0
	}
	if err != nil {
		t.Errorf("inspect ReadFile(%q): %v", p, err)
		return 0
	}
	want, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, want) {
		t.Errorf("inspect ReadFile(%q) = %d bytes %.40q, the mount has %d bytes %.40q", p, len(data), data, len(want), want)
	}
	return 1
}

// newCA makes a self-signed CA certificate and writes its PEM to a file.
func newCA(t testing.TB, cn string) (pemBytes []byte, file string) {
	t.Helper()
	pemBytes = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: images.NewCACert(t, cn)})
	file = filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(file, pemBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	return pemBytes, file
}

// fakeEnvd is an ELF-looking payload of about 64 KiB, different per seed.
func fakeEnvd(seed byte) []byte {
	// A static executable's header for the test images' platform, as the
	// start check wants of envd.
	b := images.StaticELF(runtime.GOARCH, 64<<10+int(seed))
	for i := 64; i < len(b); i++ {
		b[i] = byte(i*31) ^ seed
	}
	return b
}

// waitCacheIdle waits until the layer cache has no layer queued for or
// being re-encoded, as the agent's metrics see it.
func waitCacheIdle(t testing.TB, b *rootfs.Builder) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for b.CacheStats().TranscodePending > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("layer cache still busy after a minute: %+v", b.CacheStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
