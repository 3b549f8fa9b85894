package imagetest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// Info is what a snapshot records of one path.
type Info struct {
	// Type is "dir", "file", "symlink", "fifo", "char", "block" or "socket".
	Type string
	// Perm holds the permission, setuid, setgid and sticky bits.
	Perm     uint32
	UID, GID uint32
	// Size and SHA256 describe a regular file's content.
	Size   int64
	SHA256 string
	// Target is a symlink's target.
	Target             string
	DevMajor, DevMinor uint32
	// Xattrs holds the extended attributes but security.selinux.
	Xattrs map[string]string
	// Group is the smallest path sharing this inode, "" for an inode with a
	// single path.
	Group string
	Mtime time.Time
}

// Snapshot maps paths relative to the root ("." for the root) to what they
// hold.
type Snapshot map[string]Info

// SnapshotDir records the tree under root without following symlinks.
func SnapshotDir(root string) (Snapshot, error) {
	s := make(Snapshot)
	type inode struct{ dev, ino uint64 }
	groups := make(map[inode][]string)
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		info := Info{
			Perm:  st.Mode & 0o7777,
			UID:   st.Uid,
			GID:   st.Gid,
			Mtime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(),
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			info.Type = "dir"
		case unix.S_IFREG:
			info.Type = "file"
			info.Size = st.Size
			if info.SHA256, err = hashFile(p); err != nil {
				return err
			}
		case unix.S_IFLNK:
			info.Type = "symlink"
			if info.Target, err = os.Readlink(p); err != nil {
				return err
			}
		case unix.S_IFIFO:
			info.Type = "fifo"
		case unix.S_IFCHR, unix.S_IFBLK:
			info.Type = "char"
			if st.Mode&unix.S_IFMT == unix.S_IFBLK {
				info.Type = "block"
			}
			info.DevMajor, info.DevMinor = unix.Major(st.Rdev), unix.Minor(st.Rdev)
		case unix.S_IFSOCK:
			info.Type = "socket"
		}
		if info.Xattrs, err = listXattrs(p); err != nil {
			return err
		}
		if info.Type != "dir" && st.Nlink > 1 {
			k := inode{st.Dev, st.Ino}
			groups[k] = append(groups[k], rel)
		}
		s[rel] = info
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", root, err)
	}
	for _, paths := range groups {
		s.SetGroup(paths)
	}
	return s, nil
}

// SetGroup records paths as one hard-link group: each names the smallest
// of them as its Group. A single path is no group and is left alone.
func (s Snapshot) SetGroup(paths []string) {
	if len(paths) < 2 {
		return
	}
	sort.Strings(paths)
	for _, p := range paths {
		i := s[p]
		i.Group = paths[0]
		s[p] = i
	}
}

func hashFile(p string) (string, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// FileSHA256 returns the hex SHA-256 of the regular file at p (an image,
// an artifact, a cached blob), failing the test when it cannot be read.
func FileSHA256(t testing.TB, p string) string {
	t.Helper()
	sum, err := hashFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// listXattrs reads p's extended attributes, leaving out security.selinux
// (layers drop it).
func listXattrs(p string) (map[string]string, error) {
	m, err := images.ReadXattrs(p)
	delete(m, "security.selinux")
	return m, err
}

// DiffOptions tune Diff.
type DiffOptions struct {
	// Exclude drops a path (and nothing else) from the comparison.
	Exclude func(path string) bool
	// IgnoreMtime skips the mtime comparison of a path.
	IgnoreMtime func(path string) bool
}

// Diff lists, one readable line each, how got differs from want.
func Diff(want, got Snapshot, opts DiffOptions) []string {
	keys := make(map[string]bool)
	for k := range want {
		keys[k] = true
	}
	for k := range got {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		if opts.Exclude == nil || !opts.Exclude(k) {
			sorted = append(sorted, k)
		}
	}
	sort.Strings(sorted)
	var out []string
	for _, p := range sorted {
		w, inW := want[p]
		g, inG := got[p]
		switch {
		case !inG:
			out = append(out, fmt.Sprintf("%q: missing (want %s)", p, w))
			continue
		case !inW:
			out = append(out, fmt.Sprintf("%q: unexpected %s", p, g))
			continue
		}
		add := func(field string, wv, gv any) {
			out = append(out, fmt.Sprintf("%q: %s = %v, want %v", p, field, gv, wv))
		}
		if w.Type != g.Type {
			add("type", w.Type, g.Type)
			continue
		}
		if w.Perm != g.Perm {
			add("perm", fmt.Sprintf("%#o", w.Perm), fmt.Sprintf("%#o", g.Perm))
		}
		if w.UID != g.UID || w.GID != g.GID {
			add("owner", fmt.Sprintf("%d:%d", w.UID, w.GID), fmt.Sprintf("%d:%d", g.UID, g.GID))
		}
		if w.Size != g.Size {
			add("size", w.Size, g.Size)
		}
		if w.SHA256 != g.SHA256 {
			add("sha256", w.SHA256, g.SHA256)
		}
		if w.Target != g.Target {
			add("target", fmt.Sprintf("%q", w.Target), fmt.Sprintf("%q", g.Target))
		}
		if w.DevMajor != g.DevMajor || w.DevMinor != g.DevMinor {
			add("device", fmt.Sprintf("%d:%d", w.DevMajor, w.DevMinor), fmt.Sprintf("%d:%d", g.DevMajor, g.DevMinor))
		}
		if fx, gx := formatXattrs(w.Xattrs), formatXattrs(g.Xattrs); fx != gx {
			add("xattrs", fx, gx)
		}
		if w.Group != g.Group {
			add("hardlink group", fmt.Sprintf("%q", w.Group), fmt.Sprintf("%q", g.Group))
		}
		if (opts.IgnoreMtime == nil || !opts.IgnoreMtime(p)) && !w.Mtime.Equal(g.Mtime) {
			add("mtime", w.Mtime.Format(time.RFC3339Nano), g.Mtime.Format(time.RFC3339Nano))
		}
	}
	return out
}

// String describes an Info in one line.
func (i Info) String() string {
	s := fmt.Sprintf("%s %#o %d:%d", i.Type, i.Perm, i.UID, i.GID)
	switch i.Type {
	case "file":
		s += fmt.Sprintf(" size=%d sha256=%.12s", i.Size, i.SHA256)
	case "symlink":
		s += fmt.Sprintf(" -> %q", i.Target)
	case "char", "block":
		s += fmt.Sprintf(" %d:%d", i.DevMajor, i.DevMinor)
	}
	if len(i.Xattrs) > 0 {
		s += " xattrs=" + formatXattrs(i.Xattrs)
	}
	if i.Group != "" {
		s += fmt.Sprintf(" group=%q", i.Group)
	}
	return s
}

func formatXattrs(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, m[k])
	}
	return "{" + strings.Join(parts, " ") + "}"
}
