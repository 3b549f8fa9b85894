package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// treeEntryInfo is what two images must agree on for a path: everything
// but timestamps (upstream stamps injected files with the build time) and
// directory sizes (a layout choice).
type treeEntryInfo struct {
	Type   uint32
	Perm   uint32
	UID    uint32
	GID    uint32
	Nlink  uint64
	Size   int64
	Rdev   uint64
	Target string
	SHA256 string
	Xattrs string
}

// treeSummary describes a compared tree.
type treeSummary struct {
	Entries int
	Bytes   int64
}

// compareImages mounts both ext4 images read-only (loop) and compares
// their trees path by path. It returns the summary of a, and the
// differences (at most 20), empty when the trees agree.
func compareImages(ctx context.Context, a, b, scratch string) (treeSummary, []string, error) {
	ta, sum, err := mountedTree(ctx, a, filepath.Join(scratch, "mnt-a"))
	if err != nil {
		return sum, nil, err
	}
	tb, _, err := mountedTree(ctx, b, filepath.Join(scratch, "mnt-b"))
	if err != nil {
		return sum, nil, err
	}
	return sum, diffTrees(ta, tb, 20), nil
}

// diffTrees lists paths whose entries differ or exist on one side only.
func diffTrees(a, b map[string]treeEntryInfo, limit int) []string {
	var diffs []string
	paths := make([]string, 0, len(a)+len(b))
	for p := range a {
		paths = append(paths, p)
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		ea, oka := a[p]
		eb, okb := b[p]
		switch {
		case !oka:
			diffs = append(diffs, "only in the second: "+p)
		case !okb:
			diffs = append(diffs, "only in the first: "+p)
		case ea != eb:
			diffs = append(diffs, fmt.Sprintf("%s: %+v vs %+v", p, ea, eb))
		}
		if len(diffs) >= limit {
			diffs = append(diffs, "...")
			break
		}
	}
	return diffs
}

// mountedTree mounts img on dir read-only, reads its tree and unmounts.
func mountedTree(ctx context.Context, img, dir string) (map[string]treeEntryInfo, treeSummary, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, treeSummary{}, fmt.Errorf("mount %s: %w", img, err)
	}
	if out, err := exec.CommandContext(ctx, "mount", "-o", "loop,ro", img, dir).CombinedOutput(); err != nil {
		return nil, treeSummary{}, fmt.Errorf("mount %s: %w: %s", img, err, out)
	}
	tree, sum, err := readTree(dir)
	if uerr := unix.Unmount(dir, 0); uerr != nil && err == nil {
		err = fmt.Errorf("unmount %s: %w", dir, uerr)
	}
	return tree, sum, err
}

// readTree describes every path below root (lost+found's content
// excluded).
func readTree(root string) (map[string]treeEntryInfo, treeSummary, error) {
	tree := map[string]treeEntryInfo{}
	var sum treeSummary
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		e := treeEntryInfo{Type: st.Mode & unix.S_IFMT, Perm: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid, Nlink: uint64(st.Nlink)}
		switch e.Type {
		case unix.S_IFREG:
			e.Size = st.Size
			h, err := hashPath(p)
			if err != nil {
				return err
			}
			e.SHA256 = h
			sum.Bytes += st.Size
		case unix.S_IFLNK:
			if e.Target, err = os.Readlink(p); err != nil {
				return fmt.Errorf("readlink %s: %w", p, err)
			}
		case unix.S_IFCHR, unix.S_IFBLK:
			e.Rdev = st.Rdev
		}
		x, err := images.ReadXattrs(p)
		if err != nil {
			return err
		}
		var kv []string
		for k, v := range x {
			kv = append(kv, k+"="+hex.EncodeToString([]byte(v)))
		}
		sort.Strings(kv)
		e.Xattrs = strings.Join(kv, ",")
		tree[rel] = e
		sum.Entries++
		if rel == "lost+found" && d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, sum, fmt.Errorf("read tree %s: %w", root, err)
	}
	return tree, sum, nil
}

func hashPath(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
