package startcheck

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// readDynamicOf parses the headers of the file at p of fsys and reads its
// dynamic section with a fresh budget.
func readDynamicOf(fsys FS, p string) (dynamic, *fileReader, error) {
	fr := newFileReader(fsys, p, &readBudget{left: maxCheckRead})
	info, err := headerOf(fr)
	if err != nil {
		return dynamic{}, fr, err
	}
	d, err := newELFReader(fr, info).readDynamic()
	return d, fr, err
}

func TestReadDynamic(t *testing.T) {
	lib := dynOpts{needed: []string{"libz.so.1", "libc.so.6"}, soname: "libapp.so.2", rpath: ptr("/opt/rpath"), flags1: elf.DF_1_NODEFLIB,
		needs: []dynNeed{{"libc.so.6", []string{"GLIBC_2.2.5", "~GLIBC_2.34"}}, {"libz.so.1", []string{"ZLIB_1.2.9"}}},
		defs:  []string{"libapp.so.2", "APP_1.0", "APP_2.0"}}
	want := dynamic{needed: []string{"libz.so.1", "libc.so.6"}, soname: "libapp.so.2", rpath: "/opt/rpath", hasRPath: true, flags1: elf.DF_1_NODEFLIB,
		needs: []verNeed{
			{"libc.so.6", []version{{"GLIBC_2.2.5", elfHash("GLIBC_2.2.5"), 0}, {"GLIBC_2.34", elfHash("GLIBC_2.34"), verFlgWeak}}},
			{"libz.so.1", []version{{"ZLIB_1.2.9", elfHash("ZLIB_1.2.9"), 0}}},
		},
		defs:    []version{{"libapp.so.2", elfHash("libapp.so.2"), verFlgBase}, {"APP_1.0", elfHash("APP_1.0"), 0}, {"APP_2.0", elfHash("APP_2.0"), 0}},
		hasDefs: true}
	for _, tc := range []struct {
		name string
		o    dynOpts
		want dynamic
	}{
		{"Library", lib, want},
		{"BigEndian32", func() dynOpts {
			o := lib
			o.class, o.order, o.machine = elf.ELFCLASS32, binary.BigEndian, elf.EM_PPC
			return o
		}(), want},
		{"RunpathHidesRpath", dynOpts{rpath: ptr("/a"), runpath: ptr("")},
			dynamic{hasRunPath: true}},
		{"NoDynamic", dynOpts{noDynamic: true}, dynamic{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFS().file("/x", 0o644, mkDynELF(tc.o))
			got, _, err := readDynamicOf(m, "/x")
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("readDynamic = %+v, %v\nwant %+v", got, err, tc.want)
			}
		})
	}
	t.Run("FarIntoTheFile", func(t *testing.T) {
		// Far beyond what a header read covers, as in a node binary (86 MB
		// in): a few pages read.
		o := lib
		o.far = 16 << 20
		b := mkDynELF(o)
		fsys := &countingFS{FS: newFS().file("/x", 0o644, b)}
		got, fr, err := readDynamicOf(fsys, "/x")
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("readDynamic = %+v, %v", got, err)
		}
		if fr.read > 4*pageSize || fsys.readAtBytes > 4*pageSize {
			t.Errorf("read %d bytes (%d asked of ReadAt) of a %d-byte file, want a few pages", fr.read, fsys.readAtBytes, len(b))
		}
	})
	t.Run("Bad", func(t *testing.T) {
		good := mkDynELF(lib)
		// The dynamic section is last: drop its DT_NULL and what follows.
		noNull := good[:len(good)-64-16]
		for name, b := range map[string][]byte{
			"Truncated": good[:200],
			"NoNull":    noNull,
		} {
			m := newFS().file("/x", 0o644, b)
			if got, _, err := readDynamicOf(m, "/x"); err == nil {
				t.Errorf("readDynamic(%s) = %+v, want an error", name, got)
			}
		}
	})
}

// TestReadDynamicAgreesWithDebugELF reads the dynamic sections of the
// host's shared objects and programs through their program headers, as
// the loader does, and compares them with what debug/elf reads through
// their section headers.
func TestReadDynamicAgreesWithDebugELF(t *testing.T) {
	var files []string
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/bin"} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.Type().IsRegular() {
				files = append(files, filepath.Join(dir, e.Name()))
			}
		}
	}
	compared := 0
	for _, p := range files {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		libs, err1 := f.ImportedLibraries()
		needs, err2 := f.DynamicVersionNeeds()
		defs, err3 := f.DynamicVersions()
		soname, err4 := f.DynString(elf.DT_SONAME)
		runpath, err5 := f.DynString(elf.DT_RUNPATH)
		f.Close()
		if errors.Join(err1, err2, err3, err4, err5) != nil || f.Progs == nil {
			continue
		}
		got, _, err := readDynamicOf(dirFS("/"), p)
		if err != nil {
			t.Errorf("readDynamic(%s): %v", p, err)
			continue
		}
		compared++
		if !reflect.DeepEqual(got.needed, libs) && len(got.needed)+len(libs) > 0 {
			t.Errorf("%s: DT_NEEDED %q, debug/elf %q", p, got.needed, libs)
		}
		if strings.Join(soname, "") != got.soname || strings.Join(runpath, "") != got.runpath {
			t.Errorf("%s: DT_SONAME %q, DT_RUNPATH %q; debug/elf %q, %q", p, got.soname, got.runpath, soname, runpath)
		}
		var wantNeeds []verNeed
		for _, n := range needs {
			vn := verNeed{file: n.Name}
			for _, d := range n.Needs {
				vn.vers = append(vn.vers, version{d.Dep, elfHash(d.Dep), uint16(d.Flags)})
			}
			wantNeeds = append(wantNeeds, vn)
		}
		if !reflect.DeepEqual(got.needs, wantNeeds) {
			t.Errorf("%s: DT_VERNEED %+v, debug/elf %+v", p, got.needs, wantNeeds)
		}
		var wantDefs []version
		for _, d := range defs {
			wantDefs = append(wantDefs, version{d.Name, elfHash(d.Name), uint16(d.Flags)})
		}
		if !reflect.DeepEqual(got.defs, wantDefs) || got.hasDefs != (len(defs) > 0) {
			t.Errorf("%s: DT_VERDEF %+v, debug/elf %+v", p, got.defs, wantDefs)
		}
	}
	t.Logf("compared the dynamic sections of %d files", compared)
	if compared < 50 {
		t.Skipf("only %d ELF files to compare on this host", compared)
	}
}

// FuzzParseDynamic reads the dynamic section of a file shaped by the
// fuzzer: whatever it holds, the reader returns or fails within its
// bounds.
func FuzzParseDynamic(f *testing.F) {
	f.Add(mkDynELF(dynOpts{needed: []string{"libc.so.6"}, soname: "a", runpath: ptr("$ORIGIN"),
		needs: []dynNeed{{"libc.so.6", []string{"GLIBC_2.34", "~X"}}}, defs: []string{"a", "A_1"}}))
	f.Add(mkDynELF(dynOpts{class: elf.ELFCLASS32, order: binary.BigEndian, needed: []string{"x"}, defs: []string{"a"}}))
	if b, err := os.ReadFile("/bin/true"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fsys := &countingFS{FS: newFS().file("/x", 0o644, b)}
		d, fr, err := readDynamicOf(fsys, "/x")
		if fr.read > maxFileRead || fsys.readAtBytes > maxFileRead {
			t.Fatalf("read %d bytes, over %d", fr.read, maxFileRead)
		}
		if err != nil {
			return
		}
		if len(d.needed) > maxNeeded || len(d.defs) > maxVersions {
			t.Fatalf("%d needed, %d versions defined", len(d.needed), len(d.defs))
		}
		n := 0
		for _, vn := range d.needs {
			n += len(vn.vers)
		}
		if n > maxVersions {
			t.Fatalf("%d versions needed", n)
		}
		for _, s := range append(append([]string{}, d.needed...), d.soname, d.rpath, d.runpath) {
			if len(s) > maxDynString {
				t.Fatalf("string of %d bytes", len(s))
			}
		}
	})
}

// FuzzParseVersions reads version tables shaped by the fuzzer, the
// string table at the start of the same bytes.
func FuzzParseVersions(f *testing.F) {
	b := mkDynELF(dynOpts{needs: []dynNeed{{"libc.so.6", []string{"GLIBC_2.34", "~X"}}, {"b", []string{"B"}}}, defs: []string{"a", "A_1", "A_2"}})
	m := newFS().file("/x", 0o644, b)
	fr := newFileReader(m, "/x", &readBudget{left: maxCheckRead})
	info, _ := headerOf(fr)
	er := newELFReader(fr, info)
	ents, _ := er.entries()
	var st, need, def uint64
	for _, e := range ents {
		switch e.tag {
		case elf.DT_STRTAB:
			st, _ = er.offset(e.val)
		case elf.DT_VERNEED:
			need, _ = er.offset(e.val)
		case elf.DT_VERDEF:
			def, _ = er.offset(e.val)
		}
	}
	f.Add(b, uint32(need), uint32(def), uint32(st), false)
	f.Add(b, uint32(need), uint32(def), uint32(st), true)
	f.Fuzz(func(t *testing.T, b []byte, need, def, strtab uint32, big bool) {
		var order binary.ByteOrder = binary.LittleEndian
		if big {
			order = binary.BigEndian
		}
		m := newFS().file("/x", 0o644, b)
		fr := newFileReader(m, "/x", &readBudget{left: maxCheckRead})
		needs, err := readVerneed(fr, order, uint64(need), uint64(strtab))
		n := 0
		for _, vn := range needs {
			n += len(vn.vers)
		}
		if err == nil && n > maxVersions {
			t.Fatalf("%d versions needed", n)
		}
		defs, err := readVerdef(fr, order, uint64(def), uint64(strtab))
		if err == nil && len(defs) > maxVersions {
			t.Fatalf("%d versions defined", len(defs))
		}
		if fr.read > maxFileRead {
			t.Fatalf("read %d bytes", fr.read)
		}
	})
}
