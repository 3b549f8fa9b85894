package startcheck

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// The loader as an oracle: on a real Debian tree (the cached debootstrap
// tree of test/images) and on changed copies of it, the check's startVerdict
// on every program of /usr/bin must be the real loader's, run in the
// tree with chroot: `ld.so --list PROGRAM` resolves each library (or
// fails as a start would), as the user the spec names.

// treeOp is one change to a tree, made both to the check's view of it
// (an overlayFS on the cached tree) and to the hardlinked copy the loader
// runs in.
type treeOp struct {
	// remove deletes the file at a path.
	remove string
	// write puts data at a path, a new file of mode perm (a new inode:
	// the copy shares the cache's).
	write string
	data  []byte
	perm  fs.FileMode
	// mkdir makes a directory.
	mkdir string
}

// overlayFS is a tree of the host (base) with files removed and added,
// the check's view of a changed copy without copying it.
type overlayFS struct {
	base    dirFS
	removed map[string]bool
	added   map[string]overlayFile
}

type overlayFile struct {
	e    Entry
	data []byte
}

func newOverlay(base string, ops []treeOp) *overlayFS {
	o := &overlayFS{base: dirFS(base), removed: map[string]bool{}, added: map[string]overlayFile{}}
	for _, op := range ops {
		switch {
		case op.remove != "":
			o.removed[op.remove] = true
			delete(o.added, op.remove)
		case op.write != "":
			o.added[op.write] = overlayFile{e: Entry{Mode: op.perm}, data: op.data}
		case op.mkdir != "":
			o.added[op.mkdir] = overlayFile{e: Entry{Mode: fs.ModeDir | 0o755}}
		}
	}
	return o
}

func (o *overlayFS) Lstat(p string) (Entry, error) {
	if f, ok := o.added[p]; ok {
		return f.e, nil
	}
	if o.removed[p] {
		return Entry{}, fmt.Errorf("lstat %s: %w", p, fs.ErrNotExist)
	}
	return o.base.Lstat(p)
}

func (o *overlayFS) ReadHead(p string, n int) ([]byte, error) {
	if f, ok := o.added[p]; ok {
		return bytes.Clone(f.data[:min(n, len(f.data))]), nil
	}
	return o.base.ReadHead(p, n)
}

func (o *overlayFS) ReadAt(p string, b []byte, off int64) (int, error) {
	if f, ok := o.added[p]; ok {
		return bytes.NewReader(f.data).ReadAt(b, off)
	}
	return o.base.ReadAt(p, b, off)
}

// copyTree makes a copy of the tree at base that the loader can run in:
// hard links (cp -al) in a directory beside base, on its filesystem,
// with ops applied. Files are never written in place: the copy shares
// their inodes with base.
func copyTree(t *testing.T, base string, ops []treeOp) string {
	t.Helper()
	dir, err := os.MkdirTemp(filepath.Dir(base), ".oracle-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	root := filepath.Join(dir, "t")
	if out, err := exec.Command("cp", "-al", base, root).CombinedOutput(); err != nil {
		t.Fatalf("cp -al: %v\n%s", err, out)
	}
	for _, op := range ops {
		switch {
		case op.remove != "":
			if err := os.Remove(root + op.remove); err != nil {
				t.Fatal(err)
			}
		case op.write != "":
			p := root + op.write
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, op.perm)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.Write(op.data)
			if err := errors.Join(err, f.Chmod(op.perm), f.Close()); err != nil {
				t.Fatal(err)
			}
		case op.mkdir != "":
			if err := os.MkdirAll(root+op.mkdir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// startVerdict is whether a program can start, and the libraries it loads.
type startVerdict struct {
	ok   bool
	libs map[string]string
	why  string
}

// loaderVerdict asks the tree's own loader whether prog (an ELF, or a
// script run by its "#!" interpreter) starts as user ("" for root): the
// user may execute it (and read a script), and `ld.so --list` loads its
// libraries without an error. libs are what the loader printed.
func loaderVerdict(t *testing.T, root, prog string, env []string, user string) startVerdict {
	t.Helper()
	run := func(args ...string) (string, string, error) {
		cmd := exec.Command("chroot", args...)
		if user != "" {
			cmd = exec.Command("chroot", append([]string{"--userspec=" + user}, args...)...)
		}
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	target := prog
	head, _ := dirFS(root).ReadHead(prog, shebangSize)
	script := bytes.HasPrefix(head, []byte("#!"))
	if script {
		sb, err := parseShebang(head)
		if err != nil {
			return startVerdict{why: err.Error()}
		}
		target = sb.interp
	}
	if user != "" {
		if _, _, err := run(root, "/usr/bin/test", "-x", prog); err != nil {
			return startVerdict{why: "not executable by " + user}
		}
		if _, _, err := run(root, "/usr/bin/test", "-r", prog); script && err != nil {
			return startVerdict{why: "script not readable by " + user}
		}
	}
	stdout, stderr, err := run(root, "/lib64/ld-linux-x86-64.so.2", "--list", target)
	if err != nil || stderr != "" {
		return startVerdict{why: strings.TrimSpace(stderr + " " + fmt.Sprint(err))}
	}
	libs := map[string]string{}
	for line := range strings.SplitSeq(stdout, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), " => ")
		if !ok {
			continue
		}
		p, _, _ := strings.Cut(rest, " (")
		libs[name] = p
	}
	return startVerdict{ok: true, libs: libs}
}

// checkVerdict is the check's startVerdict on prog: ok unless it fails;
// warnings are reported as such.
func checkVerdict(fsys FS, prog string, env []string, user string) (startVerdict, Result) {
	r := Check(fsys, Spec{Argv: []string{prog}, Env: env, User: user, Arch: "amd64"})
	libs := maps.Clone(r.Libraries)
	// The loader lists itself apart, not as the library libc needs.
	delete(libs, "ld-linux-x86-64.so.2")
	v := startVerdict{ok: !r.Failed(), libs: libs}
	if len(r.Problems) > 0 {
		v.why = r.Problems[0]
	}
	return v, r
}

// oracleCase is a changed copy of the tree and how its programs run.
type oracleCase struct {
	name string
	ops  []treeOp
	env  []string
	user string
	// failing names programs the case must make fail, so that a case
	// that changes nothing is caught.
	failing []string
}

// oracleStats counts one case's comparisons.
type oracleStats struct {
	programs, loaderFails, checkFails, disagree, libsDiffer, warnings int
}

// runOracle compares the check and the loader on every program of the
// tree's /usr/bin.
func runOracle(t *testing.T, base string, tc oracleCase) oracleStats {
	t.Helper()
	root := copyTree(t, base, tc.ops)
	fsys := newOverlay(base, tc.ops)
	env := append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, tc.env...)
	entries, err := os.ReadDir(root + "/usr/bin")
	if err != nil {
		t.Fatal(err)
	}
	var st oracleStats
	var progs []string
	for _, de := range entries {
		prog := "/usr/bin/" + de.Name()
		if fi, err := os.Stat(root + prog); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			progs = append(progs, prog)
		}
	}
	for _, prog := range progs {
		got, r := checkVerdict(fsys, prog, env, tc.user)
		st.compare(t, prog, loaderVerdict(t, root, prog, env, tc.user), got, r, tc.failing)
	}
	return st
}

// compare counts a program's verdicts, the loader's (want) and the
// check's (got, of r), failing t where they differ, or where the loader
// starts one of failing.
func (st *oracleStats) compare(t *testing.T, prog string, want, got startVerdict, r Result, failing []string) {
	t.Helper()
	st.programs++
	if !want.ok {
		st.loaderFails++
	} else if slices.Contains(failing, prog) {
		t.Errorf("%s starts: the case should keep it from starting", prog)
	}
	if !got.ok {
		st.checkFails++
	}
	if r.Result == ResultWarnings {
		st.warnings++
		t.Errorf("%s: check warns: %q", prog, r.Problems)
	}
	if got.ok != want.ok {
		st.disagree++
		t.Errorf("%s: check ok=%v (%s), loader ok=%v (%s)", prog, got.ok, got.why, want.ok, want.why)
		return
	}
	if want.ok && !maps.Equal(got.libs, want.libs) {
		st.libsDiffer++
		t.Errorf("%s: check loads %v, loader %v", prog, got.libs, want.libs)
	}
}

// line is the case's line in a test's summary.
func (st oracleStats) line(name string) string {
	return fmt.Sprintf("%-26s %4d programs, loader fails %3d, check fails %3d, disagreements %d, library lists differing %d, warnings %d",
		name, st.programs, st.loaderFails, st.checkFails, st.disagree, st.libsDiffer, st.warnings)
}

// TestLoaderOracle runs the check and the real loader on the Debian
// tree and on copies of it with a library removed, a library moved to a
// directory only LD_LIBRARY_PATH names, programs needing versions their
// libraries do not define, candidates the loader passes over or stops
// at, search paths of DT_RPATH and DT_RUNPATH, and a user other than
// root. They must agree on every program of /usr/bin.
func TestLoaderOracle(t *testing.T) {
	if testing.Short() {
		t.Skip("the Debian tree and chroot in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	base := images.DebianRootfs(t)
	const multi = "/usr/lib/x86_64-linux-gnu"
	read := func(p string) []byte {
		b, err := os.ReadFile(filepath.Join(base, p))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A GLIBC_2.99 requirement: /usr/bin/true with GLIBC_2.34 renamed
	// in its version needs, as a program built against a newer glibc.
	newGlibc := renameVersionNeed(t, read("/usr/bin/true"), "GLIBC_2.34", "GLIBC_2.99")
	foo := buildFoo(t)

	cases := []oracleCase{
		{name: "Debian"},
		{name: "LibraryRemoved", ops: []treeOp{{remove: multi + "/libselinux.so.1"}},
			failing: []string{"/usr/bin/ls", "/usr/bin/cp"}},
		{name: "LibraryOnlyOnLibraryPath", ops: movePCRE(read(multi + "/libpcre2-8.so.0.11.2")),
			failing: []string{"/usr/bin/ls", "/usr/bin/grep"}},
		{name: "LibraryOnLibraryPath", ops: movePCRE(read(multi + "/libpcre2-8.so.0.11.2")), env: []string{"LD_LIBRARY_PATH=/nowhere:/opt/lib"}},
		{name: "VersionMissing", ops: []treeOp{
			{write: "/usr/bin/true-glibc299", data: newGlibc, perm: 0o755},
			{write: "/usr/bin/fooapp", data: foo.app, perm: 0o755},
			{write: multi + "/libfoo.so.1", data: foo.libV1, perm: 0o644},
		}, failing: []string{"/usr/bin/true-glibc299", "/usr/bin/fooapp"}},
		{name: "VersionDefined", ops: []treeOp{
			{write: "/usr/bin/fooapp", data: foo.app, perm: 0o755},
			{write: multi + "/libfoo.so.1", data: foo.libV2, perm: 0o644},
		}},
		{name: "OtherClassPassedOver", ops: []treeOp{{mkdir: "/opt/lib"},
			{write: "/opt/lib/libselinux.so.1", data: mkDynELF(dynOpts{class: elf.ELFCLASS32, machine: elf.EM_386}), perm: 0o644}},
			env: []string{"LD_LIBRARY_PATH=/opt/lib"}},
		{name: "NotELFStops", ops: []treeOp{{mkdir: "/opt/lib"},
			{write: "/opt/lib/libselinux.so.1", data: []byte("/* GNU ld script */\nOUTPUT_FORMAT(elf64-x86-64)\nGROUP ( /lib/x86_64-linux-gnu/libselinux.so.1 )\n"), perm: 0o644}},
			env: []string{"LD_LIBRARY_PATH=/opt/lib"}, failing: []string{"/usr/bin/ls"}},
		{name: "ByteOrderStops", ops: []treeOp{{mkdir: "/opt/lib"},
			{write: "/opt/lib/libselinux.so.1", data: flipByteOrder(read(multi + "/libselinux.so.1")), perm: 0o644}},
			env: []string{"LD_LIBRARY_PATH=/opt/lib"}, failing: []string{"/usr/bin/ls"}},
		// Debian's loader passes over an object of the other byte order
		// whose machine then reads as another (upstream's stops there).
		{name: "OtherByteOrderPassedOver", ops: []treeOp{{mkdir: "/opt/lib"},
			{write: "/opt/lib/libselinux.so.1", data: mkDynELF(dynOpts{order: binary.BigEndian}), perm: 0o644}},
			env: []string{"LD_LIBRARY_PATH=/opt/lib"}},
		{name: "SearchPaths", ops: foo.rpathOps(), failing: []string{"/usr/bin/runpathapp"}},
		{name: "OtherUser", user: "1000:1000", ops: []treeOp{
			{write: "/usr/bin/rootonly", data: read("/usr/bin/true"), perm: 0o700},
			{write: multi + "/libpcre2-8.so.0.11.2", data: read(multi + "/libpcre2-8.so.0.11.2"), perm: 0o600},
			{write: "/usr/bin/script-unreadable", data: []byte("#!/bin/sh\necho\n"), perm: 0o711},
		}, failing: []string{"/usr/bin/rootonly", "/usr/bin/ls", "/usr/bin/script-unreadable"}},
	}
	var summary []string
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			summary = append(summary, runOracle(t, base, tc).line(tc.name))
		})
	}
	t.Logf("check vs loader:\n%s", strings.Join(summary, "\n"))
}

// flipByteOrder returns the ELF b marked big-endian, its fields as they
// were: a loader reads its machine as its own, then stops at the byte
// order.
func flipByteOrder(b []byte) []byte {
	out := bytes.Clone(b)
	out[elf.EI_DATA] = byte(elf.ELFDATA2MSB)
	return out
}

// movePCRE moves libpcre2-8.so.0 (libselinux needs it, and grep) to
// /opt/lib: only LD_LIBRARY_PATH names it; ld.so.cache still names its
// old path.
func movePCRE(content []byte) []treeOp {
	const multi = "/usr/lib/x86_64-linux-gnu"
	return []treeOp{
		{remove: multi + "/libpcre2-8.so.0"},
		{remove: multi + "/libpcre2-8.so.0.11.2"},
		{mkdir: "/opt/lib"},
		{write: "/opt/lib/libpcre2-8.so.0", data: content, perm: 0o644},
	}
}

// renameVersionNeed returns the ELF b with the version need from renamed
// to (of the same length) in its dynamic string table, its hash fixed:
// a program that needs a version its libc does not define.
func renameVersionNeed(t *testing.T, b []byte, from, to string) []byte {
	t.Helper()
	if len(from) != len(to) {
		t.Fatalf("renameVersionNeed: %q and %q differ in length", from, to)
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out := bytes.Clone(b)
	dynstr, verneed := f.Section(".dynstr"), f.Section(".gnu.version_r")
	if dynstr == nil || verneed == nil {
		t.Fatal("renameVersionNeed: no .dynstr or .gnu.version_r")
	}
	i := bytes.Index(out[dynstr.Offset:dynstr.Offset+dynstr.Size], []byte("\x00"+from+"\x00"))
	if i < 0 {
		t.Fatalf("renameVersionNeed: no %q in .dynstr", from)
	}
	copy(out[dynstr.Offset+uint64(i)+1:], to)
	// Each Vernaux naming it carries its hash.
	order := f.ByteOrder
	fixed := 0
	for off := verneed.Offset; ; {
		vn := out[off:]
		aux := off + uint64(order.Uint32(vn[8:]))
		for {
			a := out[aux:]
			if order.Uint32(a) == elfHash(from) {
				order.PutUint32(a, elfHash(to))
				fixed++
			}
			if order.Uint32(a[12:]) == 0 {
				break
			}
			aux += uint64(order.Uint32(a[12:]))
		}
		if order.Uint32(vn[12:]) == 0 {
			break
		}
		off += uint64(order.Uint32(vn[12:]))
	}
	if fixed == 0 {
		t.Fatalf("renameVersionNeed: no version need %q", from)
	}
	return out
}

// fooBuild are objects built with the host's gcc: libfoo.so.1 defining
// FOO_2.0 (libV2) or only FOO_1.0 (libV1), a program needing FOO_2.0 of
// it, and programs finding libraries through DT_RPATH or DT_RUNPATH.
type fooBuild struct {
	app, libV1, libV2                        []byte
	rpathApp, runpathApp, libOuter, libInner []byte
}

func buildFoo(t *testing.T) fooBuild {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc builds the test's objects (make deps installs it)")
	}
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gcc := func(args ...string) []byte { return compile(t, dir, "gcc", args...) }
	write("foo.c", "int foo1(void) { return 1; }\nint foo2(void) { return 2; }\n")
	write("v2.map", "FOO_1.0 { global: foo1; local: *; };\nFOO_2.0 { global: foo2; } FOO_1.0;\n")
	write("v1.map", "FOO_1.0 { global: foo1; foo2; local: *; };\n")
	write("app.c", "int foo2(void);\nint main(void) { return foo2() == 2 ? 0 : 1; }\n")
	var b fooBuild
	b.libV2 = gcc("-shared", "-fPIC", "-Wl,--version-script=v2.map", "-Wl,-soname,libfoo.so.1", "foo.c", "libfoo.so.1")
	b.app = gcc("app.c", "-L.", "-l:libfoo.so.1", "fooapp")
	b.libV1 = gcc("-shared", "-fPIC", "-Wl,--version-script=v1.map", "-Wl,-soname,libfoo.so.1", "foo.c", "libfoo-v1.so.1")
	// libouter.so needs libinner.so; the programs need libouter.so and
	// find both in $ORIGIN/../lib/demo: DT_RPATH serves libouter's needs
	// too, DT_RUNPATH does not.
	write("inner.c", "int inner(void) { return 3; }\n")
	write("outer.c", "int inner(void);\nint outer(void) { return inner(); }\n")
	write("main.c", "int outer(void);\nint main(void) { return outer() == 3 ? 0 : 1; }\n")
	b.libInner = gcc("-shared", "-fPIC", "-Wl,-soname,libinner.so", "inner.c", "libinner.so")
	b.libOuter = gcc("-shared", "-fPIC", "-Wl,-soname,libouter.so", "outer.c", "-L.", "-linner", "libouter.so")
	b.rpathApp = gcc("main.c", "-L.", "-louter", "-Wl,-rpath-link,.", "-Wl,--disable-new-dtags,-rpath,$ORIGIN/../lib/demo", "rpathapp")
	b.runpathApp = gcc("main.c", "-L.", "-louter", "-Wl,-rpath-link,.", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../lib/demo", "runpathapp")
	return b
}

// compile runs the compiler cc in dir with args, the last of which names
// the output, and returns the output.
func compile(t *testing.T, dir, cc string, args ...string) []byte {
	t.Helper()
	out := args[len(args)-1]
	cmd := exec.Command(cc, append(args[:len(args)-1:len(args)-1], "-o", out)...)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", cc, args, err, b)
	}
	b, err := os.ReadFile(filepath.Join(dir, out))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rpathOps installs the search path programs of b.
func (b fooBuild) rpathOps() []treeOp {
	return []treeOp{
		{mkdir: "/usr/lib/demo"},
		{write: "/usr/lib/demo/libouter.so", data: b.libOuter, perm: 0o644},
		{write: "/usr/lib/demo/libinner.so", data: b.libInner, perm: 0o644},
		{write: "/usr/bin/rpathapp", data: b.rpathApp, perm: 0o755},
		{write: "/usr/bin/runpathapp", data: b.runpathApp, perm: 0o755},
	}
}

// TestOracleHelpers checks the oracle's own tools on a small tree: the
// overlay sees what the copy holds, and the copy leaves the tree it
// shares inodes with as it was.
func TestOracleHelpers(t *testing.T) {
	base := t.TempDir()
	for p, s := range map[string]string{"/a/x": "x", "/a/y": "y"} {
		os.MkdirAll(filepath.Join(base, path.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(base, p), []byte(s), 0o644)
	}
	ops := []treeOp{{remove: "/a/x"}, {mkdir: "/b"}, {write: "/b/z", data: []byte("zz"), perm: 0o600}, {write: "/a/y", data: []byte("new"), perm: 0o644}}
	o := newOverlay(base, ops)
	if _, err := o.Lstat("/a/x"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Lstat(removed) = %v, want fs.ErrNotExist", err)
	}
	if e, err := o.Lstat("/b/z"); err != nil || e.Mode != 0o600 {
		t.Errorf("Lstat(added) = %+v, %v", e, err)
	}
	b := make([]byte, 3)
	if n, err := o.ReadAt("/a/y", b, 0); (err != nil && err != io.EOF) || string(b[:n]) != "new" {
		t.Errorf("ReadAt(rewritten) = %q, %v", b[:n], err)
	}
	if got := slices.Sorted(maps.Keys(o.added)); len(got) != 3 {
		t.Errorf("added %v", got)
	}
	root := copyTree(t, base, ops)
	for p, want := range map[string]string{"/a/y": "new", "/b/z": "zz"} {
		if b, err := os.ReadFile(root + p); err != nil || string(b) != want {
			t.Errorf("copy %s = %q, %v; want %q", p, b, err, want)
		}
	}
	if _, err := os.Stat(root + "/a/x"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("copy still has /a/x: %v", err)
	}
	if b, err := os.ReadFile(base + "/a/y"); err != nil || string(b) != "y" {
		t.Errorf("the base's /a/y is now %q, %v: the copy wrote through a hard link", b, err)
	}
	if _, err := os.Stat(base + "/a/x"); err != nil {
		t.Errorf("the base lost /a/x: %v", err)
	}
}

// TestLoaderOracleMusl builds an Alpine-like tree (busybox-static, musl's
// loader, a program built with musl-gcc against a library of its own)
// and compares the check with musl's loader (`ld-musl --list`) on its
// programs, with the library in place, missing, in a directory only the
// loader's path file names, and only LD_LIBRARY_PATH.
func TestLoaderOracleMusl(t *testing.T) {
	if testing.Short() {
		t.Skip("chroot in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	const loader = "/lib/ld-musl-x86_64.so.1"
	libc, err := os.ReadFile("/usr/lib/x86_64-linux-musl/libc.so")
	busybox, err2 := os.ReadFile("/bin/busybox")
	if _, err3 := exec.LookPath("musl-gcc"); errors.Join(err, err2, err3) != nil {
		t.Skipf("musl, musl-tools and busybox-static build the tree (make deps installs them): %v", errors.Join(err, err2, err3))
	}
	dir := t.TempDir()
	musl := func(args ...string) []byte { return compile(t, dir, "musl-gcc", args...) }
	os.WriteFile(filepath.Join(dir, "greet.c"), []byte("int greet(void) { return 7; }\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "main.c"), []byte("int greet(void);\nint main(void) { return greet() == 7 ? 0 : 1; }\n"), 0o644)
	libGreet := musl("-shared", "-fPIC", "-Wl,-soname,libgreet.so", "greet.c", "libgreet.so")
	greet := musl("main.c", "-L.", "-lgreet", "greet")
	greetRpath := musl("main.c", "-L.", "-lgreet", "-Wl,-rpath,$ORIGIN/../lib/greet", "greet-rpath")

	build := func(t *testing.T, ops []treeOp) string {
		root := t.TempDir()
		for _, op := range append([]treeOp{
			{mkdir: "/lib"}, {mkdir: "/bin"}, {mkdir: "/usr/bin"}, {mkdir: "/usr/lib/greet"}, {mkdir: "/etc"}, {mkdir: "/opt/greet"},
			{write: loader, data: libc, perm: 0o755},
			{write: "/bin/busybox", data: busybox, perm: 0o755},
			{write: "/usr/bin/greet", data: greet, perm: 0o755},
			{write: "/usr/bin/greet-rpath", data: greetRpath, perm: 0o755},
			{write: "/etc/passwd", data: []byte("root:x:0:0:root:/root:/bin/sh\n"), perm: 0o644},
		}, ops...) {
			switch {
			case op.mkdir != "":
				os.MkdirAll(root+op.mkdir, 0o755)
			case op.write != "":
				if err := os.WriteFile(root+op.write, op.data, op.perm); err != nil {
					t.Fatal(err)
				}
			}
		}
		return root
	}
	muslVerdict := func(root, prog string, env []string) startVerdict {
		head, _ := dirFS(root).ReadHead(prog, headSize)
		if info, err := parseELF(head); err == nil && info.interp == "" {
			// Static: the kernel runs it.
			if out, err := exec.Command("chroot", root, prog, "true").CombinedOutput(); err != nil {
				return startVerdict{why: fmt.Sprintf("%v: %s", err, out)}
			}
			return startVerdict{ok: true, libs: map[string]string{}}
		}
		cmd := exec.Command("chroot", root, loader, "--list", prog)
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil || stderr.Len() > 0 {
			return startVerdict{why: strings.TrimSpace(stderr.String() + " " + fmt.Sprint(err))}
		}
		libs := map[string]string{}
		for line := range strings.SplitSeq(stdout.String(), "\n") {
			if name, rest, ok := strings.Cut(strings.TrimSpace(line), " => "); ok {
				libs[name], _, _ = strings.Cut(rest, " (")
			}
		}
		return startVerdict{ok: true, libs: libs}
	}
	cases := []struct {
		name    string
		ops     []treeOp
		env     []string
		failing []string
	}{
		{name: "Alpine", ops: []treeOp{{write: "/usr/lib/greet/libgreet.so", data: libGreet, perm: 0o644}, {write: "/usr/lib/libgreet.so", data: libGreet, perm: 0o644}}},
		{name: "LibraryMissing", failing: []string{"/usr/bin/greet", "/usr/bin/greet-rpath"}},
		{name: "PathFile", ops: []treeOp{{write: "/opt/greet/libgreet.so", data: libGreet, perm: 0o644},
			{write: "/etc/ld-musl-x86_64.path", data: []byte("/opt/greet\n/usr/lib\n"), perm: 0o644}}},
		{name: "PathFileWithout", ops: []treeOp{{write: "/usr/lib/libgreet.so", data: libGreet, perm: 0o644},
			{write: "/etc/ld-musl-x86_64.path", data: []byte("/opt/greet\n"), perm: 0o644}}, failing: []string{"/usr/bin/greet", "/usr/bin/greet-rpath"}},
		{name: "LibraryPath", ops: []treeOp{{write: "/opt/greet/libgreet.so", data: libGreet, perm: 0o644}}, env: []string{"LD_LIBRARY_PATH=/opt/greet"}},
	}
	var summary []string
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := build(t, tc.ops)
			env := append([]string{"PATH=/usr/bin:/bin"}, tc.env...)
			var st oracleStats
			for _, prog := range []string{"/bin/busybox", "/usr/bin/greet", "/usr/bin/greet-rpath"} {
				got, r := checkVerdict(dirFS(root), prog, env, "")
				want := muslVerdict(root, prog, env)
				if !want.ok && !slices.Contains(tc.failing, prog) {
					t.Errorf("%s fails to load in case %s: %s", prog, tc.name, want.why)
				}
				st.compare(t, prog, want, got, r, tc.failing)
			}
			summary = append(summary, st.line(tc.name))
		})
	}
	t.Logf("check vs musl's loader:\n%s", strings.Join(summary, "\n"))
}
