package rootfs_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
	"github.com/cubesandbox/cubetemplatecenter/test/registry"
)

// TestBuildDebian builds a realistic image: a debootstrap'ed Debian
// bookworm minbase (cached between runs, see images.DebianRootfs) in three
// layers, pushed to Debian's docker-registry. The mounted image must equal
// the debootstrap tree itself, path by path (type, mode, owner, size,
// content hash, link target, device numbers, xattrs, hard link groups and
// mtimes), read back through go-diskfs, and boot a shell: /bin/sh runs
// under chroot on a read-write mount of a copy, which stays e2fsck-clean.
func TestBuildDebian(t *testing.T) {
	if testing.Short() {
		t.Skip("debootstrap image in -short mode")
	}
	tree := images.DebianRootfs(t)
	img := images.DebianImage(t)
	reg := registry.StartForTest(t, registry.Options{})
	ref := reg.Ref("debian/minbase:bookworm")
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(reg.Auth())); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}

	opts := builderOptions(t, reg.Host)
	b := newBuilder(t, opts)
	res := buildOK(t, b, opts.Store, rootfs.Source{Ref: ref}, 3, nil, nil)
	if c := res.img.Config; len(c.Entrypoint) != 2 || c.Entrypoint[0] != "/bin/sh" || len(c.Cmd) != 1 {
		t.Errorf("image config = %+v, want DebianImage's entrypoint and cmd", c)
	}
	// A real distribution's tree: /bin/sh is a symlink to dash, a dynamic
	// ELF whose loader is reached through the merged-/usr symlinks; the
	// check passes.
	if c := res.art.StartCheck; c == nil || c.Result != "ok" || c.Interpreter == "" {
		t.Errorf("start check = %+v, want ok with the ELF loader found", c)
	}

	want, err := imagetest.SnapshotDir(tree)
	if err != nil {
		t.Fatal(err)
	}
	// The only path the image adds is the lost+found the ext4 writer makes;
	// the tree has none (debootstrap does not create one).
	if _, ok := want[imagetest.LostFound]; ok {
		t.Fatal("the debootstrap tree has a lost+found; the comparison would hide it")
	}
	diffs := imagetest.Diff(want, res.snap, imagetest.DiffOptions{}.SkipLostFound())
	for i, d := range diffs {
		if i == 50 {
			t.Errorf("... and %d more differences", len(diffs)-50)
			break
		}
		t.Error(d)
	}
	if len(want) < 5000 {
		t.Errorf("the debootstrap tree has only %d paths", len(want))
	}

	osRelease, err := os.ReadFile(filepath.Join(res.mnt, "etc/os-release"))
	if err != nil {
		t.Fatal(err)
	}
	treeRelease, err := os.ReadFile(filepath.Join(tree, "etc/os-release"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(osRelease, treeRelease) || !strings.Contains(string(osRelease), "VERSION_CODENAME=bookworm") ||
		!strings.Contains(string(osRelease), `ID=debian`) {
		t.Errorf("/etc/os-release in the image = %q, want the tree's bookworm release", osRelease)
	}

	entries, files := readBack(t, res.art.Path, res.mnt)
	t.Logf("%d paths; read back %d entries and %d files through go-diskfs", len(want), entries, files)
	if entries != len(res.snap)-1 {
		t.Errorf("read back %d entries, the mount has %d paths besides the root", entries, len(res.snap)-1)
	}

	// A guest writes to its root filesystem: run a shell on a read-write
	// mount of a copy, then check the copy again.
	rw := filepath.Join(t.TempDir(), "rw.ext4")
	if out, err := exec.Command("cp", "--sparse=always", res.art.Path, rw).CombinedOutput(); err != nil {
		t.Fatalf("copy image: %v\n%s", err, out)
	}
	func() {
		mnt := mountRW(t, rw)
		out, err := exec.Command("chroot", mnt, "/bin/sh", "-c", "echo ok && echo written > /root/probe && cat /root/probe").CombinedOutput()
		if err != nil || string(out) != "ok\nwritten\n" {
			t.Errorf("chroot %s /bin/sh: %q, %v; want \"ok\\nwritten\\n\"", mnt, out, err)
		}
		umount(t, mnt)
	}()
	imagetest.Fsck(t, rw)
}

// mountRW loop-mounts an image read-write; the caller unmounts it with
// umount (a cleanup does it too if the test stops first).
func mountRW(t *testing.T, image string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop", image, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount %s read-write: %v\n%s", image, err, out)
	}
	t.Cleanup(func() {
		if isMounted(dir) {
			umount(t, dir)
		}
	})
	return dir
}

func umount(t *testing.T, dir string) {
	t.Helper()
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		t.Errorf("umount %s: %v\n%s", dir, err, out)
	}
}

// isMounted reports whether dir is a mount point.
func isMounted(dir string) bool {
	return exec.Command("mountpoint", "-q", dir).Run() == nil
}
