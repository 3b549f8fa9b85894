package imagetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Tool returns the path of an e2fsprogs tool (e2fsck, debugfs...), looking
// in /sbin and /usr/sbin too when PATH lacks them. A missing tool fails the
// test with the package to install.
func Tool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	for _, d := range []string{"/sbin", "/usr/sbin"} {
		if _, err := os.Stat(filepath.Join(d, name)); err == nil {
			return filepath.Join(d, name)
		}
	}
	t.Fatalf("%s not found (apt-get install e2fsprogs)", name)
	return ""
}

// Fsck fails the test unless `e2fsck -fn` finds the image clean (exit 0).
func Fsck(t testing.TB, image string) {
	t.Helper()
	out, err := exec.Command(Tool(t, "e2fsck"), "-fn", image).CombinedOutput()
	if err != nil {
		t.Fatalf("e2fsck -fn %s: %v\n%s", image, err, out)
	}
}

// Mount loop-mounts an ext4 image read-only on a fresh directory and
// unmounts it when the test ends. It skips the test unless run as root.
func Mount(t testing.TB, image string) string {
	t.Helper()
	return mount(t, "loop mounts", "-t", "ext4", "-o", "loop,ro", image)
}

// MountRW is Mount read-write: the test changes the image through the
// kernel, and Umount before checking it again with Fsck.
func MountRW(t testing.TB, image string) string {
	t.Helper()
	return mount(t, "loop mounts", "-t", "ext4", "-o", "loop", image)
}

// Tmpfs mounts a tmpfs of the given size ("8m") on a fresh directory, for
// running out of space on purpose, and unmounts it when the test ends. It
// skips the test unless run as root.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	return mount(t, "tmpfs mounts", "-t", "tmpfs", "-o", "size="+size, "tmpfs")
}

// Umount unmounts dir, a mount point of Mount, MountRW or Tmpfs, before the
// test ends (the unmount at the end then finds nothing to do).
func Umount(t testing.TB, dir string) {
	t.Helper()
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v\n%s", dir, err, out)
	}
}

// mount runs mount(8) with args and a fresh directory as the target, and
// unmounts it at cleanup unless Umount did already.
func mount(t testing.TB, what string, args ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip(what + " need root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", append(args, dir)...).CombinedOutput(); err != nil {
		t.Fatalf("mount %v: %v\n%s", args, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil && !strings.Contains(string(out), "not mounted") {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
		}
	})
	return dir
}
