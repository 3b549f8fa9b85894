package fstest

import (
	"os"
	"os/exec"
	"testing"
)

// Fsck fails the test unless `e2fsck -fn` finds the image clean (exit 0).
func Fsck(t testing.TB, image string) {
	t.Helper()
	out, err := exec.Command("e2fsck", "-fn", image).CombinedOutput()
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

// Tmpfs mounts a tmpfs of the given size ("8m") on a fresh directory, for
// running out of space on purpose, and unmounts it when the test ends. It
// skips the test unless run as root.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	return mount(t, "tmpfs mounts", "-t", "tmpfs", "-o", "size="+size, "tmpfs")
}

// mount runs mount(8) with args and a fresh directory as the target.
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
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
		}
	})
	return dir
}
