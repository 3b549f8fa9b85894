package imagetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"path"
	"strings"
	"time"
)

// Image is a named test image: layers bottom-up, and the hand-written
// state flattening must produce.
type Image struct {
	Name   string
	Layers []Layer
	// Want returns the expected result (see Expect and Check); it is a
	// function because hashing large content is slow.
	Want func() Snapshot
	// Large marks images whose content is slow to hash or unpack (sparse
	// files of several GiB); tests may skip them in -short mode.
	Large bool
	// NoReference, when set, says why umoci cannot serve as the reference
	// for this image (the expectation still applies).
	NoReference string
	// UmociMtimeSkew lists directories whose mtime umoci gets wrong: it
	// restores the mtime of a whiteout's parent only, so a directory that
	// loses lower-layer children to an ancestor's opaque marker ends up
	// with the time of the unpack.
	UmociMtimeSkew []string
}

// Fixed times used by the corpus.
var (
	T1 = time.Date(2021, 1, 2, 3, 4, 5, 600000000, time.UTC)
	T2 = time.Date(2022, 2, 3, 4, 5, 6, 700000001, time.UTC)
	T3 = time.Date(2023, 3, 4, 5, 6, 7, 800000002, time.UTC)
)

// CapNetBindService is a valid VFS v2 security.capability value granting
// cap_net_bind_service (permitted, effective): magic 0x02000001, then
// permitted[0] = 1<<10 and three zero words.
const CapNetBindService = "\x01\x00\x00\x02" + "\x00\x04\x00\x00" + "\x00\x00\x00\x00" +
	"\x00\x00\x00\x00" + "\x00\x00\x00\x00"

// DeclaredDirs returns the cleaned paths ("." for the root) that some
// layer declares as a directory entry: the others are implied parents,
// whose times are unspecified.
func DeclaredDirs(layers []Layer) map[string]bool {
	m := make(map[string]bool)
	for _, l := range layers {
		for _, e := range l {
			if e.Type == tar.TypeDir {
				m[path.Clean(e.Name)] = true
			}
		}
	}
	return m
}

// Corpus returns the test images, covering every flattening rule.
func Corpus() []Image {
	return []Image{
		basicImage(),
		whiteoutImage(),
		opaqueImage(),
		opaqueRootImage(),
		typeChangeImage(),
		redeclareImage(),
		impliedImage(),
		hardlinkImage(),
		xattrImage(),
		libarchiveImage(),
		longNameImage(),
		nonUTF8Image(),
		sparseImage(),
		oldGNUSparseImage(),
		largeImage(),
		globalHeaderImage(),
		rootMetaImage(),
		aufsImage(),
		sameLayerImage(),
	}
}

func basicImage() Image {
	sec := func(s int64) time.Time { return time.Unix(s, 0).UTC() }
	y2040 := time.Date(2040, 7, 8, 9, 10, 11, 500, time.UTC)
	l0 := Layer{
		Dir("./").At(T1),
		Dir("etc/"),
		File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
		File("etc/shadow", "root:*:19000:0:99999:7:::\n").Perm(0o640).Owner(0, 42),
		Symlink("etc/evil", "../../../../etc/shadow"),
		Dir("bin/"),
		File("bin/sh", "#!elf sh\n").Perm(0o755),
		Dir("tmp/").Perm(0o1777),
		Dir("usr/"),
		Dir("usr/bin/"),
		File("usr/bin/sudo", "sudo").Perm(0o4755),
		File("usr/bin/wall", "wall").Perm(0o2755).Owner(0, 5),
		File("usr/bin/odd", "odd").Perm(0o7777),
		File("usr/bin/none", "").Perm(0),
		Dir("home/"),
		Dir("home/user/").Perm(0o700).Owner(1000, 1000),
		File("home/user/.profile", "export PS1='$ '\n").Owner(1000, 1000).Perm(0o600),
		Dir("var/"),
		Symlink("var/run", "../run"),
		Dir("run/"),
		Symlink("abs", "/etc/passwd").Owner(7, 8),
		Symlink("odd-mode-link", "abs").Perm(0o4644),
		Dir("dev/"),
		Char("dev/null", 1, 3),
		Block("dev/loop0", 7, 0),
		Char("dev/wide", 300, 70000),
		Fifo("dev/initctl").Perm(0o600),
		File("nsec", "n").At(time.Unix(1700000000, 1).UTC()),
		File("ustar", "old").In(tar.FormatUSTAR).At(sec(1600000000)),
		File("gnu", "gnu").In(tar.FormatGNU).At(sec(1600000001)),
		Entry{Name: "rega", Type: TypeLegacy, Mode: 0o644, ModTime: sec(1600000002), Body: []byte("legacy typeflag")},
		Entry{Name: "legacydir/", Type: TypeLegacy, Mode: 0o711, ModTime: sec(1600000003)},
		File("times", "t").Times(T2, T3),
		File("y2040", "future").At(y2040),
		File("pre1970", "past").At(time.Date(1969, 12, 31, 23, 59, 58, 0, time.UTC)),
	}
	return Image{
		Name:   "basic",
		Layers: []Layer{l0},
		Want: func() Snapshot {
			return Expect(
				WDir(".", 0o755).At(T1),
				WDir("etc", 0o755).At(Epoch),
				WFile("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\n").At(Epoch),
				WFile("etc/shadow", 0o640, "root:*:19000:0:99999:7:::\n").Owner(0, 42),
				WSymlink("etc/evil", "../../../../etc/shadow").At(Epoch),
				WDir("bin", 0o755),
				WFile("bin/sh", 0o755, "#!elf sh\n"),
				WDir("tmp", 0o1777),
				WDir("usr", 0o755),
				WDir("usr/bin", 0o755),
				WFile("usr/bin/sudo", 0o4755, "sudo"),
				WFile("usr/bin/wall", 0o2755, "wall").Owner(0, 5),
				WFile("usr/bin/odd", 0o7777, "odd"),
				WFile("usr/bin/none", 0, ""),
				WDir("home", 0o755),
				WDir("home/user", 0o700).Owner(1000, 1000),
				WFile("home/user/.profile", 0o600, "export PS1='$ '\n").Owner(1000, 1000),
				WDir("var", 0o755),
				WSymlink("var/run", "../run"),
				WDir("run", 0o755),
				WSymlink("abs", "/etc/passwd").Owner(7, 8),
				WSymlink("odd-mode-link", "abs"),
				WDir("dev", 0o755),
				WChar("dev/null", 0o666, 1, 3),
				WBlock("dev/loop0", 0o660, 7, 0),
				WChar("dev/wide", 0o666, 300, 70000),
				WFifo("dev/initctl", 0o600),
				WFile("nsec", 0o644, "n").At(time.Unix(1700000000, 1).UTC()),
				WFile("ustar", 0o644, "old").At(sec(1600000000)),
				WFile("gnu", 0o644, "gnu").At(sec(1600000001)),
				WFile("rega", 0o644, "legacy typeflag").At(sec(1600000002)),
				WDir("legacydir", 0o711).At(sec(1600000003)),
				WFile("times", 0o644, "t").At(Epoch),
				WFile("y2040", 0o644, "future").At(y2040),
				WFile("pre1970", 0o644, "past").At(time.Date(1969, 12, 31, 23, 59, 58, 0, time.UTC)),
			)
		},
	}
}

func whiteoutImage() Image {
	l0 := Layer{
		Dir("a/"), File("a/x", "x"), File("a/y", "y"),
		Dir("b/"), File("b/z", "z"),
		File("c", "c"),
		Dir("d/"), Dir("d/e/"), File("d/e/f", "f"), File("d/g", "g"),
		Symlink("s", "a"),
		File("keep", "keep"),
	}
	l1 := Layer{
		Whiteout("a/x"),
		Whiteout("c"),
		Whiteout("d"),
		Whiteout("missing"),
		Whiteout("b/nope"),
		Whiteout("nodir/x"),
		Whiteout("s"),
		Whiteout("keep/x"),
	}
	return Image{
		Name:   "whiteout",
		Layers: []Layer{l0, l1},
		Want: func() Snapshot {
			return Expect(
				WDir("a", 0o755).At(Epoch), WFile("a/y", 0o644, "y"),
				WDir("b", 0o755).At(Epoch), WFile("b/z", 0o644, "z"),
				WFile("keep", 0o644, "keep"),
			)
		},
	}
}

func opaqueImage() Image {
	l0 := Layer{
		Dir("o/"), File("o/a", "a"), File("o/b", "b"), Dir("o/sub/"), File("o/sub/c", "c"),
		Dir("p/"), File("p/q", "q"), Dir("p/r/"), File("p/r/old", "old"),
		Dir("r/"), Dir("r/s/"), File("r/s/old", "old"), File("r/t", "t"),
		Dir("u/"), File("u/v", "v"),
	}
	l1 := Layer{
		// Marker right after the directory, before the new children.
		Dir("o/").At(T1), Opaque("o"), File("o/new", "new"), Dir("o/sub/"), File("o/sub/d", "d"),
		// Marker after the new children: they stay.
		Dir("p/"), File("p/new2", "new2"), Opaque("p"),
		// A re-declared subdirectory survives, its lower children do not.
		Dir("r/"), Dir("r/s/").At(T2), File("r/s/new", "new"), Opaque("r"),
		// A marker for a directory the layer does not declare.
		Opaque("u"),
	}
	return Image{
		Name:           "opaque",
		Layers:         []Layer{l0, l1},
		UmociMtimeSkew: []string{"r/s"},
		Want: func() Snapshot {
			return Expect(
				WDir("o", 0o755).At(T1), WFile("o/new", 0o644, "new"), WDir("o/sub", 0o755), WFile("o/sub/d", 0o644, "d"),
				WDir("p", 0o755), WFile("p/new2", 0o644, "new2"),
				WDir("r", 0o755), WDir("r/s", 0o755).At(T2), WFile("r/s/new", 0o644, "new"),
				WDir("u", 0o755).At(Epoch),
			)
		},
	}
}

func opaqueRootImage() Image {
	l0 := Layer{Dir("etc/"), File("etc/a", "a"), File("top", "top")}
	l1 := Layer{File("new", "new"), Opaque(".")}
	return Image{
		Name:   "opaque-root",
		Layers: []Layer{l0, l1},
		Want:   func() Snapshot { return Expect(WFile("new", 0o644, "new")) },
	}
}

func typeChangeImage() Image {
	l0 := Layer{
		Dir("d1/"), File("d1/a", "A"), File("d1/b", "B"),
		Link("hl", "d1/a"),
		File("f1", "f1"), File("f2", "f2"), Symlink("s1", "f1"), File("f3", "f3"),
		Dir("d2/"), File("d2/x", "x"), File("f4", "f4"),
		Dir("realdir/"), File("realdir/in", "in"), Symlink("ldir", "realdir"),
	}
	l1 := Layer{
		File("d1", "now a file"),
		Dir("f1/"), File("f1/inner", "inner"),
		Symlink("f2", "d1"),
		File("s1", "was a symlink"),
		Fifo("f3"),
		Symlink("d2", "f4"),
		Char("f4", 1, 5),
		Dir("ldir/"), File("ldir/own", "own"),
	}
	return Image{
		Name:   "typechange",
		Layers: []Layer{l0, l1},
		Want: func() Snapshot {
			return Expect(
				WFile("d1", 0o644, "now a file"),
				WFile("hl", 0o644, "A"),
				WDir("f1", 0o755), WFile("f1/inner", 0o644, "inner"),
				WSymlink("f2", "d1"),
				WFile("s1", 0o644, "was a symlink"),
				WFifo("f3", 0o644),
				WSymlink("d2", "f4"),
				WChar("f4", 0o666, 1, 5),
				WDir("realdir", 0o755), WFile("realdir/in", 0o644, "in"),
				WDir("ldir", 0o755), WFile("ldir/own", 0o644, "own"),
			)
		},
	}
}

func redeclareImage() Image {
	l0 := Layer{
		Dir("m/").Xattr("user.old", "1").At(T1),
		File("m/child", "child"), Dir("m/sub/"), File("m/sub/gc", "gc"),
	}
	l1 := Layer{
		Dir("m/").Perm(0o700).Owner(1000, 1000).Xattr("user.new", "2").At(T2),
	}
	return Image{
		Name:   "redeclare",
		Layers: []Layer{l0, l1},
		Want: func() Snapshot {
			return Expect(
				WDir("m", 0o700).Owner(1000, 1000).WithXattr("user.new", "2").At(T2),
				WFile("m/child", 0o644, "child"),
				WDir("m/sub", 0o755).At(Epoch),
				WFile("m/sub/gc", 0o644, "gc"),
			)
		},
	}
}

func impliedImage() Image {
	l0 := Layer{
		File("a/b/c", "deep"),
		File("x/y", "y"),
		Dir("a/").Perm(0o750).Owner(3, 4).At(T1),
	}
	return Image{
		Name:   "implied",
		Layers: []Layer{l0},
		Want: func() Snapshot {
			return Expect(
				WDir("a", 0o750).Owner(3, 4).At(T1),
				WDir("a/b", 0o755),
				WFile("a/b/c", 0o644, "deep"),
				WDir("x", 0o755),
				WFile("x/y", 0o644, "y"),
			)
		},
	}
}

func hardlinkImage() Image {
	l0 := Layer{
		Dir("bin/"),
		File("bin/a", "shared").Perm(0o755),
		Link("bin/b", "bin/a"),
		Link("bin/c", "./bin/a"),
		Symlink("sym", "bin/a"),
		Link("sym2", "sym"),
		Fifo("pipe"),
		Link("pipe2", "pipe"),
		Dir("x/"), File("x/f", "xf"),
	}
	l1 := Layer{
		Link("bin/d", "/bin/a"),
		File("bin/b", "replaced"),
		Link("x/g", "x/f"),
	}
	l2 := Layer{
		Whiteout("bin/a"),
		Whiteout("x/f"),
	}
	return Image{
		Name:   "hardlinks",
		Layers: []Layer{l0, l1, l2},
		Want: func() Snapshot {
			return Expect(
				WDir("bin", 0o755),
				WFile("bin/b", 0o644, "replaced"),
				WFile("bin/c", 0o755, "shared").Linked("bin/c"),
				WFile("bin/d", 0o755, "shared").Linked("bin/c"),
				WSymlink("sym", "bin/a").Linked("sym"),
				WSymlink("sym2", "bin/a").Linked("sym"),
				WFifo("pipe", 0o644).Linked("pipe"),
				WFifo("pipe2", 0o644).Linked("pipe"),
				WDir("x", 0o755),
				WFile("x/g", 0o644, "xf"),
			)
		},
	}
}

func xattrImage() Image {
	l0 := Layer{
		File("cap", "bin").Perm(0o755).Xattr("security.capability", CapNetBindService),
		File("user", "u").Xattr("user.foo", "bar").Xattr("user.bin", "\x00\x01\xff").
			Xattr("security.selinux", "system_u:object_r:bin_t:s0"),
		Dir("xdir/").Xattr("user.dir", "d"),
		File("trusted", "t").Xattr("trusted.t", "tv"),
		File("unknownns", "n").Xattr("foo.bar", "x"),
	}
	return Image{
		Name:   "xattrs",
		Layers: []Layer{l0},
		Want: func() Snapshot {
			return Expect(
				WFile("cap", 0o755, "bin").WithXattr("security.capability", CapNetBindService),
				WFile("user", 0o644, "u").WithXattr("user.foo", "bar").WithXattr("user.bin", "\x00\x01\xff"),
				WDir("xdir", 0o755).WithXattr("user.dir", "d"),
				WFile("trusted", 0o644, "t").WithXattr("trusted.t", "tv"),
				WFile("unknownns", 0o644, "n"),
			)
		},
	}
}

func libarchiveImage() Image {
	l0 := Layer{
		File("lib", "l").LibXattr("user.lib name", []byte("v\x00al")),
		File("both", "b").Xattr("user.k", "schily").LibXattr("user.k", []byte("libarchive")),
		File("libcap", "c").LibXattr("security.capability", []byte(CapNetBindService)),
	}
	return Image{
		Name:        "libarchive-xattrs",
		Layers:      []Layer{l0},
		NoReference: "umoci and containerd read only SCHILY.xattr records",
		Want: func() Snapshot {
			return Expect(
				WFile("lib", 0o644, "l").WithXattr("user.lib name", "v\x00al"),
				WFile("both", 0o644, "b").WithXattr("user.k", "schily"),
				WFile("libcap", 0o644, "c").WithXattr("security.capability", CapNetBindService),
			)
		},
	}
}

func longNameImage() Image {
	d1 := strings.Repeat("d", 120)
	d2 := d1 + "/" + strings.Repeat("e", 200)
	long := d2 + "/" + strings.Repeat("f", 255)
	gnu := strings.Repeat("g", 150)
	target := strings.Repeat("t/", 100) + "x"
	l0 := Layer{
		Dir(d1 + "/"), Dir(d2 + "/"),
		File(long, "long"),
		File(gnu, "gnu").In(tar.FormatGNU).At(time.Unix(1600000000, 0)),
		Symlink("longlink", target),
		Link("longhard", long),
		Symlink("gnulonglink", strings.Repeat("u", 150)).In(tar.FormatGNU).At(time.Unix(1600000000, 0)),
	}
	return Image{
		Name:   "longnames",
		Layers: []Layer{l0},
		Want: func() Snapshot {
			return Expect(
				WDir(d1, 0o755), WDir(d2, 0o755),
				WFile(long, 0o644, "long").Linked(long),
				WFile("longhard", 0o644, "long").Linked(long),
				WFile(gnu, 0o644, "gnu"),
				WSymlink("longlink", target),
				WSymlink("gnulonglink", strings.Repeat("u", 150)),
			)
		},
	}
}

func nonUTF8Image() Image {
	l0 := Layer{
		Dir("caf\xe9/"),
		File("caf\xe9/\xff\xfe", "latin1"),
		Symlink("lnk\x80", "caf\xe9/\xff\xfe"),
		File("gnu\xf0", "x").In(tar.FormatGNU).At(time.Unix(1600000000, 0)),
	}
	return Image{
		Name:   "non-utf8",
		Layers: []Layer{l0},
		Want: func() Snapshot {
			return Expect(
				WDir("caf\xe9", 0o755),
				WFile("caf\xe9/\xff\xfe", 0o644, "latin1"),
				WSymlink("lnk\x80", "caf\xe9/\xff\xfe"),
				WFile("gnu\xf0", 0o644, "x"),
			)
		},
	}
}

func sparseImage() Image {
	pax := Sparse("sparse-pax", 3<<20+100, SparsePAX,
		Fragment{40960, []byte("block ten")},
		Fragment{3 << 20, bytes.Repeat([]byte{0xab}, 100)},
	)
	tail := Sparse("sparse-tail", 1<<20, SparsePAX,
		Fragment{0, []byte("head")},
		Fragment{300 << 10, bytes.Repeat([]byte("mid"), 3000)},
	)
	hole := Sparse("all-hole", 8192, SparsePAX)
	return Image{
		Name:   "sparse",
		Layers: []Layer{{pax, tail, hole}},
		Want: func() Snapshot {
			return Expect(
				WFileOf("sparse-pax", 0o644, pax),
				WFileOf("sparse-tail", 0o644, tail),
				WFileOf("all-hole", 0o644, hole),
			)
		},
	}
}

func oldGNUSparseImage() Image {
	gnu := Sparse("sparse-gnu", 1<<20, SparseGNU,
		Fragment{0, []byte("head")},
		Fragment{300 << 10, bytes.Repeat([]byte("mid"), 3000)},
	)
	return Image{
		Name:        "sparse-old-gnu",
		Layers:      []Layer{{gnu}},
		NoReference: "umoci and containerd reject the old GNU sparse typeflag 'S'",
		Want:        func() Snapshot { return Expect(WFileOf("sparse-gnu", 0o644, gnu)) },
	}
}

func largeImage() Image {
	big := Sparse("big", 4<<30+8192+5, SparsePAX,
		Fragment{0, []byte("start")},
		Fragment{4<<30 + 4096, []byte("past 4 GiB")},
	)
	return Image{
		Name:        "large",
		Large:       true,
		NoReference: "umoci writes every zero of the 4 GiB file (about a minute); the expectation is checked instead",
		Layers:      []Layer{{big}},
		Want:        func() Snapshot { return Expect(WFileOf("big", 0o644, big)) },
	}
}

func globalHeaderImage() Image {
	g := Entry{Name: "pax_global_header", Type: tar.TypeXGlobalHeader, PAX: map[string]string{"comment": "0123456789abcdef"}}
	return Image{
		Name:        "global-header",
		NoReference: "umoci 0.4.7 rejects PAX global headers (containerd ignores them, as we do)",
		Layers:      []Layer{{g, File("after", "after")}},
		Want:        func() Snapshot { return Expect(WFile("after", 0o644, "after")) },
	}
}

func rootMetaImage() Image {
	l0 := Layer{Dir("./").Perm(0o750).Owner(5, 6).At(T1), File("f", "x")}
	l1 := Layer{Dir(".").At(T2).Xattr("user.root", "r")}
	return Image{
		Name:   "root-meta",
		Layers: []Layer{l0, l1},
		Want: func() Snapshot {
			return Expect(
				WDir(".", 0o755).WithXattr("user.root", "r").At(T2),
				WFile("f", 0o644, "x"),
			)
		},
	}
}

func aufsImage() Image {
	return Image{
		Name:   "aufs-meta",
		Layers: []Layer{{File(".wh..wh.aufs", ""), Dir(".wh..wh.plnk/"), Dir(".wh..wh.orph/"), File("real", "r")}},
		Want:   func() Snapshot { return Expect(WFile("real", 0o644, "r")) },
	}
}

func sameLayerImage() Image {
	l0 := Layer{File("lower", "L")}
	l1 := Layer{
		File("dup", "first"), File("dup", "second"),
		File("wo", "kept"), Whiteout("wo"),
		File("d/child", "c"), Dir("d/").Perm(0o700).At(T3),
		Whiteout("lower"), File("lower", "new"),
	}
	return Image{
		Name:   "same-layer",
		Layers: []Layer{l0, l1},
		Want: func() Snapshot {
			return Expect(
				WFile("dup", 0o644, "second"),
				WFile("wo", 0o644, "kept"),
				WDir("d", 0o700).At(T3), WFile("d/child", 0o644, "c"),
				WFile("lower", 0o644, "new"),
			)
		},
	}
}

// HostileCase is a layer stack whose last layer must be refused.
type HostileCase struct {
	Name   string
	Layers []Layer
	// Entry is the name of the refused entry in the last layer.
	Entry string
	// Err is a substring of the expected error.
	Err string
}

// Hostile returns layer stacks that must fail to flatten.
func Hostile() []HostileCase {
	one := func(name string, e Entry, err string, lower ...Entry) HostileCase {
		c := HostileCase{Name: name, Entry: e.Name, Err: err}
		if len(lower) > 0 {
			c.Layers = append(c.Layers, Layer(lower))
		}
		c.Layers = append(c.Layers, Layer{e})
		return c
	}
	same := func(name string, err string, es ...Entry) HostileCase {
		return HostileCase{Name: name, Layers: []Layer{es}, Entry: es[len(es)-1].Name, Err: err}
	}
	return []HostileCase{
		one("Absolute", File("/etc/passwd", "x"), "absolute path"),
		one("AbsoluteWhiteout", Whiteout("/etc/passwd"), "absolute path"),
		one("DotDot", File("../escape", "x"), "escapes the root"),
		one("DotDotDeep", File("a/../../escape", "x"), "escapes the root"),
		one("DotDotWhiteout", Whiteout("a/../../x"), "escapes the root"),
		one("WhiteoutOfDotDot", Raw(".wh..", tar.TypeReg), "invalid whiteout name"),
		one("SymlinkParentLower", File("etc/passwd", "x"), "writing below a symlinked directory", Symlink("etc", "/etc")),
		same("SymlinkParentSameLayer", "writing below a symlinked directory", Symlink("up", ".."), File("up/x", "x")),
		one("SymlinkParentInside", File("alias/x", "x"), "writing below a symlinked directory", Dir("real/"), Symlink("alias", "real")),
		one("SymlinkParentDeep", Dir("a/b/c/"), "writing below a symlinked directory", Dir("a/"), Symlink("a/b", "/")),
		one("SymlinkParentHardlink", Link("s/x", "f"), "writing below a symlinked directory", File("f", "f"), Symlink("s", "/tmp")),
		one("HardlinkEscape", Link("x", "../../etc/shadow"), "escapes the root"),
		one("HardlinkMissing", Link("x", "nothere"), "not found"),
		one("HardlinkDir", Link("x", "d"), "is a directory", Dir("d/")),
		one("HardlinkRoot", Link("x", "./"), "hard link to a directory"),
		one("HardlinkViaSymlink", Link("x", "s/f"), "below a symlinked directory", Dir("real/"), File("real/f", "f"), Symlink("s", "real")),
		one("HardlinkEmpty", Link("x", ""), "empty hard link target"),
		one("WhiteoutBelowSymlink", Whiteout("s/passwd"), "whiteout below a symlinked directory", Symlink("s", "/etc")),
		one("OpaqueBelowSymlink", Opaque("s"), "whiteout below a symlinked directory", Symlink("s", "/etc")),
		one("RootAsFile", Raw(".", tar.TypeReg), "replace the root directory"),
		one("RootAsSymlink", Symlink(".", "/etc"), "replace the root directory"),
		one("RootAsHardlink", Link(".", "f"), "replace the root directory", File("f", "f")),
		one("EmptyName", File("", "x"), "replace the root directory"),
		one("UnknownType", Raw("weird", 'Z'), "unsupported entry type"),
		same("ParentIsFile", "parent is not a directory", File("f", "x"), File("f/g", "y")),
		one("WhiteoutAsDir", File("a/.wh.b/c", "x"), "whiteout name used as a directory"),
		one("NameTooLong", File(strings.Repeat("n", 256), "x"), "longer than 255 bytes"),
		one("EmptySymlink", Symlink("e", ""), "empty symlink target"),
		one("XattrsTooLarge", File("f", "x").Xattr("user.big", strings.Repeat("v", 5000)), "do not fit in the inode and one 4096-byte block"),
		one("TooManyXattrs", manyXattrs(File("f", "x"), 300), "do not fit in the inode and one 4096-byte block"),
		one("HardlinkTargetTooLong", Link("x", strings.Repeat("t/", 2100)), "hard link target longer than 4095 bytes"),
	}
}

// manyXattrs gives e n small user xattrs.
func manyXattrs(e Entry, n int) Entry {
	for i := range n {
		e = e.Xattr(fmt.Sprintf("user.a%03d", i), "v")
	}
	return e
}
