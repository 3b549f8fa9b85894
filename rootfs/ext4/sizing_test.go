package ext4

import (
	"fmt"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// TestSizing checks the size rule: blocks in use plus
// max(HeadroomPercent%, HeadroomMinBlocks), rounded up to 2 MiB, and
// inodes in use plus HeadroomInodes.
func TestSizing(t *testing.T) {
	cases := []struct {
		name    string
		data    int // bytes of file data
		pct     uint32
		min     uint64
		inodes  uint32
		journal uint32
	}{
		{"Small", 100 << 10, 10, 256, 64, 0},
		{"PercentWins", 150 << 20, 20, 256, 100, 4096},
		{"MinimumWins", 10 << 20, 1, 50000, 10, 0},
		{"NoHeadroom", 5 << 20, 0, 0, 0, 0},
		{"InodesNeedGroups", 1 << 20, 10, 256, 70000, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := testOptions()
			o.HeadroomPercent, o.HeadroomMinBlocks, o.HeadroomInodes, o.JournalBlocks = c.pct, c.min, c.inodes, c.journal
			im := newImage(t, o)
			root := dir(map[string]*Node{})
			for i := 0; i*(1<<20) < c.data; i++ {
				root.Children[fmt.Sprintf("f%d", i)] = im.file(0o644, randBytes(uint64(i), min(1<<20, c.data-i*(1<<20))))
			}
			st := im.finish(root)
			imagetest.Fsck(t, im.path)
			used := st.BlocksTotal - st.BlocksFree
			want := used + max(used*uint64(c.pct)/100, c.min)
			want = (want + sizeAlign - 1) / sizeAlign * sizeAlign
			groups := (st.BlocksTotal + blocksPerGroup - 1) / blocksPerGroup
			if c.name == "InodesNeedGroups" {
				// Three groups for 70,000+ inodes; the last one holds
				// at least its superblock backup.
				if groups != 3 || st.BlocksTotal < want {
					t.Errorf("%d blocks in %d groups, want 3 groups and at least %d blocks", st.BlocksTotal, groups, want)
				}
			} else if st.BlocksTotal != want {
				t.Errorf("%d blocks total with %d used, want %d", st.BlocksTotal, used, want)
			}
			inodesUsed := st.InodesTotal - st.InodesFree
			perGroup := st.InodesTotal / uint32(groups)
			if st.InodesTotal < inodesUsed+c.inodes || st.InodesTotal >= inodesUsed+c.inodes+16*uint32(groups) || perGroup%16 != 0 {
				t.Errorf("%d inodes (%d per group, %d used), want about %d used + %d", st.InodesTotal, perGroup, inodesUsed, inodesUsed, c.inodes)
			}
		})
	}
}
