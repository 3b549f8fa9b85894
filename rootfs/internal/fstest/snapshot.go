package fstest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// SnapshotTree records an in-memory inode tree; open reads file data (a
// flatten.DataStore's OpenData).
func SnapshotTree(root *ext4.Node, open func(ext4.Data, int64) io.Reader) (imagetest.Snapshot, error) {
	s := make(imagetest.Snapshot)
	paths := make(map[*ext4.Node][]string)
	var walk func(p string, n *ext4.Node) error
	walk = func(p string, n *ext4.Node) error {
		info := imagetest.Info{
			Perm:  n.Mode & 0o7777,
			UID:   n.UID,
			GID:   n.GID,
			Mtime: nodeTime(n.Mtime),
		}
		for _, x := range n.Xattrs() {
			if x.Name == "security.selinux" {
				continue
			}
			if info.Xattrs == nil {
				info.Xattrs = make(map[string]string)
			}
			info.Xattrs[x.Name] = string(x.Value)
		}
		switch n.Mode & ext4.ModeTypeMask {
		case ext4.ModeDir:
			info.Type = "dir"
		case ext4.ModeRegular:
			info.Type = "file"
			info.Size = n.Size
			if done := paths[n]; len(done) > 0 {
				info.SHA256 = s[done[0]].SHA256
			} else {
				h := sha256.New()
				got, err := io.Copy(h, io.LimitReader(open(n.Data, n.Size), n.Size))
				if err != nil {
					return fmt.Errorf("read %s: %w", p, err)
				}
				if got != n.Size {
					return fmt.Errorf("read %s: got %d bytes, want %d", p, got, n.Size)
				}
				info.SHA256 = hex.EncodeToString(h.Sum(nil))
			}
		case ext4.ModeSymlink:
			info.Type = "symlink"
			info.Target = string(n.LinkTarget())
		case ext4.ModeFIFO:
			info.Type = "fifo"
		case ext4.ModeChar:
			info.Type = "char"
			info.DevMajor, info.DevMinor = n.Device()
		case ext4.ModeBlock:
			info.Type = "block"
			info.DevMajor, info.DevMinor = n.Device()
		case ext4.ModeSocket:
			info.Type = "socket"
		default:
			return fmt.Errorf("%s: unknown mode %#o", p, n.Mode)
		}
		s[p] = info
		if info.Type != "dir" {
			paths[n] = append(paths[n], p)
			return nil
		}
		for name, c := range n.Children {
			cp := name
			if p != "." {
				cp = p + "/" + name
			}
			if err := walk(cp, c); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(".", root); err != nil {
		return nil, fmt.Errorf("snapshot tree: %w", err)
	}
	for _, ps := range paths {
		s.SetGroup(ps)
	}
	return s, nil
}

// nodeTime turns a Node time back into a time.Time, 0 into the zero Time.
func nodeTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}
