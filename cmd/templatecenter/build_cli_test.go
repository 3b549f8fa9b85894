package main

// Black-box tests of `templatecenter build` and `templatecenter inspect`:
// images written as OCI layouts with go-containerregistry's layout package
// or served by its in-memory registry behind basic auth, built by the
// binary under test, checked with e2fsck and read back with inspect.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// motd is the content of /etc/motd in the test image.
const motd = "hello from an OCI layout\n"

// tarFile is one entry of a test layer.
type tarFile struct {
	name, body, link string
	typ              byte
	mode             int64
}

// layerTar writes entries as an uncompressed tar stream.
func layerTar(t testing.TB, entries ...tarFile) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link,
			ModTime: time.Date(2024, 3, 4, 5, 6, 7, 0, time.UTC), Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// cliImage is a two-layer image with a config the build reports; its
// command, a script, passes the start check (/bin/sh is a static
// executable's header).
func cliImage(t testing.TB) v1.Image {
	t.Helper()
	return images.New(t, images.Config{
		Config:  v1.Config{Entrypoint: []string{"/bin/app"}, Cmd: []string{"--serve"}, Env: []string{"A=1"}, WorkingDir: "/srv", User: "1000"},
		Created: time.Date(2024, 3, 4, 5, 6, 7, 0, time.UTC),
	},
		images.Layer{Tar: layerTar(t,
			tarFile{name: "etc/", typ: tar.TypeDir, mode: 0o755},
			tarFile{name: "etc/motd", typ: tar.TypeReg, mode: 0o644, body: motd},
			tarFile{name: "bin/", typ: tar.TypeDir, mode: 0o755},
			tarFile{name: "bin/app", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho app\n"},
			tarFile{name: "bin/sh", typ: tar.TypeReg, mode: 0o755, body: string(images.StaticELF(runtime.GOARCH, 4096))},
		)},
		images.Layer{Tar: layerTar(t,
			tarFile{name: "srv/", typ: tar.TypeDir, mode: 0o750},
			tarFile{name: "etc/motd.link", typ: tar.TypeSymlink, mode: 0o777, link: "motd"},
		), Compression: images.Zstd},
	)
}

// writeLayout writes img as an OCI layout tagged tag and returns its
// directory.
func writeLayout(t testing.TB, img v1.Image, tag string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	images.WriteLayout(t, dir, map[string]v1.Image{tag: img})
	return dir
}

// buildOutput is the part of build's JSON result the tests check.
type buildOutput struct {
	ArtifactID    string         `json:"artifact_id"`
	Ext4Path      string         `json:"ext4_path"`
	Ext4SHA256    string         `json:"ext4_sha256"`
	Ext4SizeBytes int64          `json:"ext4_size_bytes"`
	Fingerprint   string         `json:"template_spec_fingerprint"`
	SourceDigest  string         `json:"source_image_digest"`
	ImageConfig   map[string]any `json:"image_config"`
	CABaked       bool           `json:"cube_egress_ca_baked"`
}

// cliEnv is a minimal environment with a HOME of the test's own, so no
// docker config of the host is read.
func cliEnv(t testing.TB) []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
}

// runCLIInput runs the binary with args and stdin, to completion.
func runCLIInput(t testing.TB, env []string, stdin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBuild.Path(t), args...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("templatecenter %s did not finish within %s; stderr:\n%s", strings.Join(args, " "), waitLimit, stderr.String())
	}
	if cmd.ProcessState == nil {
		t.Fatalf("run templatecenter %s: %v", strings.Join(args, " "), err)
	}
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// decodeBuild fails unless a build exited 0 and printed its JSON result,
// and checks the published file against it.
func decodeBuild(t testing.TB, res cliResult, out string) buildOutput {
	t.Helper()
	if res.code != 0 {
		t.Fatalf("templatecenter build exited %d; stderr:\n%s", res.code, res.stderr)
	}
	var got buildOutput
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
		t.Fatalf("build output is not JSON: %v\n%s", err, res.stdout)
	}
	if want := filepath.Join(out, got.ArtifactID, got.ArtifactID+".ext4"); got.Ext4Path != want {
		t.Errorf("ext4_path = %q, want %q", got.Ext4Path, want)
	}
	if len(got.Fingerprint) != 64 || got.ArtifactID != api.ArtifactID(got.Fingerprint) {
		t.Errorf("artifact_id %q does not derive from template_spec_fingerprint %q", got.ArtifactID, got.Fingerprint)
	}
	data, err := os.ReadFile(got.Ext4Path)
	if err != nil {
		t.Fatalf("read the built image: %v", err)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != got.Ext4SHA256 || int64(len(data)) != got.Ext4SizeBytes {
		t.Errorf("the file has sha256 %x and %d bytes; build printed %s and %d", sum, len(data), got.Ext4SHA256, got.Ext4SizeBytes)
	}
	entries, err := os.ReadDir(filepath.Dir(got.Ext4Path))
	if err != nil || len(entries) != 1 {
		t.Errorf("the artifact directory holds %v (%v), want only the image", entries, err)
	}
	if out, err := exec.Command("e2fsck", "-fn", got.Ext4Path).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn: %v\n%s", err, out)
	}
	return got
}

// TestBuildCLIOCILayout builds an OCI layout without a CA, checks the JSON
// result against the file, e2fsck and the fingerprint formula, reads the
// image back with inspect, and builds again with envd.
func TestBuildCLIOCILayout(t *testing.T) {
	t.Parallel()
	img := cliImage(t)
	dir := writeLayout(t, img, "v1")
	ref := "oci-layout:" + dir + ":v1"
	out, cache := filepath.Join(t.TempDir(), "out"), filepath.Join(t.TempDir(), "cache")
	env := cliEnv(t)
	got := decodeBuild(t, runCLI(t, env, "build", "--image", ref, "--no-ca", "--out", out, "--cache", cache), out)

	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if want := "oci-layout:" + dir + "@" + d.String(); got.SourceDigest != want {
		t.Errorf("source_image_digest = %q, want %q", got.SourceDigest, want)
	}
	tmpl := api.TemplateRequest{SourceImageRef: ref, WritableLayerSize: "20Gi"}
	if want, err := api.Fingerprint(&tmpl, got.SourceDigest, "", ""); err != nil || got.Fingerprint != want {
		t.Errorf("template_spec_fingerprint = %s, want %s (upstream's formula; Fingerprint err %v)", got.Fingerprint, want, err)
	}
	if got.CABaked {
		t.Error("cube_egress_ca_baked with --no-ca")
	}
	if ep, _ := got.ImageConfig["Entrypoint"].([]any); len(ep) != 1 || ep[0] != "/bin/app" || got.ImageConfig["WorkingDir"] != "/srv" || got.ImageConfig["User"] != "1000" {
		t.Errorf("image_config = %v, want the image's", got.ImageConfig)
	}

	res := runCLI(t, env, "inspect", got.Ext4Path, "/")
	if res.code != 0 {
		t.Fatalf("inspect / exited %d: %s", res.code, res.stderr)
	}
	lines := map[string]string{}
	for line := range strings.Lines(res.stdout) {
		f := strings.Fields(line)
		lines[f[len(f)-1]] = line
	}
	for _, name := range []string{"bin", "etc", "srv", "lost+found"} {
		if _, ok := lines[name]; !ok {
			t.Errorf("inspect / does not list %s:\n%s", name, res.stdout)
		}
	}
	if l := strings.TrimSpace(lines["srv"]); !strings.HasPrefix(l, "drwxr-x---") {
		t.Errorf("inspect / shows srv as %q, want mode drwxr-x---", l)
	}
	if res := runCLI(t, env, "inspect", got.Ext4Path, "/etc/motd"); res.code != 0 || res.stdout != motd {
		t.Errorf("inspect /etc/motd = exit %d, %q (%s); want %q", res.code, res.stdout, res.stderr, motd)
	}
	if res := runCLI(t, env, "inspect", got.Ext4Path, "/etc"); res.code != 0 || !strings.Contains(res.stdout, "motd.link -> motd") {
		t.Errorf("inspect /etc = exit %d, %q; want the symlink shown with its target", res.code, res.stdout)
	}
	if res := runCLI(t, env, "inspect", got.Ext4Path, "/etc/missing"); res.code != 1 {
		t.Errorf("inspect of a missing path exited %d, want 1", res.code)
	}

	// The same build with a fresh cache gives the same file; an envd
	// changes the fingerprint and lands in the image.
	again := decodeBuild(t, runCLI(t, env, "build", "--image", ref, "--no-ca", "--out", out, "--cache", filepath.Join(t.TempDir(), "c2")), out)
	if again.ArtifactID != got.ArtifactID || again.Ext4SHA256 != got.Ext4SHA256 {
		t.Errorf("rebuild gave %s %s, first build %s %s", again.ArtifactID, again.Ext4SHA256, got.ArtifactID, got.Ext4SHA256)
	}
	envd := append(images.StaticELF(runtime.GOARCH, 64), bytes.Repeat([]byte("envd"), 4096)...)
	envdFile := filepath.Join(t.TempDir(), "envd")
	if err := os.WriteFile(envdFile, envd, 0o755); err != nil {
		t.Fatal(err)
	}
	withEnvd := decodeBuild(t, runCLI(t, env, "build", "--image", ref, "--no-ca", "--envd", envdFile, "--out", out, "--cache", cache), out)
	if withEnvd.ArtifactID == got.ArtifactID {
		t.Error("an envd did not change the artifact id")
	}
	if res := runCLI(t, env, "inspect", withEnvd.Ext4Path, "/usr/local/bin/envd"); res.code != 0 || res.stdout != string(envd) {
		t.Errorf("inspect /usr/local/bin/envd = exit %d, %d bytes (%s); want the envd file", res.code, len(res.stdout), res.stderr)
	}
}

// TestBuildCLIUsage: command-line mistakes exit 2 with a usage message.
func TestBuildCLIUsage(t *testing.T) {
	t.Parallel()
	env := cliEnv(t)
	for _, args := range [][]string{
		{"build"},
		{"build", "--no-ca"},
		{"build", "--image", "example.com/a:b", "extra"},
		{"build", "--no-such-flag"},
		{"inspect"},
		{"inspect", "a.ext4", "/", "extra"},
	} {
		res := runCLI(t, env, args...)
		if res.code != 2 || !strings.Contains(res.stderr, "usage") {
			t.Errorf("templatecenter %s = exit %d, stderr %q; want exit 2 with a usage message", strings.Join(args, " "), res.code, res.stderr)
		}
	}
}

// TestBuildCLIMissingCA: without --no-ca a missing CA fails the build with
// exit 1 and a hint, and nothing is published.
func TestBuildCLIMissingCA(t *testing.T) {
	t.Parallel()
	dir := writeLayout(t, cliImage(t), "v1")
	out := filepath.Join(t.TempDir(), "out")
	missing := filepath.Join(t.TempDir(), "no-such-ca.crt")
	res := runCLI(t, cliEnv(t), "build", "--image", "oci-layout:"+dir+":v1", "--ca", missing,
		"--out", out, "--cache", filepath.Join(t.TempDir(), "cache"))
	if res.code != 1 || !strings.Contains(res.stderr, "--no-ca") || !strings.Contains(res.stderr, missing) {
		t.Errorf("build with a missing CA = exit %d, stderr %q; want exit 1 naming the file and --no-ca", res.code, res.stderr)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("the output directory holds %v after a failed build", entries)
	}
}

// TestBuildCLIRegistryAuth builds from a registry behind basic auth with
// the password on standard input; a wrong one fails without showing it.
func TestBuildCLIRegistryAuth(t *testing.T) {
	t.Parallel()
	const user, pass = "cli-user", "Cli-Registry-Pa55"
	reg := images.StartRegistry(t, images.BasicAuth(user, pass))
	img := cliImage(t)
	ref := reg.Push(t, "private/cli:v1", img, remote.WithAuth(&authn.Basic{Username: user, Password: pass}))
	out := filepath.Join(t.TempDir(), "out")
	env := cliEnv(t)
	args := []string{"build", "--image", ref, "--insecure", "--username", user, "--password-stdin", "--no-ca",
		"--out", out, "--cache", filepath.Join(t.TempDir(), "cache")}

	res := runCLIInput(t, env, pass+"\n", args...)
	got := decodeBuild(t, res, out)
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if want := reg.Host + "/private/cli@" + d.String(); got.SourceDigest != want {
		t.Errorf("source_image_digest = %q, want %q", got.SourceDigest, want)
	}
	if strings.Contains(res.stdout+res.stderr, pass) {
		t.Error("build printed the password")
	}

	const wrong = "Wrong-Pa55-On-Stdin"
	res = runCLIInput(t, env, wrong+"\n", args...)
	if res.code != 1 || !strings.Contains(res.stderr, "authentication") {
		t.Errorf("build with a wrong password = exit %d, stderr %q; want exit 1 mentioning authentication", res.code, res.stderr)
	}
	if strings.Contains(res.stdout+res.stderr, wrong) {
		t.Errorf("build printed the wrong password: %q", res.stderr)
	}
}

// TestInspectCLILongName: an image with a 255-byte file name (valid ext4,
// e2fsck-clean, readable by the kernel) must be listed, or refused with
// exit 1 and a message, never crash the command.
func TestInspectCLILongName(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("n", 255)
	img := images.New(t, images.Config{}, images.Layer{Tar: layerTar(t,
		tarFile{name: long, typ: tar.TypeReg, mode: 0o644, body: "long"},
		tarFile{name: "short", typ: tar.TypeReg, mode: 0o644, body: "short"})})
	dir := writeLayout(t, img, "v1")
	out := filepath.Join(t.TempDir(), "out")
	env := cliEnv(t)
	got := decodeBuild(t, runCLI(t, env, "build", "--image", "oci-layout:"+dir+":v1", "--no-ca",
		"--out", out, "--cache", filepath.Join(t.TempDir(), "cache")), out)
	res := runCLI(t, env, "inspect", got.Ext4Path, "/")
	switch {
	case res.code == 0 && strings.Contains(res.stdout, long):
	case res.code == 1 && !strings.Contains(res.stderr, "panic") && !strings.Contains(res.stderr, "goroutine"):
	default:
		t.Errorf("inspect / of an image with a 255-byte name = exit %d, stderr:\n%.600s\nwant a listing, or exit 1 with a message", res.code, res.stderr)
	}
}
