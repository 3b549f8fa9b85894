package tcimage

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/cubesandbox/cubetemplatecenter/test/cmdbin"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

const (
	// testVersion and testRevision are linked into the binary and name
	// the image.
	testVersion  = "v0.0.0-image"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
	// sourceDateEpoch is every time in the image.
	sourceDateEpoch = "1700000000"
	// stateDir is where the image keeps everything the agent writes.
	stateDir = "/var/lib/cube-templatecenter"
	// imageUID is the image's unprivileged user.
	imageUID = 65532
)

// debCache keeps the downloaded .deb files between runs, so the tests
// fetch them from the Debian mirror once.
var debCache = filepath.Join(images.DebianCacheRoot, "image-debs")

// built is the package's image, made once by the first test that needs it.
type built struct {
	dir     string // temporary directory holding the image and its unpacked copy
	binary  string // the templatecenter binary in the image (cmdbin's)
	tcimage string // the image builder (cmdbin's)
	layout  string // the OCI layout (tag latest)
	archive string // the OCI archive of it
	digest  string // the index digest tcimage printed
	rootfs  string // the image unpacked by umoci (a bundle's rootfs)
	err     error
}

var (
	fixtureOnce sync.Once
	fixture     built
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fixture.dir != "" {
		os.RemoveAll(fixture.dir)
	}
	cmdbin.Cleanup()
	os.Exit(code)
}

// needRoot skips the test unless it runs as root, and fails it when a tool
// it runs is missing (make deps installs them).
func needRoot(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the image tests need root (runc, umoci keeping ownership)")
	}
	for _, tool := range append([]string{"umoci", "dpkg-deb", "apt-get"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: make deps installs the test packages (TEST_PACKAGES in the Makefile)", tool)
		}
	}
}

// image returns the package's image, building it the first time: the
// binary as make image builds it (cgo), the image by cmd/tcimage, unpacked
// by umoci.
func image(t *testing.T) *built {
	t.Helper()
	needRoot(t)
	fixtureOnce.Do(func() { fixture.err = fixture.build() })
	if fixture.err != nil {
		t.Fatalf("build the image: %v", fixture.err)
	}
	return &fixture
}

func (b *built) build() error {
	dir, err := os.MkdirTemp("", "tc-image-test-")
	if err != nil {
		return err
	}
	b.dir = dir
	if b.binary, err = (cmdbin.Build{Version: testVersion, Revision: testRevision}).Binary(); err != nil {
		return err
	}
	if b.tcimage, err = (cmdbin.Build{Command: "tcimage"}).Binary(); err != nil {
		return err
	}
	b.layout = filepath.Join(dir, "image")
	b.archive = filepath.Join(dir, "image.tar")
	if b.digest, err = b.runBuilder(b.layout, b.archive); err != nil {
		return err
	}
	bundle := filepath.Join(dir, "bundle")
	// umask 022 as in a shell: umoci applies the process umask to the
	// directories it creates.
	old := syscall.Umask(0o022)
	out, err := exec.Command("umoci", "unpack", "--image", b.layout+":latest", bundle).CombinedOutput()
	syscall.Umask(old)
	if err != nil {
		return fmt.Errorf("umoci unpack: %w\n%s", err, out)
	}
	b.rootfs = filepath.Join(bundle, "rootfs")
	return nil
}

// runBuilder runs tcimage as make image does and returns the digest it
// prints.
func (b *built) runBuilder(out, archive string) (string, error) {
	cmd := exec.Command(b.tcimage, "-out", out, "-tar", archive, "-version", testVersion, "-revision", testRevision,
		"-debs", debCache, "-platform", "amd64="+b.binary, "-source-date-epoch", sourceDateEpoch)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("tcimage: %w\n%s", err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// TestReproducible: building again from the same binary, packages and
// SOURCE_DATE_EPOCH gives the same index digest and a byte-identical OCI
// archive; another version gives another digest.
func TestReproducible(t *testing.T) {
	b := image(t)
	dir := t.TempDir()
	again, err := b.runBuilder(filepath.Join(dir, "image"), filepath.Join(dir, "image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if again != b.digest || !strings.HasPrefix(again, "sha256:") {
		t.Errorf("second build: index %s, first %s; want the same digest", again, b.digest)
	}
	first, err := os.ReadFile(b.archive)
	if err != nil {
		t.Fatal(err)
	}
	second, err := os.ReadFile(filepath.Join(dir, "image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, second) {
		t.Errorf("the OCI archives of two builds differ (%d and %d bytes)", len(first), len(second))
	}
}

// TestImageContents checks the layout's tags, the annotations and labels
// (version, revision, Debian packages), the configuration (non-root user,
// state paths under the volume) and the unpacked files.
func TestImageContents(t *testing.T) {
	b := image(t)
	p, err := layout.FromPath(b.layout)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	tags := map[string]v1.Hash{}
	for _, d := range im.Manifests {
		tags[d.Annotations["org.opencontainers.image.ref.name"]] = d.Digest
	}
	if len(tags) != 2 || tags["latest"].String() != b.digest || tags[testVersion].String() != b.digest {
		t.Errorf("layout tags = %v, want latest and %s on %s", tags, testVersion, b.digest)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	h, err := v1.NewHash(b.digest)
	if err != nil {
		t.Fatal(err)
	}
	multi, err := idx.ImageIndex(h)
	if err != nil {
		t.Fatal(err)
	}
	mm, err := multi.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	checkAnnotations(t, "index", mm.Annotations)
	if len(mm.Manifests) != 1 || mm.Manifests[0].Platform == nil || mm.Manifests[0].Platform.Architecture != "amd64" || mm.Manifests[0].Platform.OS != "linux" {
		t.Fatalf("index manifests = %+v, want one linux/amd64 image", mm.Manifests)
	}
	img, err := multi.Image(mm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	checkAnnotations(t, "manifest", m.Annotations)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	checkAnnotations(t, "config labels", cf.Config.Labels)
	if cf.Config.User != "65532:65532" {
		t.Errorf("config user = %q, want 65532:65532", cf.Config.User)
	}
	if want := "1700000000"; fmt.Sprint(cf.Created.Unix()) != want {
		t.Errorf("config created = %v, want SOURCE_DATE_EPOCH %s", cf.Created, want)
	}
	for _, v := range []string{"CUBE_TEMPLATE_CENTER_SPOOL_PATH=" + stateDir + "/spool.db",
		"CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR=" + stateDir + "/store", "CUBE_TEMPLATE_CENTER_WORK_DIR=" + stateDir + "/work"} {
		if !slices.Contains(cf.Config.Env, v) {
			t.Errorf("config env %q lacks %s", cf.Config.Env, v)
		}
	}
	if _, ok := cf.Config.Volumes[stateDir]; !ok {
		t.Errorf("config volumes = %v, want %s", cf.Config.Volumes, stateDir)
	}

	checkFile := func(rel string, check func(fi os.FileInfo, data []byte) string) {
		t.Helper()
		p := filepath.Join(b.rootfs, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Errorf("image file /%s: %v", rel, err)
			return
		}
		var data []byte
		if fi.Mode().IsRegular() {
			data, _ = os.ReadFile(p)
		}
		if problem := check(fi, data); problem != "" {
			t.Errorf("image file /%s: %s", rel, problem)
		}
	}
	owner := func(fi os.FileInfo) (uint32, uint32) {
		st := fi.Sys().(*syscall.Stat_t)
		return st.Uid, st.Gid
	}
	checkFile("etc/passwd", func(_ os.FileInfo, d []byte) string {
		if !strings.Contains(string(d), "templatecenter:x:65532:65532:") {
			return fmt.Sprintf("no templatecenter user 65532: %q", d)
		}
		return ""
	})
	checkFile("etc/group", func(_ os.FileInfo, d []byte) string {
		if !strings.Contains(string(d), "templatecenter:x:65532:") {
			return fmt.Sprintf("no templatecenter group 65532: %q", d)
		}
		return ""
	})
	checkFile("etc/ssl/certs/ca-certificates.crt", func(_ os.FileInfo, d []byte) string {
		if n := strings.Count(string(d), "-----BEGIN CERTIFICATE-----"); n < 50 {
			return fmt.Sprintf("%d certificates, want Debian's bundle", n)
		}
		return ""
	})
	checkFile("usr/lib/x86_64-linux-gnu/libisal.so.2", func(fi os.FileInfo, _ []byte) string {
		if fi.Mode()&os.ModeSymlink == 0 {
			return "not libisal2's symlink"
		}
		return ""
	})
	checkFile("usr/bin/templatecenter", func(fi os.FileInfo, _ []byte) string {
		if u, g := owner(fi); u != 0 || g != 0 || fi.Mode().Perm() != 0o755 {
			return fmt.Sprintf("owner %d:%d mode %v, want root-owned 0755 (the agent cannot change its own binary)", u, g, fi.Mode())
		}
		return ""
	})
	checkFile(strings.TrimPrefix(stateDir, "/"), func(fi os.FileInfo, _ []byte) string {
		if u, g := owner(fi); u != imageUID || g != imageUID || !fi.IsDir() {
			return fmt.Sprintf("owner %d:%d mode %v, want a directory of 65532", u, g, fi.Mode())
		}
		return ""
	})
	checkFile("var/lib/dpkg/status.d/libisal2", func(_ os.FileInfo, d []byte) string {
		if !strings.Contains(string(d), "Package: libisal2\n") || !strings.Contains(string(d), "Status: install ok installed\n") {
			return fmt.Sprintf("not a dpkg status entry: %q", d)
		}
		return ""
	})
	for _, gone := range []string{"usr/share/man", "usr/share/doc/libc6/changelog.Debian.gz"} {
		if _, err := os.Lstat(filepath.Join(b.rootfs, gone)); err == nil {
			t.Errorf("image holds /%s, which it leaves out", gone)
		}
	}
	checkFile("usr/share/doc/libc6/copyright", func(os.FileInfo, []byte) string { return "" })
}

// checkAnnotations fails unless a holds the version, the revision and the
// Debian packages.
func checkAnnotations(t *testing.T, what string, a map[string]string) {
	t.Helper()
	if a["org.opencontainers.image.version"] != testVersion || a["org.opencontainers.image.revision"] != testRevision {
		t.Errorf("%s: version %q revision %q, want %s %s", what, a["org.opencontainers.image.version"], a["org.opencontainers.image.revision"], testVersion, testRevision)
	}
	pkgs := a["org.cubesandbox.templatecenter.debian-packages"]
	for _, p := range []string{"ca-certificates=", "libc6=", "libisal2="} {
		if !strings.Contains(pkgs, p) {
			t.Errorf("%s: Debian packages %q lack %s", what, pkgs, p)
		}
	}
}
