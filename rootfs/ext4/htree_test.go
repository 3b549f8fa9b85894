package ext4

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// TestDirHashMatchesE2fsprogs compares dirHash with debugfs dx_hash using
// half_md4 over unsigned bytes (algorithm 4) and the test hash seed.
func TestDirHashMatchesE2fsprogs(t *testing.T) {
	im := newImage(t, testOptions())
	im.finish(dir(nil))
	seed := testOptions().HashSeed
	seedStr := fmt.Sprintf("%x-%x-%x-%x-%x", seed[0:4], seed[4:6], seed[6:8], seed[8:10], seed[10:16])
	re := regexp.MustCompile(`is 0x([0-9a-f]+)`)
	for _, name := range []string{"hello", "a", "caf\xe9", "\xff\xfe\x80", strings.Repeat("x", 32), strings.Repeat("y", 33), strings.Repeat("long-name-", 25)} {
		out := debugfs(t, im.path, fmt.Sprintf("dx_hash -h 4 -s %s %s", seedStr, name))
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("dx_hash %q: unexpected output %q", name, out)
		}
		want, _ := strconv.ParseUint(m[1], 16, 32)
		if got := dirHash([]byte(name), hashSeedWords(seed)); got != uint32(want) {
			t.Errorf("dirHash(%q) = %#x, debugfs says %#x", name, got, want)
		}
	}
}

func bigDir(n int, name func(i int) string) *Node {
	d := dir(map[string]*Node{})
	for i := 0; i < n; i++ {
		d.Children[name(i)] = &Node{Mode: ModeRegular | 0o644, Mtime: Nanos(testTime)}
	}
	return d
}

// TestLargeDirectoryHtree builds a 25,000-entry directory (one-level
// htree) and one that needs an index level (dx_node blocks), and checks
// that the kernel finds every name through the index.
func TestLargeDirectoryHtree(t *testing.T) {
	im := newImage(t, testOptions())
	flat := bigDir(25000, func(i int) string { return fmt.Sprintf("file-%06d.txt", i) })
	// 200-byte names: about 19 per leaf, so 12,000 need more than the
	// 507 leaves a dx_root can address.
	twoLevel := bigDir(12000, func(i int) string { return fmt.Sprintf("%05d-%s", i, strings.Repeat("z", 194)) })
	sub := dir(map[string]*Node{})
	for i := 0; i < 3000; i++ {
		sub.Children[fmt.Sprintf("d%04d", i)] = dir(nil)
	}
	im.finish(dir(map[string]*Node{"flat": flat, "two": twoLevel, "subdirs": sub}))
	imagetest.Fsck(t, im.path)

	h := debugfs(t, im.path, "htree /flat")
	if !strings.Contains(h, "Indirect levels: 0") || !strings.Contains(h, "Number of entries (limit): 507") {
		t.Errorf("htree /flat is not a one-level htree:\n%.400s", h)
	}
	h = debugfs(t, im.path, "htree /two")
	if !strings.Contains(h, "Indirect levels: 1") {
		t.Errorf("htree /two is not a two-level htree:\n%.400s", h)
	}
	if st := debugfs(t, im.path, "stat /flat"); !strings.Contains(st, "Flags: 0x81000") {
		t.Errorf("/flat lacks the index flag:\n%.300s", st)
	}

	mnt := imagetest.Mount(t, im.path)
	for _, d := range []string{"flat", "two", "subdirs"} {
		n := 0
		for name := range map[string]*Node{"flat": flat, "two": twoLevel, "subdirs": sub}[d].Children {
			var st syscall.Stat_t
			if err := syscall.Lstat(filepath.Join(mnt, d, name), &st); err != nil {
				t.Fatalf("lookup %s/%s: %v", d, name, err)
			}
			n++
		}
		ents, err := os.ReadDir(filepath.Join(mnt, d))
		if err != nil || len(ents) != n {
			t.Errorf("readdir %s: %d entries, %v; want %d", d, len(ents), err, n)
		}
	}
	fi, err := os.Stat(filepath.Join(mnt, "subdirs"))
	if err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 3002 {
		t.Errorf("subdirs: %v links, %v; want 3002", fi.Sys().(*syscall.Stat_t).Nlink, err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "flat", "file-025000.txt")); !os.IsNotExist(err) {
		t.Errorf("lookup of a missing name: %v, want not-exist", err)
	}
}
