package startcheck

import (
	"debug/elf"
	"encoding/binary"
	"maps"
	"reflect"
	"strings"
	"testing"
)

// libWants is what a loader case expects of the libraries: name to path
// for those named, nothing of those mapped to "".
type libWants map[string]string

func expectLibs(t *testing.T, r Result, w libWants) {
	t.Helper()
	for name, p := range w {
		if got, ok := r.Libraries[name]; p == "" && ok || p != "" && got != p {
			t.Errorf("Check: Libraries[%q] = %q, want %q (libraries %v)", name, got, p, r.Libraries)
		}
	}
}

// TestGlibcSearch checks glibc's search order and rules on crafted
// objects: each case adds files to glibcTree and runs /usr/bin/app.
func TestGlibcSearch(t *testing.T) {
	// multi is where the libraries are; the loader finds them through
	// the /lib symlink first.
	const multi = "/usr/lib/x86_64-linux-gnu"
	libA := dynOpts{soname: "liba.so.1", needed: []string{"libc.so.6"}}
	tests := []struct {
		name  string
		setup func(m *memFS)
		env   []string
		wd    string
		want  want
		libs  libWants
	}{
		{
			name: "DefaultDirs",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1", "libc.so.6"}}).lib(multi+"/liba.so.1", libA)
			},
			want: want{result: ResultOK},
			// Found as the loader opens it: /lib first, a symlink to
			// usr/lib in a merged-/usr tree.
			libs: libWants{"liba.so.1": "/lib/x86_64-linux-gnu/liba.so.1", "libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6", "ld-linux-x86-64.so.2": amd64Loader},
		},
		{
			name:  "NotFound",
			setup: func(m *memFS) { m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"libssl.so.3", "libc.so.6"}}) },
			want:  want{result: ResultFailed, problems: 1, first: []string{`library "libssl.so.3" needed by "/usr/bin/app" not found (searched: /etc/ld.so.cache, "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")`}},
		},
		{
			name: "Transitive",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", dynOpts{needed: []string{"libb.so.1"}})
			},
			want: want{result: ResultFailed, first: []string{`library "libb.so.1" needed by "/lib/x86_64-linux-gnu/liba.so.1" (loaded for "/usr/bin/app") not found`}},
		},
		{
			name: "LDLibraryPath",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib("/opt/lib/liba.so.1", libA).lib(multi+"/liba.so.1", libA)
			},
			env:  []string{"LD_LIBRARY_PATH=/nowhere;/opt/lib/"},
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/opt/lib/liba.so.1"},
		},
		{
			name: "LDLibraryPathEmptyIsWorkingDir",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib("/srv/liba.so.1", libA)
			},
			env:  []string{"LD_LIBRARY_PATH=/nowhere:"},
			wd:   "/srv",
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/srv/liba.so.1"},
		},
		{
			name: "RpathBeforeLDLibraryPath",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}, rpath: ptr("$ORIGIN/../lib/app")}).
					lib("/usr/lib/app/liba.so.1", libA).lib("/opt/lib/liba.so.1", libA)
			},
			env:  []string{"LD_LIBRARY_PATH=/opt/lib"},
			want: want{result: ResultOK},
			// As the loader opens it: $ORIGIN joined, not cleaned.
			libs: libWants{"liba.so.1": "/usr/bin/../lib/app/liba.so.1"},
		},
		{
			name: "RunpathAfterLDLibraryPath",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}, runpath: ptr("${ORIGIN}/../lib/app"), rpath: ptr("/nowhere")}).
					lib("/usr/lib/app/liba.so.1", libA).lib("/opt/lib/liba.so.1", libA)
			},
			env:  []string{"LD_LIBRARY_PATH=/opt/lib"},
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/opt/lib/liba.so.1"},
		},
		{
			// The program's DT_RPATH serves its libraries' needs too;
			// a DT_RUNPATH serves only its own.
			name: "RpathInherited",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}, rpath: ptr("/opt/app")}).
					lib("/opt/app/liba.so.1", dynOpts{needed: []string{"libb.so.1"}}).lib("/opt/app/libb.so.1", dynOpts{})
			},
			want: want{result: ResultOK},
			libs: libWants{"libb.so.1": "/opt/app/libb.so.1"},
		},
		{
			name: "RunpathNotInherited",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}, runpath: ptr("/opt/app")}).
					lib("/opt/app/liba.so.1", dynOpts{needed: []string{"libb.so.1"}}).lib("/opt/app/libb.so.1", dynOpts{})
			},
			want: want{result: ResultFailed, first: []string{`library "libb.so.1" needed by "/opt/app/liba.so.1"`, "not found"}},
		},
		{
			// A library with a DT_RUNPATH does not search the DT_RPATH
			// of the objects that loaded it.
			name: "RunpathStopsRpathChain",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}, rpath: ptr("/opt/app")}).
					lib("/opt/app/liba.so.1", dynOpts{needed: []string{"libb.so.1"}, runpath: ptr("/nowhere")}).lib("/opt/app/libb.so.1", dynOpts{})
			},
			want: want{result: ResultFailed, first: []string{`library "libb.so.1"`, "not found"}},
		},
		{
			name: "LibToken",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}, runpath: ptr("/opt/$LIB")}).lib("/opt/lib64/liba.so.1", libA)
			},
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/opt/lib64/liba.so.1"},
		},
		{
			name: "PlatformToken",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}, runpath: ptr("/opt/$PLATFORM")}).lib("/opt/x86_64/liba.so.1", libA)
			},
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/opt/x86_64/liba.so.1"},
		},
		{
			name: "NeededPath",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"$ORIGIN/../share/liba.so.1", "./libb.so"}}).
					lib("/usr/share/liba.so.1", libA).lib("/srv/libb.so", dynOpts{})
			},
			wd:   "/srv",
			want: want{result: ResultOK},
			libs: libWants{"$ORIGIN/../share/liba.so.1": "/usr/bin/../share/liba.so.1", "./libb.so": "/srv/libb.so"},
		},
		{
			name: "Cache",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib("/opt/cached/liba.so.1", libA)
				m.file("/etc/ld.so.cache", 0o644, mkLDCache([]ldCacheEntry{{name: "liba.so.1", path: "/opt/cached/liba.so.1", flags: 0x0303}}, cacheNew, binary.LittleEndian))
			},
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/opt/cached/liba.so.1"},
		},
		{
			// A stale entry: the loader goes on to the system
			// directories.
			name: "CacheStale",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", libA)
				m.file("/etc/ld.so.cache", 0o644, mkLDCache([]ldCacheEntry{{name: "liba.so.1", path: "/gone/liba.so.1", flags: 0x0303}}, cacheNew, binary.LittleEndian))
			},
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/lib/x86_64-linux-gnu/liba.so.1"},
		},
		{
			name: "CacheOtherABI",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib("/opt/cached/liba.so.1", libA)
				m.file("/etc/ld.so.cache", 0o644, mkLDCache([]ldCacheEntry{{name: "liba.so.1", path: "/opt/cached/liba.so.1", flags: 0x0003}}, cacheNew, binary.LittleEndian))
			},
			want: want{result: ResultFailed, first: []string{`library "liba.so.1"`, "not found"}},
		},
		{
			name: "NodeflibSkipsSystem",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}, flags1: elf.DF_1_NODEFLIB}).lib(multi+"/liba.so.1", libA)
			},
			want: want{result: ResultFailed, first: []string{`library "liba.so.1"`, "not found (searched: /etc/ld.so.cache)"}},
		},
		{
			name: "SonameAlreadyLoaded",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"/opt/x/liba-impl.so", "liba.so.1"}}).lib("/opt/x/liba-impl.so", libA)
			},
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/opt/x/liba-impl.so"},
		},
		{
			name:  "LoaderByItsName",
			setup: func(m *memFS) { m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"ld-linux-x86-64.so.2"}}) },
			want:  want{result: ResultOK},
			libs:  libWants{"ld-linux-x86-64.so.2": amd64Loader},
		},
		{
			name: "OtherClassPassedOver",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", libA).
					lib("/opt/lib/liba.so.1", dynOpts{class: elf.ELFCLASS32, machine: elf.EM_386})
			},
			env:  []string{"LD_LIBRARY_PATH=/opt/lib"},
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/lib/x86_64-linux-gnu/liba.so.1"},
		},
		{
			name: "OtherMachinePassedOver",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).
					lib("/opt/lib/liba.so.1", dynOpts{machine: elf.EM_AARCH64})
			},
			env:  []string{"LD_LIBRARY_PATH=/opt/lib"},
			want: want{result: ResultFailed, first: []string{`not found`, `passed over: "/opt/lib/liba.so.1" is an ELF for AArch64`}},
		},
		{
			name: "NotELFStops",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", libA)
				// A linker script, as libc.so is: longer than an ELF
				// header, else the loader finds it too short first.
				m.file("/opt/lib/liba.so.1", 0o644, []byte("/* GNU ld script */\nOUTPUT_FORMAT(elf64-x86-64)\nGROUP ( /lib/x86_64-linux-gnu/liba.so.1.2 )\n"))
			},
			env:  []string{"LD_LIBRARY_PATH=/opt/lib"},
			want: want{result: ResultFailed, first: []string{`the loader stops at "/opt/lib/liba.so.1": invalid ELF header`}},
		},
		{
			// Its machine, read in the loader's byte order, is not
			// x86-64: passed over (as Debian's loader does).
			name: "OtherByteOrderPassedOver",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", libA).
					lib("/opt/lib/liba.so.1", dynOpts{order: binary.BigEndian})
			},
			env:  []string{"LD_LIBRARY_PATH=/opt/lib"},
			want: want{result: ResultOK},
			libs: libWants{"liba.so.1": "/lib/x86_64-linux-gnu/liba.so.1"},
		},
		{
			// Marked big-endian, its machine reads as x86-64: the
			// loader stops.
			name: "ByteOrderStops",
			setup: func(m *memFS) {
				b := mkDynELF(dynOpts{})
				b[elf.EI_DATA] = byte(elf.ELFDATA2MSB)
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", libA).
					file("/opt/lib/liba.so.1", 0o644, b)
			},
			env:  []string{"LD_LIBRARY_PATH=/opt/lib"},
			want: want{result: ResultFailed, first: []string{`"/opt/lib/liba.so.1": ELF file data encoding not little-endian`}},
		},
		{
			name: "ExecutableStops",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", dynOpts{typ: elf.ET_EXEC})
			},
			want: want{result: ResultFailed, first: []string{"cannot dynamically load executable"}},
		},
		{
			name: "PIEStops",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", dynOpts{flags1: elf.DF_1_PIE})
			},
			want: want{result: ResultFailed, first: []string{"cannot dynamically load position-independent executable"}},
		},
		{
			name: "NoDynamicStops",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", dynOpts{noDynamic: true})
			},
			want: want{result: ResultFailed, first: []string{"object file has no dynamic section"}},
		},
		{
			name: "DirectoryStops",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).lib(multi+"/liba.so.1", libA).dir("/opt/lib/liba.so.1")
			},
			env:  []string{"LD_LIBRARY_PATH=/opt/lib"},
			want: want{result: ResultFailed, first: []string{"cannot read file data (a directory)"}},
		},
		{
			name: "SameFileTwoNames",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so", "liba.so.1"}}).lib(multi+"/liba.so.1.2.3", dynOpts{}).
					link(multi+"/liba.so", "liba.so.1.2.3").link(multi+"/liba.so.1", "liba.so.1.2.3")
			},
			want: want{result: ResultOK},
			libs: libWants{"liba.so": "/lib/x86_64-linux-gnu/liba.so", "liba.so.1": "/lib/x86_64-linux-gnu/liba.so.1"},
		},
		{
			name: "Preload",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{}).lib("/opt/pre.so", dynOpts{needed: []string{"libc.so.6"}})
			},
			env:  []string{"LD_PRELOAD=/opt/pre.so /opt/missing.so"},
			want: want{result: ResultWarnings, first: []string{`library "/opt/missing.so" of LD_PRELOAD for "/usr/bin/app" not found`, "the loader ignores it"}},
			libs: libWants{"/opt/pre.so": "/opt/pre.so", "libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6"},
		},
		{
			name: "VersionMissing",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"libc.so.6"}, needs: []dynNeed{{"libc.so.6", []string{"GLIBC_2.34", "GLIBC_2.99"}}}})
			},
			want: want{result: ResultFailed, problems: 1, first: []string{`version "GLIBC_2.99" of "libc.so.6" ("/lib/x86_64-linux-gnu/libc.so.6") not found, required by "/usr/bin/app"`}},
		},
		{
			name: "VersionOfLibrary",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}}).
					lib(multi+"/liba.so.1", dynOpts{needed: []string{"libc.so.6"}, needs: []dynNeed{{"libc.so.6", []string{"GLIBC_2.40"}}}})
			},
			want: want{result: ResultFailed, first: []string{`version "GLIBC_2.40" of "libc.so.6"`, `required by "/lib/x86_64-linux-gnu/liba.so.1"`}},
		},
		{
			name: "VersionWeak",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"libc.so.6"}, needs: []dynNeed{{"libc.so.6", []string{"~GLIBC_2.99"}}}})
			},
			want: want{result: ResultOK},
		},
		{
			// An object that defines no versions satisfies any need.
			name: "VersionOfUnversioned",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"liba.so.1"}, needs: []dynNeed{{"liba.so.1", []string{"A_9"}}}}).lib(multi+"/liba.so.1", libA)
			},
			want: want{result: ResultOK},
		},
		{
			name: "VersionOfLoader",
			setup: func(m *memFS) {
				m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"libc.so.6", "ld-linux-x86-64.so.2"}, needs: []dynNeed{{"ld-linux-x86-64.so.2", []string{"GLIBC_2.35"}}}})
			},
			want: want{result: ResultFailed, first: []string{`version "GLIBC_2.35" of "ld-linux-x86-64.so.2" ("/lib64/ld-linux-x86-64.so.2") not found`}},
		},
		{
			name: "Interpreter32BitLoader",
			setup: func(m *memFS) {
				m.file("/usr/bin/app", 0o755, mkDynELF(dynOpts{class: elf.ELFCLASS32, machine: elf.EM_386, interp: "/lib/ld-linux.so.2", needed: []string{"libc.so.6"}}))
				m.file("/usr/lib/ld-linux.so.2", 0o755, mkDynELF(dynOpts{soname: "ld-linux.so.2"}))
				m.lib("/usr/lib/i386-linux-gnu/libc.so.6", dynOpts{class: elf.ELFCLASS32, machine: elf.EM_386})
			},
			want: want{result: ResultFailed, first: []string{`loader "/lib/ld-linux.so.2"`, "is an ELF for x86-64 (64-bit, little-endian), the program for Intel 80386 (32-bit, little-endian)"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := glibcTree()
			tt.setup(m)
			r := Check(m, Spec{Argv: []string{"/usr/bin/app"}, Env: tt.env, WorkingDir: tt.wd, Arch: "amd64"})
			t.Logf("Check = %s", mustJSON(t, r))
			expect(t, r, tt.want)
			expectLibs(t, r, tt.libs)
			checkBounds(t, r)
		})
	}
}

// TestMuslSearch checks musl's search order and rules on crafted objects:
// an Alpine-like tree whose loader is musl's libc.
func TestMuslSearch(t *testing.T) {
	const muslLoader = "/lib/ld-musl-x86_64.so.1"
	tree := func() *memFS {
		m := newFS()
		m.file("/lib/libc.musl-x86_64.so.1", 0o755, mkDynELF(dynOpts{soname: "libc.musl-x86_64.so.1"}))
		m.link(muslLoader, "libc.musl-x86_64.so.1")
		m.dir("/usr/bin").dir("/usr/lib").dir("/usr/local/lib").dir("/bin")
		m.file("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
		return m
	}
	app := func(o dynOpts) dynOpts { o.interp = muslLoader; return o }
	tests := []struct {
		name  string
		setup func(m *memFS)
		env   []string
		want  want
		libs  libWants
	}{
		{
			name: "ReservedNamesAreLibc",
			setup: func(m *memFS) {
				m.file("/usr/bin/app", 0o755, mkDynELF(app(dynOpts{needed: []string{"libc.so", "libpthread.so.0", "libm.so.6"}})))
			},
			want: want{result: ResultOK},
			libs: libWants{"libc.so": muslLoader, "libpthread.so.0": muslLoader, "libm.so.6": muslLoader},
		},
		{
			name: "DefaultPath",
			setup: func(m *memFS) {
				m.file("/usr/bin/app", 0o755, mkDynELF(app(dynOpts{needed: []string{"libz.so.1"}}))).lib("/usr/local/lib/libz.so.1", dynOpts{})
			},
			want: want{result: ResultOK},
			libs: libWants{"libz.so.1": "/usr/local/lib/libz.so.1"},
		},
		{
			name:  "NotFound",
			setup: func(m *memFS) { m.file("/usr/bin/app", 0o755, mkDynELF(app(dynOpts{needed: []string{"libz.so.1"}}))) },
			want:  want{result: ResultFailed, first: []string{`library "libz.so.1" needed by "/usr/bin/app" not found (searched: "/lib", "/usr/local/lib", "/usr/lib")`}},
		},
		{
			name: "PathFile",
			setup: func(m *memFS) {
				m.file("/usr/bin/app", 0o755, mkDynELF(app(dynOpts{needed: []string{"libz.so.1"}}))).lib("/usr/lib/libz.so.1", dynOpts{}).lib("/opt/z/libz.so.1", dynOpts{})
				m.file("/etc/ld-musl-x86_64.path", 0o644, []byte("/opt/y\n/opt/z:/usr/lib\n"))
			},
			want: want{result: ResultOK},
			libs: libWants{"libz.so.1": "/opt/z/libz.so.1"},
		},
		{
			// Only the path file's directories: /usr/lib is no longer
			// searched.
			name: "PathFileReplacesDefault",
			setup: func(m *memFS) {
				m.file("/usr/bin/app", 0o755, mkDynELF(app(dynOpts{needed: []string{"libz.so.1"}}))).lib("/usr/lib/libz.so.1", dynOpts{})
				m.file("/etc/ld-musl-x86_64.path", 0o644, []byte("/opt/z\n"))
			},
			want: want{result: ResultFailed, first: []string{`not found (searched: "/opt/z")`}},
		},
		{
			name: "LDLibraryPathFirst",
			setup: func(m *memFS) {
				m.file("/usr/bin/app", 0o755, mkDynELF(app(dynOpts{needed: []string{"libz.so.1"}, rpath: ptr("/opt/r")}))).lib("/opt/r/libz.so.1", dynOpts{}).lib("/opt/l/libz.so.1", dynOpts{})
			},
			env:  []string{"LD_LIBRARY_PATH=/opt/l"},
			want: want{result: ResultOK},
			libs: libWants{"libz.so.1": "/opt/l/libz.so.1"},
		},
		{
			// musl searches the DT_RUNPATH of the objects that loaded
			// the needing one too, unlike glibc.
			name: "RunpathInherited",
			setup: func(m *memFS) {
				m.file("/usr/bin/app", 0o755, mkDynELF(app(dynOpts{needed: []string{"liba.so"}, runpath: ptr("$ORIGIN/../app")}))).
					lib("/usr/app/liba.so", dynOpts{needed: []string{"libb.so"}}).lib("/usr/app/libb.so", dynOpts{})
			},
			want: want{result: ResultOK},
			libs: libWants{"libb.so": "/usr/bin/../app/libb.so"},
		},
		{
			name: "OtherMachineFails",
			setup: func(m *memFS) {
				m.file("/usr/bin/app", 0o755, mkDynELF(app(dynOpts{needed: []string{"libz.so.1"}}))).lib("/lib/libz.so.1", dynOpts{machine: elf.EM_AARCH64}).lib("/usr/lib/libz.so.1", dynOpts{})
			},
			want: want{result: ResultFailed, first: []string{`the loader stops at "/lib/libz.so.1": Exec format error (an ELF for AArch64`}},
		},
		{
			name: "NoVersionChecks",
			setup: func(m *memFS) {
				m.file("/usr/bin/app", 0o755, mkDynELF(app(dynOpts{needed: []string{"libc.so"}, needs: []dynNeed{{"libc.so", []string{"GLIBC_2.99"}}}})))
			},
			want: want{result: ResultOK},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tree()
			tt.setup(m)
			r := Check(m, Spec{Argv: []string{"/usr/bin/app"}, Env: tt.env, Arch: "amd64"})
			t.Logf("Check = %s", mustJSON(t, r))
			expect(t, r, tt.want)
			expectLibs(t, r, tt.libs)
		})
	}
	t.Run("PathFileBesideThePrefix", func(t *testing.T) {
		// A loader in /usr/lib reads /usr/etc/ld-musl-ARCH.path.
		m := tree()
		m.file("/usr/lib/ld-musl-x86_64.so.1", 0o755, mkDynELF(dynOpts{}))
		m.file("/usr/bin/app", 0o755, mkDynELF(dynOpts{interp: "/usr/lib/ld-musl-x86_64.so.1", needed: []string{"libz.so.1"}})).lib("/opt/z/libz.so.1", dynOpts{})
		m.file("/usr/etc/ld-musl-x86_64.path", 0o644, []byte("/opt/z"))
		r := Check(m, Spec{Argv: []string{"/usr/bin/app"}, Arch: "amd64"})
		expect(t, r, want{result: ResultOK})
		expectLibs(t, r, libWants{"libz.so.1": "/opt/z/libz.so.1"})
	})
}

func TestMuslReserved(t *testing.T) {
	for name, want := range map[string]bool{"libc.so": true, "libc.so.6": true, "libpthread.so.0": true, "libm.so.6": true, "libdl.so.2": true,
		"librt.so.1": true, "libutil.so.1": true, "libxnet.so": true, "libcrypt.so.1": false, "libcrypto.so.3": false, "libz.so.1": false, "c.so": false} {
		if got := muslReserved(name); got != want {
			t.Errorf("muslReserved(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestExpandDST(t *testing.T) {
	pr := &process{c: &checker{wd: "/srv"}, arch: archOf(elfIdent{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_X86_64})}
	pr.main = &object{path: "/usr/bin/app", real: "/opt/app/bin/app"}
	lib := &object{path: "/usr/lib/x86_64-linux-gnu/libx.so"}
	for _, tt := range []struct {
		in   string
		o    *object
		want []string
	}{
		{"$ORIGIN/../lib", pr.main, []string{"/opt/app/bin/../lib"}},
		{"${ORIGIN}/x/", lib, []string{"/usr/lib/x86_64-linux-gnu/x"}},
		{"/opt/$LIB", pr.main, []string{"/opt/lib/x86_64-linux-gnu", "/opt/lib64"}},
		{"/p/$PLATFORM/$LIB", lib, []string{"/p/x86_64/lib/x86_64-linux-gnu", "/p/x86_64/lib64"}},
		{"/a/$ORIGINX/$FOO/${LIB", lib, []string{"/a/$ORIGINX/$FOO/${LIB"}},
		{"$ORIGIN", nil, nil},
		{"/", lib, []string{"/"}},
	} {
		got, _ := pr.expandDST(tt.in, tt.o)
		if strings.Join(got, "|") != strings.Join(tt.want, "|") {
			t.Errorf("expandDST(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestLibrariesBounded loads more libraries than a check may and than a
// result shows: the check stops with a warning, and the result names at
// most maxLibrariesShown.
func TestLibrariesBounded(t *testing.T) {
	m := glibcTree()
	var names []string
	for i := range maxLibraries + 10 {
		name := "lib" + strings.Repeat("x", 40) + string(rune('a'+i%26)) + strings.Repeat("y", i/26) + ".so"
		names = append(names, name)
		m.lib("/usr/lib/x86_64-linux-gnu/"+name, dynOpts{})
	}
	m.prog("/usr/bin/app", 0o755, dynOpts{needed: names})
	fsys := &countingFS{FS: m}
	r := Check(fsys, Spec{Argv: []string{"/usr/bin/app"}, Arch: "amd64"})
	if r.Result != ResultWarnings || !strings.Contains(strings.Join(r.Problems, "\n"), "more than 256 libraries in one check") {
		t.Errorf("Check = %.600s; want a warning that the check stopped at 256 libraries", mustJSON(t, r))
	}
	if len(r.Libraries) > maxLibrariesShown || r.LibrariesOmitted == 0 || len(r.Libraries)+r.LibrariesOmitted != maxLibraries {
		t.Errorf("Check: %d libraries shown, %d omitted; want at most %d shown of %d", len(r.Libraries), r.LibrariesOmitted, maxLibrariesShown, maxLibraries)
	}
	checkBounds(t, r)

	// Nested deeper than maxDepth.
	m = glibcTree()
	for i := range maxDepth + 2 {
		m.lib("/usr/lib/x86_64-linux-gnu/libd"+string(rune('a'+i))+".so", dynOpts{needed: []string{"libd" + string(rune('a'+i+1)) + ".so"}})
	}
	m.prog("/usr/bin/app", 0o755, dynOpts{needed: []string{"libda.so"}})
	r = Check(m, Spec{Argv: []string{"/usr/bin/app"}, Arch: "amd64"})
	if r.Result != ResultWarnings || !strings.Contains(strings.Join(r.Problems, "\n"), "nested more than 16 deep") {
		t.Errorf("Check = %.600s; want a warning that libraries nest too deep", mustJSON(t, r))
	}
}

// TestBoundedLibraries bounds recorded libraries: the room left by the
// other fields, names and paths cut, a count of the rest.
func TestBoundedLibraries(t *testing.T) {
	libs := map[string]string{}
	for i := range 500 {
		libs[strings.Repeat("<", 200)+string(rune('a'+i%26))+strings.Repeat("b", i/26)] = strings.Repeat("/<", 400)
	}
	r := Result{Result: "ok", Libraries: libs}
	b := r.Bounded()
	checkBounds(t, b)
	if len(b.Libraries) > maxLibrariesShown || len(b.Libraries)+b.LibrariesOmitted != len(libs) {
		t.Errorf("Bounded: %d libraries and %d omitted, of %d", len(b.Libraries), b.LibrariesOmitted, len(libs))
	}
	if again := b.Bounded(); !maps.Equal(again.Libraries, b.Libraries) || again.LibrariesOmitted != b.LibrariesOmitted {
		t.Errorf("Bounded is not idempotent on libraries")
	}
	// A few short libraries fit whole beside the largest other fields.
	w := worstResult()
	w.Libraries = map[string]string{"libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6", "libz.so.1": "/lib/x86_64-linux-gnu/libz.so.1"}
	if b := w.Bounded(); len(b.Libraries) != 2 || b.LibrariesOmitted != 0 {
		t.Errorf("Bounded(worst result with 2 libraries) kept %v, omitted %d", b.Libraries, b.LibrariesOmitted)
	}
}

// TestLDCacheLookup keeps, per name, the entry the loader of one ABI
// takes: its flags, a plain directory before a glibc-hwcaps one.
func TestLDCacheLookup(t *testing.T) {
	amd64 := archOf(elfIdent{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_X86_64})
	c := newLDCache(cacheEntries, amd64.cacheFlagsOK)
	want := ldCache{"libz.so.1": "/lib/x86_64-linux-gnu/libz.so.1", "libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
		"libfast.so.1": "/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libfast.so.1"}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("amd64 cache = %v, want %v", c, want)
	}
	i386 := archOf(elfIdent{elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_386})
	if c := newLDCache(cacheEntries, i386.cacheFlagsOK); len(c) != 1 || c["libc.so.6"] != "/lib/i386-linux-gnu/libc.so.6" {
		t.Errorf("i386 cache = %v, want the 32-bit libc only", c)
	}
}
