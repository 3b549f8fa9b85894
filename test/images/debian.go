package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Where and how DebianRootfs makes its tree.
const (
	// DebianCacheRoot holds the cached trees; it survives test runs.
	DebianCacheRoot = "/var/cache/cube-templatecenter-test"
	// DebianSuite is the release debootstrap installs.
	DebianSuite = "bookworm"
	// DebianMirror is the archive debootstrap downloads from (the one apt
	// uses on the project's machines).
	DebianMirror = "http://deb.debian.org/debian"
	// DebianRootfsDir is where DebianRootfs caches the minbase tree.
	DebianRootfsDir = DebianCacheRoot + "/debian-minbase-" + DebianSuite
)

// DebianRootfs returns a Debian bookworm minbase root filesystem made by
// `debootstrap --variant=minbase bookworm DIR http://deb.debian.org/debian`
// (about 30-60 s and 130 MB the first time), cached at DebianRootfsDir (see
// EnsureDebianRootfs). The tree must not be modified: copy it first. It
// skips the test unless run as root (debootstrap creates device nodes and
// chroots).
func DebianRootfs(tb testing.TB) string {
	tb.Helper()
	if fi, err := os.Stat(DebianRootfsDir); err == nil && fi.IsDir() {
		return DebianRootfsDir
	}
	if os.Geteuid() != 0 {
		tb.Skip("images: debootstrap needs root")
	}
	dir, err := EnsureDebianRootfs(context.Background(), tbWriter{tb})
	if err != nil {
		tb.Fatalf("images: %v", err)
	}
	return dir
}

// tbWriter sends progress lines to the test log.
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Logf("images: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// EnsureDebianRootfs returns DebianRootfsDir, making it first when it does
// not exist: the tree is built in a temporary directory beside the cache
// and renamed into place only when complete, under a lock file, so
// concurrent processes (tests, benchmarks) debootstrap once per machine.
// It installs debootstrap with apt-get when it is missing. Progress lines
// go to log. It needs root.
func EnsureDebianRootfs(ctx context.Context, log io.Writer) (string, error) {
	if fi, err := os.Stat(DebianRootfsDir); err == nil && fi.IsDir() {
		return DebianRootfsDir, nil
	}
	if os.Geteuid() != 0 {
		return "", errors.New("debootstrap: needs root")
	}
	if err := os.MkdirAll(DebianCacheRoot, 0o755); err != nil {
		return "", fmt.Errorf("debootstrap: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(DebianCacheRoot, ".debian-minbase-"+DebianSuite+".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", fmt.Errorf("debootstrap: open lock: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("debootstrap: lock: %w", err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	if fi, err := os.Stat(DebianRootfsDir); err == nil && fi.IsDir() {
		return DebianRootfsDir, nil // made by another process meanwhile
	}
	removeLeftovers(log)
	debootstrap, err := ensureDebootstrap(ctx, log)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(DebianCacheRoot, tmpPrefix())
	if err != nil {
		return "", fmt.Errorf("debootstrap: %w", err)
	}
	// MkdirTemp makes 0700; the tree's root becomes the image's root.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("debootstrap: %w", err)
	}
	fmt.Fprintf(log, "debootstrap --variant=minbase %s %s %s (once per machine, about a minute)\n", DebianSuite, tmp, DebianMirror)
	cmd := exec.CommandContext(ctx, debootstrap, "--variant=minbase", DebianSuite, tmp, DebianMirror)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		UnmountBelow(tmp)
		os.RemoveAll(tmp)
		return "", fmt.Errorf("debootstrap: %w\n%s", err, Tail(out, 4096))
	}
	if err := UnmountBelow(tmp); err != nil {
		return "", fmt.Errorf("debootstrap left mounts behind: %w", err)
	}
	if err := os.Rename(tmp, DebianRootfsDir); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("debootstrap: publish tree: %w", err)
	}
	return DebianRootfsDir, nil
}

func tmpPrefix() string { return ".debian-minbase-" + DebianSuite + ".tmp-" }

// ensureDebootstrap finds debootstrap, installing it with apt-get if
// needed.
func ensureDebootstrap(ctx context.Context, log io.Writer) (string, error) {
	if p, err := exec.LookPath("debootstrap"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/debootstrap"); err == nil {
		return "/usr/sbin/debootstrap", nil
	}
	fmt.Fprintln(log, "installing debootstrap with apt-get")
	cmd := exec.CommandContext(ctx, "sh", "-c", "apt-get update -qq && apt-get install -y -qq --no-install-recommends debootstrap debian-archive-keyring gpgv")
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get install debootstrap: %w\n%s", err, Tail(out, 4096))
	}
	return "/usr/sbin/debootstrap", nil
}

// removeLeftovers deletes temporary trees of interrupted runs (the caller
// holds the lock, so none is in use), unmounting what debootstrap left
// mounted in them first; a tree that stays mounted is left alone.
func removeLeftovers(log io.Writer) {
	old, _ := filepath.Glob(filepath.Join(DebianCacheRoot, tmpPrefix()+"*"))
	for _, dir := range old {
		if err := UnmountBelow(dir); err != nil {
			fmt.Fprintf(log, "keeping %s: %v\n", dir, err)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintf(log, "remove %s: %v\n", dir, err)
		}
	}
}

// UnmountBelow unmounts every mount point at or below dir, deepest first.
func UnmountBelow(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMount(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if err := unix.Unmount(p, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
	return nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Tail returns at most the last n bytes of b, for quoting command output.
func Tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// DebianImage returns DebianRootfs as a three-layer OCI image (see
// TreeImage: usr/, then etc/ and var/, then the rest), gzip layers, with
// an Entrypoint and Cmd that print /etc/os-release, created 2024-06-01. Building it takes a
// few seconds (tar and gzip of about 130 MB); the image is deterministic
// for a given tree.
func DebianImage(tb testing.TB) v1.Image {
	tb.Helper()
	return TreeImage(tb, DebianRootfs(tb), Config{
		Config: v1.Config{
			Entrypoint: []string{"/bin/sh", "-c"},
			Cmd:        []string{"cat /etc/os-release"},
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			WorkingDir: "/",
		},
		Created: time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC),
	}, Gzip)
}

// TreeLayerOf assigns a path of a tree (relative, slash-separated, "." for
// the root) to one of TreeImage's three layers: 0 for usr/, 1 for etc/
// and var/, 2 for everything else.
func TreeLayerOf(rel string) int {
	top, _, _ := strings.Cut(rel, "/")
	switch top {
	case "usr":
		return 0
	case "etc", "var":
		return 1
	default:
		return 2
	}
}

// TreeImage packs the directory tree at dir into an image of three layers
// (see Tree) encoded with c: every path with its type, mode (setuid,
// setgid and sticky included), uid, gid, nanosecond mtime, xattrs, device
// numbers, symlink target and content, the root directory as "./" in the
// top layer. Sockets are refused (tar cannot hold them).
func TreeImage(tb testing.TB, dir string, cfg Config, c Compression) v1.Image {
	tb.Helper()
	tars, err := treeTars(dir)
	if err != nil {
		tb.Fatalf("images: pack %s: %v", dir, err)
	}
	layers := make([]v1.Layer, len(tars))
	errs := make([]error, len(tars))
	var wg sync.WaitGroup
	for i, t := range tars {
		wg.Add(1)
		go func() {
			defer wg.Done()
			blob, err := c.Encode(t)
			if err != nil {
				errs[i] = err
				return
			}
			layers[i] = newBlobLayer(blob, t, c)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatalf("images: encode layers of %s: %v", dir, err)
	}
	return assemble(tb, cfg, layers)
}

// TreeLayers is the number of layers TreeImage and Tree split a tree into.
const TreeLayers = 3

// Tree is a directory tree as TreeImage packs it: every path with its
// stat, assigned to one of TreeLayers layers (TreeLayerOf), the paths
// sharing an inode all in the layer of the first one in walk order, where
// the later ones become hard links to it, so hard links never cross
// layers.
type Tree struct {
	entries []treeEntry
}

// treeEntry is one path of the tree being packed.
type treeEntry struct {
	rel   string
	abs   string
	st    unix.Stat_t
	layer int
	link  string // an earlier path of the same inode, in the same layer
}

// ScanTree walks dir once, without following symlinks, and plans its
// layers.
func ScanTree(ctx context.Context, dir string) (*Tree, error) {
	type inode struct{ dev, ino uint64 }
	type group struct {
		layer int
		first string
	}
	groups := make(map[inode]group)
	t := &Tree{}
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		e := treeEntry{rel: filepath.ToSlash(rel), abs: p}
		if err := unix.Lstat(p, &e.st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		e.layer = TreeLayerOf(e.rel)
		if e.st.Mode&unix.S_IFMT != unix.S_IFDIR && e.st.Nlink > 1 {
			k := inode{e.st.Dev, e.st.Ino}
			if g, ok := groups[k]; ok {
				e.layer, e.link = g.layer, g.first
			} else {
				groups[k] = group{e.layer, e.rel}
			}
		}
		t.entries = append(t.entries, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", dir, err)
	}
	return t, nil
}

// WriteLayer packs the entries of one layer (0 to TreeLayers-1) into tw
// with WriteTreeEntry, in walk order; it does not close tw.
func (t *Tree) WriteLayer(tw TarWriter, layer int) error {
	for _, e := range t.entries {
		if e.layer != layer {
			continue
		}
		if err := WriteTreeEntry(tw, e.rel, e.abs, &e.st, e.link); err != nil {
			return err
		}
	}
	return nil
}

// treeTars walks dir once and writes the layer tar streams.
func treeTars(dir string) ([][]byte, error) {
	t, err := ScanTree(context.Background(), dir)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, TreeLayers)
	for layer := range out {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if err := t.WriteLayer(tw, layer); err != nil {
			return nil, err
		}
		if err := tw.Close(); err != nil {
			return nil, fmt.Errorf("close layer %d: %w", layer, err)
		}
		out[layer] = buf.Bytes()
	}
	return out, nil
}

// TarWriter is what WriteTreeEntry writes to: a *tar.Writer, or a wrapper
// of one.
type TarWriter interface {
	io.Writer
	WriteHeader(hdr *tar.Header) error
}

// WriteTreeEntry packs the file at abs (stat'ed as st, without following
// a symlink) as the entry rel, keeping its type, mode, owner, nanosecond
// mtime, device numbers and xattrs; link, when set, makes it a hard link
// to that earlier path of the same layer.
func WriteTreeEntry(tw TarWriter, rel, abs string, st *unix.Stat_t, link string) error {
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:  tar.FormatPAX,
	}
	switch {
	case link != "":
		hdr.Typeflag, hdr.Linkname = tar.TypeLink, link
	default:
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
			if rel == "." {
				hdr.Name = "./"
			}
		case unix.S_IFREG:
			hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
		case unix.S_IFLNK:
			target, err := os.Readlink(abs)
			if err != nil {
				return fmt.Errorf("readlink %s: %w", abs, err)
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case unix.S_IFCHR, unix.S_IFBLK:
			hdr.Typeflag = tar.TypeChar
			if st.Mode&unix.S_IFMT == unix.S_IFBLK {
				hdr.Typeflag = tar.TypeBlock
			}
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case unix.S_IFIFO:
			hdr.Typeflag = tar.TypeFifo
		default:
			return fmt.Errorf("%s: cannot pack file type %#o", abs, st.Mode&unix.S_IFMT)
		}
	}
	xattrs, err := ReadXattrs(abs)
	if err != nil {
		return err
	}
	if len(xattrs) > 0 {
		hdr.PAXRecords = make(map[string]string, len(xattrs))
		for k, v := range xattrs {
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write header %s: %w", rel, err)
	}
	if hdr.Typeflag != tar.TypeReg || hdr.Size == 0 {
		return nil
	}
	f, err := os.OpenFile(abs, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", abs, err)
	}
	defer f.Close()
	if n, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("pack %s: %w", abs, err)
	} else if n != hdr.Size {
		return fmt.Errorf("pack %s: file changed size while read", abs)
	}
	return nil
}

// ReadXattrs returns the extended attributes of p, without following a
// symlink (nil when it has none or the filesystem keeps none).
func ReadXattrs(p string) (map[string]string, error) {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("listxattr %s: %w", p, err)
	}
	var m map[string]string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		val := make([]byte, 64<<10)
		vn, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			return nil, fmt.Errorf("getxattr %s %s: %w", p, name, err)
		}
		if m == nil {
			m = make(map[string]string)
		}
		m[name] = string(val[:vn])
	}
	return m, nil
}
