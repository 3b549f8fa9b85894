package ext4

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// TestManyGroups lays out 12 block groups of file data (without writing
// it: Data is taken straight from the allocator, so the image stays
// sparse) and checks that no data lands on a superblock backup, and that
// every backup superblock and descriptor table is valid on its own.
func TestManyGroups(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fs.ext4")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := openWriter(f, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	root := dir(map[string]*Node{})
	for i := 0; i < 12; i++ {
		runs, err := w.alloc.alloc(30000)
		if err != nil {
			t.Fatal(err)
		}
		var d Data
		var logical uint64
		for _, r := range runs {
			for g := r.start / blocksPerGroup; g <= (r.start+r.count-1)/blocksPerGroup; g++ {
				if hasSuper(g) && r.start < g*blocksPerGroup+1+w.gdtReserve && r.start+r.count > g*blocksPerGroup {
					t.Fatalf("run %d+%d overlaps the superblock area of group %d", r.start, r.count, g)
				}
			}
			d.addRun(logical, r.start, r.count)
			logical += r.count
		}
		root.Children[fmt.Sprintf("f%02d", i)] = &Node{Mode: ModeRegular | 0o644, Size: int64(logical) * BlockSize, Data: d}
	}
	st, err := w.Finish(t.Context(), root)
	if err != nil {
		t.Fatal(err)
	}
	groups := (st.BlocksTotal + blocksPerGroup - 1) / blocksPerGroup
	if groups < 12 {
		t.Fatalf("%d groups, want at least 12", groups)
	}
	imagetest.Fsck(t, path)
	for g := uint64(1); g < groups; g++ {
		if !hasSuper(g) {
			continue
		}
		b := fmt.Sprint(g * blocksPerGroup)
		out, err := exec.Command(imagetest.Tool(t, "e2fsck"), "-fn", "-b", b, "-B", "4096", path).CombinedOutput()
		if err != nil {
			t.Errorf("e2fsck with the backup superblock of group %d: %v\n%s", g, err, out)
		}
	}
	if got := fmt.Sprint(hasSuper(3), hasSuper(25), hasSuper(10), hasSuper(49), hasSuper(81), hasSuper(15)); got != "true true false true true false" {
		t.Errorf("hasSuper(3, 25, 10, 49, 81, 15) = %s", got)
	}
	mnt := imagetest.Mount(t, path)
	ents, err := os.ReadDir(mnt)
	if err != nil || len(ents) != 13 {
		t.Errorf("readdir: %d entries, %v; want 13", len(ents), err)
	}
	info := debugfs(t, path, "stat /f11")
	if !strings.Contains(info, fmt.Sprintf("Size: %d", int64(30000)*BlockSize)) {
		t.Errorf("stat /f11:\n%.300s", info)
	}
}
