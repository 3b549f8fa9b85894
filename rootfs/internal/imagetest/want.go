package imagetest

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"time"
)

// PathInfo is the expected state of one path, for Expect.
type PathInfo struct {
	Path string
	Info Info
}

// Expect gathers expectations into a Snapshot. A zero Mtime means "any".
func Expect(items ...PathInfo) Snapshot {
	s := make(Snapshot, len(items))
	for _, it := range items {
		s[it.Path] = it.Info
	}
	return s
}

// Check compares got with an expectation built by Expect: every path must
// match, mtimes only where the expectation sets one, and the root only if
// the expectation lists it.
func Check(want, got Snapshot) []string { return Diff(want, got, CheckOptions(want)) }

// CheckOptions are Check's options for want, to adjust (SkipLostFound).
func CheckOptions(want Snapshot) DiffOptions {
	_, root := want["."]
	return DiffOptions{
		Exclude:     func(p string) bool { return p == "." && !root },
		IgnoreMtime: func(p string) bool { return want[p].Mtime.IsZero() },
	}
}

// LostFound is the directory an ext4 image has at its root that no layer
// declares and umoci does not make.
const LostFound = "lost+found"

// SkipLostFound returns o also excluding LostFound: for comparing a mounted
// ext4 image with an expectation or a reference.
func (o DiffOptions) SkipLostFound() DiffOptions {
	exclude := o.Exclude
	o.Exclude = func(p string) bool { return p == LostFound || (exclude != nil && exclude(p)) }
	return o
}

// WDir expects a root-owned directory.
func WDir(p string, perm uint32) PathInfo {
	return PathInfo{p, Info{Type: "dir", Perm: perm}}
}

// WFile expects a root-owned regular file holding content.
func WFile(p string, perm uint32, content string) PathInfo {
	sum := sha256.Sum256([]byte(content))
	return PathInfo{p, Info{Type: "file", Perm: perm, Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:])}}
}

// WFileOf expects a root-owned regular file holding the content of e.
func WFileOf(p string, perm uint32, e Entry) PathInfo {
	h := sha256.New()
	n, _ := io.Copy(h, e.Content())
	return PathInfo{p, Info{Type: "file", Perm: perm, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}}
}

// WSymlink expects a root-owned symlink (mode 0777) to target.
func WSymlink(p, target string) PathInfo {
	return PathInfo{p, Info{Type: "symlink", Perm: 0o777, Target: target}}
}

// WFifo expects a root-owned named pipe.
func WFifo(p string, perm uint32) PathInfo {
	return PathInfo{p, Info{Type: "fifo", Perm: perm}}
}

// WChar expects a root-owned character device.
func WChar(p string, perm, major, minor uint32) PathInfo {
	return PathInfo{p, Info{Type: "char", Perm: perm, DevMajor: major, DevMinor: minor}}
}

// WBlock expects a root-owned block device.
func WBlock(p string, perm, major, minor uint32) PathInfo {
	return PathInfo{p, Info{Type: "block", Perm: perm, DevMajor: major, DevMinor: minor}}
}

// Owner returns w owned by uid:gid.
func (w PathInfo) Owner(uid, gid uint32) PathInfo { w.Info.UID, w.Info.GID = uid, gid; return w }

// Linked returns w sharing its inode with the other paths of group (named
// by its smallest path).
func (w PathInfo) Linked(group string) PathInfo { w.Info.Group = group; return w }

// WithXattr returns w with one more expected extended attribute.
func (w PathInfo) WithXattr(name, value string) PathInfo {
	m := make(map[string]string, len(w.Info.Xattrs)+1)
	for k, v := range w.Info.Xattrs {
		m[k] = v
	}
	m[name] = value
	w.Info.Xattrs = m
	return w
}

// At returns w with an expected mtime.
func (w PathInfo) At(t time.Time) PathInfo { w.Info.Mtime = t; return w }
