package flatten

import "github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"

// Stats counts what a Tree holds.
type Stats struct {
	// Inodes is the number of distinct inodes, the root included.
	Inodes int
	// Dirs, Files, Symlinks, Devices (char and block), FIFOs and Sockets
	// count distinct inodes by type.
	Dirs, Files, Symlinks, Devices, FIFOs, Sockets int
	// HardLinks counts directory entries beyond the first of an inode.
	HardLinks int
	// Bytes is the apparent size of all distinct regular files.
	Bytes int64
	// Entries and Whiteouts count the tar entries and whiteout markers
	// applied since the Tree was created.
	Entries, Whiteouts int64
}

// Stats walks the tree and counts its content.
func (t *Tree) Stats() Stats {
	s := Stats{Entries: t.entries, Whiteouts: t.whiteouts}
	seen := make(map[*ext4.Node]bool)
	var walk func(n *ext4.Node)
	walk = func(n *ext4.Node) {
		if seen[n] {
			s.HardLinks++
			return
		}
		seen[n] = true
		s.Inodes++
		switch n.Mode & ext4.ModeTypeMask {
		case ext4.ModeDir:
			s.Dirs++
			for _, c := range n.Children {
				walk(c)
			}
		case ext4.ModeRegular:
			s.Files++
			s.Bytes += n.Size
		case ext4.ModeSymlink:
			s.Symlinks++
		case ext4.ModeChar, ext4.ModeBlock:
			s.Devices++
		case ext4.ModeFIFO:
			s.FIFOs++
		case ext4.ModeSocket:
			s.Sockets++
		}
	}
	walk(t.root)
	return s
}
