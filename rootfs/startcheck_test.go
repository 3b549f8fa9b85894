package rootfs_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// mergedUsr is a merged-/usr tree: /bin is a symlink to usr/bin, where a
// static executable lives, and a script under /srv runs it through /bin.
func mergedUsr() []imagetest.Layer {
	return []imagetest.Layer{{
		imagetest.Dir("usr/"), imagetest.Dir("usr/bin/"),
		imagetest.File("usr/bin/app", string(images.StaticELF(runtime.GOARCH, 8192))).Perm(0o755),
		imagetest.Symlink("bin", "usr/bin"),
		imagetest.Dir("srv/"),
		imagetest.File("srv/run.sh", "#!/bin/app\r\n").Perm(0o755),
		imagetest.File("srv/fixed.sh", "#!/bin/app\n").Perm(0o755),
		imagetest.File("etc/passwd", "root:x:0:0:root:/root:/bin/app\n"),
	}}
}

// startImage is an image of layers with cfg, for platform arch.
func startImage(t testing.TB, cfg v1.Config, arch string, layers []imagetest.Layer) v1.Image {
	t.Helper()
	ls := make([]images.Layer, len(layers))
	for i, l := range layers {
		raw, err := l.Tar()
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = images.Layer{Tar: raw}
	}
	return images.New(t, images.Config{Created: imageCreated, Config: cfg, Platform: v1.Platform{OS: "linux", Architecture: arch}}, ls...)
}

// TestBuildStartCheck builds through the real pipeline and checks the
// start command on the tree being written: PATH lookup through a merged
// /usr, a relative script in its working directory, overrides, and the
// three modes; the same check on the finished image agrees.
func TestBuildStartCheck(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	opts := builderOptions(t, reg.Host)
	b := newBuilder(t, opts)
	build := func(t *testing.T, name string, cfg v1.Config, arch string, mode rootfs.StartCheckMode, o rootfs.StartOverrides) (*rootfs.Artifact, *rootfs.Image, error) {
		t.Helper()
		ref := reg.Push(t, "start/"+name+":v1", startImage(t, cfg, arch, mergedUsr()))
		img := resolve(t, b, rootfs.Source{Ref: ref})
		spec := specOf(img, ref, fakeEnvd(3), nil)
		spec.StartCheck, spec.Start = mode, o
		art, err := b.Build(context.Background(), spec, nil)
		return art, img, err
	}

	t.Run("PathThroughMergedUsr", func(t *testing.T) {
		art, img, err := build(t, "path", v1.Config{Cmd: []string{"app", "--serve"}}, runtime.GOARCH, "", rootfs.StartOverrides{})
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		c := art.StartCheck
		if c == nil || c.Result != "ok" || c.Command[0] != "/usr/bin/app" || c.Resolved != "/usr/bin/app" {
			t.Fatalf("start check = %+v, want ok resolving app on the default PATH", c)
		}
		again, err := rootfs.CheckImage(art.Path, img.Config, img.Arch, rootfs.StartOverrides{})
		if err != nil || again.Result != c.Result || again.Resolved != c.Resolved {
			t.Errorf("CheckImage of the finished image = %+v, %v; want the build's %+v", again, err, *c)
		}
	})
	t.Run("RelativeScript", func(t *testing.T) {
		art, img, err := build(t, "relative", v1.Config{Entrypoint: []string{"./fixed.sh"}, WorkingDir: "/srv"}, runtime.GOARCH, "", rootfs.StartOverrides{})
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		if c := art.StartCheck; c.Result != "ok" || c.Resolved != "/srv/fixed.sh" || c.Interpreter != "/bin/app" {
			t.Errorf("start check = %+v, want the script and its interpreter, found through /bin", *c)
		}
		// The image reader follows the /bin symlink the same way.
		got, err := rootfs.CheckImage(art.Path, img.Config, img.Arch, rootfs.StartOverrides{})
		if err != nil || got.Result != "ok" || got.Interpreter != "/bin/app" {
			t.Errorf("CheckImage = %+v, %v; want ok with interpreter /bin/app", got, err)
		}
	})
	t.Run("FailStopsThePublish", func(t *testing.T) {
		_, _, err := build(t, "crlf", v1.Config{Cmd: []string{"/srv/run.sh"}}, runtime.GOARCH, "", rootfs.StartOverrides{})
		var failed *rootfs.StartCheckError
		if !errors.As(err, &failed) || !strings.HasPrefix(err.Error(), "template start check: ") || !strings.Contains(err.Error(), `\r`) {
			t.Fatalf("Build of a CRLF script = %v, want a start check error naming the \\r", err)
		}
		if entries, _ := os.ReadDir(string(opts.Store)); len(entries) != 2 {
			t.Errorf("store holds %d entries, want only the two earlier artifacts", len(entries))
		}
	})
	t.Run("OverridesAndWarn", func(t *testing.T) {
		o := rootfs.StartOverrides{Command: []string{"python3"}, Env: []string{"PATH=/usr/bin"}, RunAsUsername: "app"}
		art, _, err := build(t, "warn", v1.Config{Cmd: []string{"app"}}, runtime.GOARCH, rootfs.StartCheckWarn, o)
		if err != nil {
			t.Fatalf("Build in warn mode: %v", err)
		}
		c := art.StartCheck
		if c == nil || c.Result != "failed" || len(c.Problems) < 2 ||
			!strings.Contains(c.Problems[0], `"python3" not found on PATH=/usr/bin`) || !strings.Contains(strings.Join(c.Problems, "\n"), `"app"`) {
			t.Errorf("warn start check = %+v, want python3 not found and user app missing", c)
		}
		if _, err := os.Stat(art.Path); err != nil {
			t.Errorf("warn mode did not publish: %v", err)
		}
	})
	t.Run("Off", func(t *testing.T) {
		art, _, err := build(t, "off", v1.Config{Cmd: []string{"missing"}}, runtime.GOARCH, rootfs.StartCheckOff, rootfs.StartOverrides{})
		if err != nil || art.StartCheck != nil {
			t.Errorf("Build with the check off = %v, check %+v; want a build without a result", err, art)
		}
	})
	t.Run("OtherArchitecture", func(t *testing.T) {
		arch := "arm64"
		if runtime.GOARCH == "arm64" {
			arch = "amd64"
		}
		_, _, err := build(t, "arch", v1.Config{Cmd: []string{"/bin/app"}}, arch, "", rootfs.StartOverrides{})
		if err == nil || !strings.Contains(err.Error(), "the image is "+arch) {
			t.Errorf("Build of a %s image holding a %s binary = %v, want the architecture named", arch, runtime.GOARCH, err)
		}
	})
}

// TestBuildStartCheckLibraries builds images holding a real program of
// the host, its loader and, or not, the libc it needs, through the real
// pipeline: the check reads libc's dynamic section (near its end) from
// the image being written, fails the build naming a missing library, and
// names the libraries that load; the finished image gives the same
// answer; a user who may not execute the program fails it.
func TestBuildStartCheckLibraries(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the host's amd64 loader and libc")
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Skipf("host file: %v", err)
		}
		return string(b)
	}
	prog, loader, libc := read("/usr/bin/true"), read("/lib64/ld-linux-x86-64.so.2"), read("/lib/x86_64-linux-gnu/libc.so.6")
	const multi = "usr/lib/x86_64-linux-gnu/"
	tree := func(withLibc bool, progMode int64) []imagetest.Layer {
		l := imagetest.Layer{
			imagetest.Dir("usr/"), imagetest.Dir("usr/bin/"), imagetest.Dir("usr/lib/"), imagetest.Dir(multi), imagetest.Dir("etc/"),
			imagetest.Symlink("lib", "usr/lib"), imagetest.Dir("lib64/"),
			imagetest.Symlink("lib64/ld-linux-x86-64.so.2", "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
			imagetest.File(multi+"ld-linux-x86-64.so.2", loader).Perm(0o755),
			imagetest.File("usr/bin/true", prog).Perm(progMode),
			imagetest.File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n"),
		}
		if withLibc {
			l = append(l, imagetest.File(multi+"libc.so.6", libc).Perm(0o755))
		}
		return []imagetest.Layer{l}
	}
	reg := images.StartRegistry(t, nil)
	b := newBuilder(t, builderOptions(t, reg.Host))
	cfg := v1.Config{Cmd: []string{"/usr/bin/true"}}
	build := func(t *testing.T, name string, layers []imagetest.Layer, o rootfs.StartOverrides) (*rootfs.Artifact, *rootfs.Image, error) {
		t.Helper()
		ref := reg.Push(t, "libs/"+name+":v1", startImage(t, cfg, "amd64", layers))
		img := resolve(t, b, rootfs.Source{Ref: ref})
		spec := specOf(img, ref, fakeEnvd(5), nil)
		spec.Start = o
		art, err := b.Build(context.Background(), spec, nil)
		return art, img, err
	}

	t.Run("LibraryMissing", func(t *testing.T) {
		_, _, err := build(t, "missing", tree(false, 0o755), rootfs.StartOverrides{})
		var failed *rootfs.StartCheckError
		if !errors.As(err, &failed) || !strings.Contains(err.Error(), `library "libc.so.6" needed by "/usr/bin/true" not found`) {
			t.Fatalf("Build without libc = %v, want a start check error naming libc.so.6", err)
		}
	})
	t.Run("Libraries", func(t *testing.T) {
		art, img, err := build(t, "libc", tree(true, 0o755), rootfs.StartOverrides{})
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		c := art.StartCheck
		if c == nil || c.Result != "ok" || c.Libraries["libc.so.6"] != "/lib/x86_64-linux-gnu/libc.so.6" {
			t.Fatalf("start check = %+v, want ok with libc.so.6 found through /lib", c)
		}
		again, err := rootfs.CheckImage(art.Path, img.Config, img.Arch, rootfs.StartOverrides{})
		if err != nil || again.Result != "ok" || !maps.Equal(again.Libraries, c.Libraries) {
			t.Errorf("CheckImage of the finished image = %+v, %v; want the build's libraries %v", again, err, c.Libraries)
		}
	})
	t.Run("NotExecutableByTheUser", func(t *testing.T) {
		_, _, err := build(t, "user", tree(true, 0o700), rootfs.StartOverrides{RunAsUsername: "app"})
		if err == nil || !strings.Contains(err.Error(), `"/usr/bin/true" is not executable by uid 1000`) {
			t.Errorf("Build of a program only root may run, as app = %v, want the permission named", err)
		}
	})
}
