package ext4

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// TestTreeLostFound keeps a lost+found the tree brings (with its mode,
// owner and content) as inode 11.
func TestTreeLostFound(t *testing.T) {
	im := newImage(t, testOptions())
	lpf := dir(map[string]*Node{"orphan": im.file(0o600, []byte("recovered"))})
	lpf.Mode = ModeDir | 0o700
	lpf.UID = 7
	im.finish(dir(map[string]*Node{"lost+found": lpf, "a": dir(nil)}))
	imagetest.Fsck(t, im.path)
	st := debugfs(t, im.path, "stat /lost+found")
	if !strings.Contains(st, "Inode: 11 ") || !strings.Contains(st, "User:     7") {
		t.Errorf("stat /lost+found:\n%.300s", st)
	}
	mnt := imagetest.Mount(t, im.path)
	if b, err := os.ReadFile(filepath.Join(mnt, "lost+found", "orphan")); err != nil || string(b) != "recovered" {
		t.Errorf("read lost+found/orphan: %q, %v", b, err)
	}
}

// TestLostFoundNotADirectory keeps a non-directory named lost+found as is:
// inode 11 stays free and e2fsck has nothing to repair.
func TestLostFoundNotADirectory(t *testing.T) {
	im := newImage(t, testOptions())
	st := im.finish(dir(map[string]*Node{"lost+found": im.file(0o644, []byte("x"))}))
	imagetest.Fsck(t, im.path)
	if used := st.InodesTotal - st.InodesFree; used != firstIno {
		t.Errorf("%d inodes used, want %d (1-10 and the file)", used, firstIno)
	}
}

// TestManySubdirectories checks dir_nlink: a directory with more than
// 65,000 subdirectories gets link count 1.
func TestManySubdirectories(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 65,001 directory blocks")
	}
	im := newImage(t, testOptions())
	parent := bigDir(0, nil)
	for i := 0; i < maxLinks+1; i++ {
		parent.Children[itoa(i)] = &Node{Mode: ModeDir | 0o755}
	}
	im.finish(dir(map[string]*Node{"many": parent}))
	imagetest.Fsck(t, im.path)
	if st := debugfs(t, im.path, "stat /many"); !strings.Contains(st, "Links: 1 ") {
		t.Errorf("stat /many:\n%.300s", st)
	}
}

func TestTooManyHardLinks(t *testing.T) {
	im := newImage(t, testOptions())
	f := &Node{Mode: ModeRegular | 0o644}
	d := dir(map[string]*Node{})
	for i := 0; i < maxLinks+1; i++ {
		d.Children[itoa(i)] = f
	}
	if _, err := im.w.Finish(t.Context(), d); err == nil || !strings.Contains(err.Error(), "hard links") {
		t.Fatalf("Finish: %v, want a hard link count error", err)
	}
}
