package inspect

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// mkfsImage builds a reference image with e2fsprogs (metadata_csum is the
// mke2fs default) from a small tree.
func mkfsImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	for _, d := range []string{"etc", "usr/bin"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "etc/motd"), []byte("hello\n"), 0o640)
	os.WriteFile(filepath.Join(root, "usr/bin/tool"), bytes.Repeat([]byte("x"), 10000), 0o4755)
	syscall.Chmod(filepath.Join(root, "usr/bin/tool"), 0o4755)
	os.Chown(filepath.Join(root, "etc/motd"), 1000, 1001)
	os.Symlink("../etc/motd", filepath.Join(root, "usr/motd-link"))
	if err := syscall.Mknod(filepath.Join(root, "null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatalf("mknod (needs root): %v", err)
	}
	syscall.Chmod(filepath.Join(root, "null"), 0o666)
	img := filepath.Join(dir, "img.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "metadata_csum", "-d", root, img, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	return img
}

func TestListStatAndRead(t *testing.T) {
	im, err := Open(mkfsImage(t))
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	root, err := im.List("/")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]Entry{}
	for _, e := range root {
		names[e.Name] = e
	}
	if e := names["etc"]; !e.Mode.IsDir() || e.Mode.Perm() != 0o755 {
		t.Errorf("etc = %+v", e)
	}
	if e := names["null"]; e.Mode&fs.ModeCharDevice == 0 || e.Major != 1 || e.Minor != 3 || e.Mode.Perm() != 0o666 {
		t.Errorf("null = %+v", e)
	}
	if _, ok := names["lost+found"]; !ok {
		t.Error("lost+found missing from the listing")
	}
	motd, err := im.Stat("/etc/motd")
	if err != nil || motd.UID != 1000 || motd.GID != 1001 || motd.Mode.Perm() != 0o640 || motd.Size != 6 {
		t.Errorf("Stat(/etc/motd) = %+v, %v", motd, err)
	}
	tool, _ := im.Stat("usr/bin/tool")
	if tool.Mode&fs.ModeSetuid == 0 {
		t.Errorf("setuid bit lost: %v", tool.Mode)
	}
	link, _ := im.List("/usr")
	if len(link) != 2 || link[1].Name != "motd-link" || link[1].LinkTarget != "../etc/motd" {
		t.Errorf("List(/usr) = %+v", link)
	}
	data, err := im.ReadFile("/usr/bin/tool")
	if err != nil || !bytes.Equal(data, bytes.Repeat([]byte("x"), 10000)) {
		t.Errorf("ReadFile = %d bytes, %v", len(data), err)
	}
	if _, err := im.ReadFile("/etc"); err == nil {
		t.Error("ReadFile of a directory succeeded")
	}
	if _, err := im.Stat("/nope"); err == nil {
		t.Error("Stat of a missing path succeeded")
	}
}

func TestOpenRejectsNonExt4(t *testing.T) {
	p := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(p, bytes.Repeat([]byte{0xAA}, 1<<20), 0o644)
	if _, err := Open(p); err == nil {
		t.Error("Open of a non-ext4 file succeeded")
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Open of a missing file succeeded")
	}
}
