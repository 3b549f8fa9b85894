package ext4

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// tree is a test tree plus the content of each regular file.
type tree struct {
	root    *Node
	content map[*Node][]byte
}

func genericACL(entries ...[3]uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, uint16(e[0]))
		b = binary.LittleEndian.AppendUint16(b, uint16(e[1]))
		b = binary.LittleEndian.AppendUint32(b, e[2])
	}
	return b
}

const undefinedID = 0xFFFFFFFF

// capV2 is a VFS_CAP_REVISION_2 security.capability value (cap_net_raw+ep).
var capV2 = []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0}

// richTree builds a tree exercising every node kind the writer supports.
func richTree(im *image) *tree {
	tr := &tree{content: map[*Node][]byte{}}
	file := func(mode uint32, content []byte) *Node {
		n := im.file(mode, content)
		tr.content[n] = content
		return n
	}
	node := func(mode uint32) *Node {
		return &Node{Mode: mode, Atime: Nanos(testTime), Mtime: Nanos(testTime), Ctime: Nanos(testTime), Crtime: Nanos(testTime)}
	}
	holey := append(append(append(randBytes(1, 4096), make([]byte, 8192)...), randBytes(2, 4096)...), make([]byte, 100)...)

	regular := dir(map[string]*Node{
		"empty":       file(0o644, nil),
		"one":         file(0o644, []byte{'x'}),
		"block-minus": file(0o644, randBytes(3, 4095)),
		"block":       file(0o644, randBytes(4, 4096)),
		"block-plus":  file(0o644, randBytes(5, 4097)),
		"random-3m":   file(0o600, randBytes(6, 3<<20+17)),
		"holey":       file(0o644, holey),
		"zeros":       file(0o644, make([]byte, 1<<20)),
	})
	owned := file(0o640, []byte("owned"))
	owned.UID, owned.GID = 100000, 200000
	sticky := dir(nil)
	sticky.Mode = ModeDir | 0o1777
	modes := dir(map[string]*Node{
		"setuid":     file(0o4755, []byte("suid")),
		"setgid":     file(0o2755, []byte("sgid")),
		"none":       file(0, []byte("none")),
		"owned":      owned,
		"sticky-dir": sticky,
	})
	symlink := func(target string) *Node {
		n := node(ModeSymlink | 0o777)
		n.SetLinkTarget([]byte(target))
		return n
	}
	links := dir(map[string]*Node{
		"fast":     symlink("../regular/one"),
		"fast59":   symlink(strings.Repeat("f", 59)),
		"slow60":   symlink(strings.Repeat("s", 60)),
		"slow4095": symlink(strings.Repeat("abcdefg/", 512)[:4095]),
		"abs":      symlink("/etc/passwd"),
	})
	dev := func(mode, maj, mnr uint32) *Node {
		n := node(mode)
		n.SetDevice(maj, mnr)
		return n
	}
	devs := dir(map[string]*Node{
		"null": dev(ModeChar|0o666, 1, 3),
		"sda":  dev(ModeBlock|0o660, 8, 0),
		"big":  dev(ModeChar|0o600, 300, 70000),
		"fifo": node(ModeFIFO | 0o644),
		"sock": node(ModeSocket | 0o755),
	})
	shared := file(0o644, []byte("three links"))
	sharedLink := symlink("target-of-hardlinked-symlink")
	hard := dir(map[string]*Node{"a": shared, "b": shared, "c": shared, "l1": sharedLink, "l2": sharedLink})

	caps := file(0o755, []byte("#!/bin/true\n"))
	caps.SetXattrs([]Xattr{{Name: "security.capability", Value: capV2}})
	user := file(0o644, []byte("user"))
	user.SetXattrs([]Xattr{{Name: "user.b", Value: []byte("second")}, {Name: "user.a", Value: []byte("first")}, {Name: "trusted.t", Value: []byte{0, 1, 2}}, {Name: "user.empty", Value: nil}})
	aclDir := dir(nil)
	acl := genericACL([3]uint32{aclUserObj, 7, undefinedID}, [3]uint32{aclUser, 5, 1000}, [3]uint32{aclGroupObj, 5, undefinedID},
		[3]uint32{aclGroup, 4, 2000}, [3]uint32{aclMask, 5, undefinedID}, [3]uint32{aclOther, 4, undefinedID})
	aclDir.SetXattrs([]Xattr{{Name: "system.posix_acl_access", Value: acl}, {Name: "system.posix_acl_default", Value: acl}})
	bigVal := bytes.Repeat([]byte("0123456789abcdef"), 125)
	big := file(0o644, []byte("big xattr"))
	big.SetXattrs([]Xattr{{Name: "user.big", Value: bigVal}, {Name: "user.small", Value: []byte("s")}, {Name: "security.selinux", Value: []byte("system_u:object_r:bin_t:s0\x00")}})
	sh1 := file(0o644, []byte("shared 1"))
	sh2 := file(0o644, []byte("shared 2"))
	sh1.SetXattrs([]Xattr{{Name: "user.big", Value: bigVal}})
	sh2.SetXattrs([]Xattr{{Name: "user.big", Value: bigVal}})
	xattrs := dir(map[string]*Node{"caps": caps, "user": user, "acl-dir": aclDir, "big": big, "shared1": sh1, "shared2": sh2})

	names := dir(map[string]*Node{
		"\xff\xfe\x80-not-utf8":  file(0o644, []byte("binary name")),
		strings.Repeat("n", 255): file(0o644, []byte("long name")),
		"a b\nc":                 file(0o644, []byte("spaces")),
		"héllo-wörld":            file(0o644, []byte("unicode")),
	})
	deep := dir(nil)
	cur := deep
	for i := 0; i < 30; i++ {
		next := dir(nil)
		cur.Children = map[string]*Node{fmt.Sprintf("level%02d", i): next}
		cur = next
	}
	cur.Children = map[string]*Node{"bottom": file(0o644, []byte("deep"))}

	future := file(0o644, []byte("2040"))
	future.Mtime = Nanos(time.Date(2040, 2, 3, 4, 5, 6, 987654321, time.UTC))
	past := file(0o644, []byte("1960"))
	past.Mtime = Nanos(time.Date(1960, 1, 1, 0, 0, 0, 5, time.UTC))
	times := dir(map[string]*Node{"future": future, "past": past})

	tr.root = dir(map[string]*Node{
		"regular": regular, "modes": modes, "links": links, "dev": devs, "hard": hard,
		"xattr": xattrs, "names": names, "deep": deep, "times": times,
	})
	return tr
}

func TestRichTreeKernelView(t *testing.T) {
	im := newImage(t, testOptions())
	tr := richTree(im)
	im.finish(tr.root)
	imagetest.Fsck(t, im.path)
	mnt := imagetest.Mount(t, im.path)
	verifyMount(t, mnt, tr)
}

func TestRichTreeDebugfsView(t *testing.T) {
	im := newImage(t, testOptions())
	tr := richTree(im)
	im.finish(tr.root)
	imagetest.Fsck(t, im.path)

	// ls -p lines are /inode/mode/uid/gid/name/size/.
	out := debugfs(t, im.path, "ls -p /modes")
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "/")
		if len(f) < 7 || f[5] == "." || f[5] == ".." {
			continue
		}
		n := tr.root.Children["modes"].Children[f[5]]
		if n == nil {
			t.Errorf("debugfs lists unexpected %q", f[5])
			continue
		}
		seen[f[5]] = true
		mode, _ := strconv.ParseUint(f[2], 8, 32)
		uid, _ := strconv.ParseUint(f[3], 10, 32)
		gid, _ := strconv.ParseUint(f[4], 10, 32)
		if uint32(mode) != n.Mode || uint32(uid) != n.UID || uint32(gid) != n.GID {
			t.Errorf("debugfs %s: mode %o uid %d gid %d, want %o %d %d", f[5], mode, uid, gid, n.Mode, n.UID, n.GID)
		}
	}
	if len(seen) != len(tr.root.Children["modes"].Children) {
		t.Errorf("debugfs listed %d entries of /modes, want %d", len(seen), len(tr.root.Children["modes"].Children))
	}

	st := debugfs(t, im.path, "stat /dev/big")
	if !strings.Contains(st, "Type: character special") || !strings.Contains(st, "Device major/minor number: 300:70000") {
		t.Errorf("debugfs stat /dev/big:\n%s", st)
	}
	st = debugfs(t, im.path, "stat /times/future")
	if !strings.Contains(st, "mtime: 0x") || !strings.Contains(st, "2040") {
		t.Errorf("debugfs stat /times/future:\n%s", st)
	}
	ea := debugfs(t, im.path, "ea_get -x /xattr/caps security.capability")
	if !strings.Contains(ea, "01 00 00 02 00 20 00 00") {
		t.Errorf("debugfs ea_get security.capability: %q", ea)
	}
	ea = debugfs(t, im.path, "ea_list /xattr/shared1")
	if !strings.Contains(ea, "user.big (2000)") {
		t.Errorf("debugfs ea_list /xattr/shared1: %q", ea)
	}
	// The two identical external xattr blocks are one shared block.
	a := fileACL(t, debugfs(t, im.path, "stat /xattr/shared1"))
	b := fileACL(t, debugfs(t, im.path, "stat /xattr/shared2"))
	if a == "0" || a != b {
		t.Errorf("xattr blocks of shared1/shared2: %s and %s, want one shared non-zero block", a, b)
	}
}

func fileACL(t *testing.T, stat string) string {
	t.Helper()
	for _, l := range strings.Split(stat, "\n") {
		if strings.HasPrefix(l, "File ACL: ") {
			return strings.Fields(strings.TrimPrefix(l, "File ACL: "))[0]
		}
	}
	t.Fatalf("no File ACL line in:\n%s", stat)
	return ""
}

// verifyMount checks that what the kernel shows under mnt is the tree.
func verifyMount(t *testing.T, mnt string, tr *tree) {
	t.Helper()
	inodes := map[*Node]uint64{}
	links := map[*Node]uint64{}
	var walk func(path string, n *Node)
	walk = func(path string, n *Node) {
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			t.Errorf("lstat %q: %v", path, err)
			return
		}
		links[n]++
		if ino, ok := inodes[n]; ok && ino != st.Ino {
			t.Errorf("%q: inode %d, want %d (hard link)", path, st.Ino, ino)
		}
		inodes[n] = st.Ino
		if st.Mode != n.Mode {
			t.Errorf("%q: mode %o, want %o", path, st.Mode, n.Mode)
		}
		if st.Uid != n.UID || st.Gid != n.GID {
			t.Errorf("%q: owner %d:%d, want %d:%d", path, st.Uid, st.Gid, n.UID, n.GID)
		}
		if got := time.Unix(st.Mtim.Sec, st.Mtim.Nsec); got.UnixNano() != n.Mtime {
			t.Errorf("%q: mtime %v, want %v", path, got, time.Unix(0, n.Mtime))
		}
		if got := time.Unix(st.Ctim.Sec, st.Ctim.Nsec); n.Ctime != 0 && got.UnixNano() != n.Ctime {
			t.Errorf("%q: ctime %v, want %v", path, got, time.Unix(0, n.Ctime))
		}
		verifyXattrs(t, path, n)
		switch n.Mode & ModeTypeMask {
		case ModeRegular:
			want := tr.content[n]
			got, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("read %q: %v", path, err)
			} else if sha(got) != sha(want) {
				t.Errorf("%q: content sha256 %s (%d bytes), want %s (%d bytes)", path, sha(got), len(got), sha(want), len(want))
			}
			if wantBlocks := int64(n.Data.Blocks()) * 8; st.Blocks < wantBlocks || st.Blocks > wantBlocks+8+8 {
				t.Errorf("%q: %d sectors allocated, want about %d", path, st.Blocks, wantBlocks)
			}
		case ModeSymlink:
			got, err := os.Readlink(path)
			if err != nil || got != string(n.LinkTarget()) {
				t.Errorf("readlink %q = %q, %v; want %q", path, got, err, n.LinkTarget())
			}
		case ModeChar, ModeBlock:
			maj := uint32((st.Rdev>>8)&0xfff | (st.Rdev>>32)&^0xfff)
			mnr := uint32(st.Rdev&0xff | (st.Rdev>>12)&^0xff)
			if wmaj, wmnr := n.Device(); maj != wmaj || mnr != wmnr {
				t.Errorf("%q: device %d:%d, want %d:%d", path, maj, mnr, wmaj, wmnr)
			}
		case ModeDir:
			ents, err := os.ReadDir(path)
			if err != nil {
				t.Errorf("readdir %q: %v", path, err)
				return
			}
			var got, want []string
			subdirs := 0
			for _, e := range ents {
				got = append(got, e.Name())
			}
			for name, c := range n.Children {
				want = append(want, name)
				if c.Mode&ModeTypeMask == ModeDir {
					subdirs++
				}
			}
			if path == mnt {
				want = append(want, "lost+found")
				subdirs++
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("readdir %q: %q, want %q", path, got, want)
			}
			if st.Nlink != uint64(2+subdirs) {
				t.Errorf("%q: %d links, want %d", path, st.Nlink, 2+subdirs)
			}
			for name, c := range n.Children {
				walk(filepath.Join(path, name), c)
			}
		}
	}
	walk(mnt, tr.root)
	for n, ino := range inodes {
		if n.Mode&ModeTypeMask == ModeDir {
			continue
		}
		var st syscall.Stat_t
		for p := range findPaths(mnt, ino) {
			if err := syscall.Lstat(p, &st); err == nil && st.Nlink != links[n] {
				t.Errorf("%q: %d links, want %d", p, st.Nlink, links[n])
			}
			break
		}
	}
	fi, err := os.Stat(filepath.Join(mnt, "lost+found"))
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("lost+found: %v, %v", fi, err)
	}
}

// findPaths yields one path of inode ino under root.
func findPaths(root string, ino uint64) map[string]bool {
	out := map[string]bool{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && len(out) == 0 {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Ino == ino {
				out[p] = true
				return filepath.SkipAll
			}
		}
		return nil
	})
	return out
}

func verifyXattrs(t *testing.T, path string, n *Node) {
	t.Helper()
	buf := make([]byte, 64<<10)
	sz, err := syscall.Listxattr(path, buf)
	if err != nil {
		if n.Mode&ModeTypeMask == ModeSymlink && len(n.Xattrs()) == 0 {
			return
		}
		t.Errorf("listxattr %q: %v", path, err)
		return
	}
	var got []string
	for _, s := range strings.Split(string(buf[:sz]), "\x00") {
		if s != "" {
			got = append(got, s)
		}
	}
	var want []string
	for _, x := range n.Xattrs() {
		want = append(want, x.Name)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("listxattr %q: %q, want %q", path, got, want)
		return
	}
	for _, x := range n.Xattrs() {
		vs, err := syscall.Getxattr(path, x.Name, buf)
		if err != nil {
			t.Errorf("getxattr %q %s: %v", path, x.Name, err)
			continue
		}
		if !bytes.Equal(buf[:vs], x.Value) {
			t.Errorf("getxattr %q %s = %x, want %x", path, x.Name, buf[:vs], x.Value)
		}
	}
}
