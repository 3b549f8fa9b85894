package startcheck

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// Bounds on the shared objects one check loads.
const (
	// maxLibraries bounds the objects loaded in one check, over the
	// command, its interpreter and the envd; a large program loads a
	// hundred.
	maxLibraries = 256
	// maxDepth bounds how deep dependencies nest (a library needed by a
	// library needed by the program is at depth 2).
	maxDepth = 16
	// maxPreloads bounds the LD_PRELOAD entries loaded.
	maxPreloads = 16
)

// elfIdent is what every object of a process must share with its
// program: the loader of one class and machine loads only objects of
// them.
type elfIdent struct {
	class   elf.Class
	data    elf.Data
	machine elf.Machine
}

func identOf(info elfInfo) elfIdent { return elfIdent{info.class, info.data, info.machine} }

// glibcArch is what glibc's loader for one machine searches: the
// multiarch triplet of Debian and Ubuntu (slibdir and libdir below /lib
// and /usr/lib), whether other distributions put libraries in lib64, the
// value of $PLATFORM (AT_PLATFORM; "" when it varies), and the flags of
// its entries in /etc/ld.so.cache (FLAG_* of sysdeps/generic/ldconfig.h).
type glibcArch struct {
	triplet  string
	lib64    bool
	platform string
	flags    []int32
}

// glibcArches maps an ELF identity to its glibcArch.
var glibcArches = map[elfIdent]glibcArch{
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_X86_64}:    {"x86_64-linux-gnu", true, "x86_64", []int32{0x0303}},
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_AARCH64}:   {"aarch64-linux-gnu", true, "aarch64", []int32{0x0a03}},
	{elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_386}:       {"i386-linux-gnu", false, "i686", []int32{0x0001, 0x0003}},
	{elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_ARM}:       {"arm-linux-gnueabihf", false, "", []int32{0x0903, 0x0b03, 0x0003}},
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_PPC64}:     {"powerpc64le-linux-gnu", true, "", []int32{0x0503}},
	{elf.ELFCLASS64, elf.ELFDATA2MSB, elf.EM_PPC64}:     {"powerpc64-linux-gnu", true, "", []int32{0x0503}},
	{elf.ELFCLASS64, elf.ELFDATA2MSB, elf.EM_S390}:      {"s390x-linux-gnu", true, "", []int32{0x0403}},
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_RISCV}:     {"riscv64-linux-gnu", true, "riscv64", []int32{0x1003, 0x0f03}},
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_LOONGARCH}: {"loongarch64-linux-gnu", true, "loongarch64", []int32{0x1203, 0x1103}},
}

// archOf returns the glibcArch of ident; an unknown machine searches the
// generic directories and takes any glibc entry of the cache (a
// candidate of the wrong machine is skipped anyway).
func archOf(ident elfIdent) glibcArch {
	if a, ok := glibcArches[ident]; ok {
		return a
	}
	return glibcArch{lib64: ident.class == elf.ELFCLASS64}
}

// defaultDirs are glibc's system directories for a: the loader of each
// distribution searches some of them (Debian the multiarch ones and
// /lib, /usr/lib; Fedora /lib64, /usr/lib64), in this order. The check
// searches them all: a library missing from every one is missing for
// any of these loaders.
func (a glibcArch) defaultDirs() []string {
	var dirs []string
	if a.triplet != "" {
		dirs = append(dirs, "/lib/"+a.triplet, "/usr/lib/"+a.triplet)
	}
	if a.lib64 {
		dirs = append(dirs, "/lib64", "/usr/lib64")
	}
	return append(dirs, "/lib", "/usr/lib")
}

// libValues are the values of $LIB: glibc's is one of them, as built.
func (a glibcArch) libValues() []string {
	var v []string
	if a.triplet != "" {
		v = append(v, "lib/"+a.triplet)
	}
	if a.lib64 {
		return append(v, "lib64")
	}
	return append(v, "lib")
}

// cacheFlagsOK reports whether the loader of a takes a cache entry of
// flags.
func (a glibcArch) cacheFlagsOK(flags int32) bool {
	if a.flags == nil {
		return flags&0xff == ldCacheFlagTypeELFLibc6
	}
	return slices.Contains(a.flags, flags)
}

// flavor is the kind of loader, whose search rules differ.
type flavor int

const (
	flavorGlibc flavor = iota + 1
	flavorMusl
)

// flavorOf tells glibc's loader from musl's by the names of the loader
// (PT_INTERP as written, the file it leads to, its DT_SONAME); 0 for
// another.
func flavorOf(names ...string) flavor {
	for _, n := range names {
		if strings.Contains(path.Base(n), "musl") {
			return flavorMusl
		}
	}
	for _, n := range names {
		b := path.Base(n)
		if strings.HasPrefix(b, "ld-linux") || strings.HasPrefix(b, "ld64.so.") || strings.HasPrefix(b, "ld.so.") {
			return flavorGlibc
		}
	}
	return 0
}

// library is one entry of Result.Libraries.
type library struct{ name, path string }

// addLibrary records that name loads from p, once per name.
func (c *checker) addLibrary(name, p string) {
	if c.libNames == nil {
		c.libNames = make(map[string]bool)
	}
	if !c.libNames[name] {
		c.libNames[name] = true
		c.libs = append(c.libs, library{name, p})
	}
}

// libraries returns the first maxLibrariesShown libraries recorded, and
// how many more there were.
func (c *checker) libraries() (map[string]string, int) {
	if len(c.libs) == 0 {
		return nil, 0
	}
	shown := c.libs[:min(len(c.libs), maxLibrariesShown)]
	m := make(map[string]string, len(shown))
	for _, l := range shown {
		m[l.name] = l.path
	}
	return m, len(c.libs) - len(shown)
}

// object is one ELF of a process: the program, the loader or a library.
type object struct {
	// names are those the loader finds it by: the name it was needed
	// as, the path it was opened as.
	names []string
	// path is the path the loader opened it as: its directory is its
	// $ORIGIN. real is where symlinks lead: the file, its identity.
	path, real string
	label      string // names it in messages
	dyn        dynamic
	loader     *object // the object that needed it first
	depth      int
	// search is its search path once split (process.objectPath).
	search *searchList
}

// process is the loading of one program, as its loader would do it: the
// objects loaded so far, in load order.
type process struct {
	c      *checker
	flavor flavor
	ident  elfIdent
	arch   glibcArch
	main   *object
	rtld   *object
	// objs are the objects loaded, in load order; byName finds them by
	// the names the loader matches (names, and DT_SONAME for glibc),
	// byReal by their file.
	objs   []*object
	byName map[string]*object
	byReal map[string]*object
	// interp is PT_INTERP as written, which musl derives its path file
	// from.
	interp string
	// llp is LD_LIBRARY_PATH once split (llpDone), nil for none.
	llp     *searchList
	llpDone bool
	// missing holds the names already reported missing.
	missing map[string]bool
}

// checkLibraries loads the libraries of the program at p (info its
// header, lbl its label) as its loader at interp (resolved to loader,
// header linfo) would: each DT_NEEDED, breadth first, searched as glibc
// or musl searches, then glibc's version requirements. What cannot load
// is a certain problem; what the check cannot read or decide, a warning.
func (c *checker) checkLibraries(lbl, p string, info elfInfo, interp, loader string, linfo elfInfo) {
	dyn, err := newELFReader(newFileReader(c.fs, p, &c.budget), info).readDynamic()
	if err != nil {
		c.readProblem(lbl, err)
		return
	}
	preload, _ := lookupEnv(c.spec.Env, "LD_PRELOAD")
	if len(dyn.needed) == 0 && strings.TrimSpace(preload) == "" {
		return
	}
	ldyn, err := newELFReader(newFileReader(c.fs, loader, &c.budget), linfo).readDynamic()
	if err != nil {
		c.readProblem(fmt.Sprintf("%s: loader %s", lbl, quote(interp)), err)
		return
	}
	fl := flavorOf(interp, loader, ldyn.soname)
	if fl == 0 {
		c.warn("%s: loader %s is neither glibc's nor musl's: its libraries were not checked", lbl, quote(interp))
		return
	}
	ident := identOf(info)
	pr := &process{c: c, flavor: fl, ident: ident, arch: archOf(ident), interp: interp,
		missing: map[string]bool{}, byName: map[string]*object{}, byReal: map[string]*object{}}
	// The kernel-loaded program is found by no name but its DT_SONAME;
	// its $ORIGIN is where /proc/self/exe leads.
	pr.main = &object{path: p, real: p, label: lbl, dyn: dyn}
	pr.rtld = &object{names: []string{interp}, path: interp, real: loader, label: quote(interp), dyn: ldyn}
	pr.add(pr.main)
	pr.add(pr.rtld)
	queue := []*object{pr.main}
	c.inLibraries = true
	defer func() { c.inLibraries = false }()
	for i, name := range splitPreload(preload) {
		if i == maxPreloads {
			c.warn("%s: LD_PRELOAD names more than %d libraries; the rest were not checked", lbl, maxPreloads)
			break
		}
		if o, isNew := pr.load(name, pr.main, "LD_PRELOAD"); isNew {
			queue = append(queue, o)
		}
	}
	for i := 0; i < len(queue) && !c.libStop; i++ {
		o := queue[i]
		for _, name := range o.dyn.needed {
			if lib, isNew := pr.load(name, o, ""); isNew {
				queue = append(queue, lib)
			}
		}
	}
	if fl == flavorGlibc {
		pr.checkVersions()
	}
}

// readProblem records that what belongs to lbl could not be read well
// enough to check its libraries.
func (c *checker) readProblem(lbl string, err error) {
	switch {
	case errors.Is(err, errCheckBudget):
		c.stopLibraries(fmt.Sprintf("check cut short at the libraries of %s: %v", lbl, err))
	default:
		c.warn("%s: libraries not checked: %s", lbl, safetext.Clip(err.Error(), safetext.NameMax))
	}
}

// stopLibraries ends the loading of libraries for the rest of the check,
// which says why at its end (unless it was cut short before).
func (c *checker) stopLibraries(why string) {
	c.libStop = true
	if c.cut == "" {
		c.cut = why
	}
}

// splitPreload splits LD_PRELOAD as both loaders do: at spaces, tabs,
// newlines and colons.
func splitPreload(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ':' || r == '\t' || r == '\n' })
}

// add records a newly loaded object.
func (pr *process) add(o *object) {
	pr.objs = append(pr.objs, o)
	for _, n := range o.names {
		pr.alias(o, n)
	}
	if pr.flavor == flavorGlibc && o.dyn.soname != "" {
		pr.alias(o, o.dyn.soname)
	}
	if _, ok := pr.byReal[o.real]; !ok {
		pr.byReal[o.real] = o
	}
}

// alias makes name find o, unless it finds an object already.
func (pr *process) alias(o *object, name string) {
	if _, ok := pr.byName[name]; !ok {
		pr.byName[name] = o
	}
}

// find returns the loaded object name refers to: glibc matches the
// names an object was loaded by and its DT_SONAME, musl only the names.
func (pr *process) find(name string) *object { return pr.byName[name] }

// load returns the object name (needed by needer; via names the source
// when it is not a DT_NEEDED) refers to, loading it when it is not
// loaded yet; isNew reports a newly loaded object. It records what keeps
// the library from loading, and returns nil then.
func (pr *process) load(name string, needer *object, via string) (o *object, isNew bool) {
	c := pr.c
	if o := pr.find(name); o != nil {
		if o != pr.main {
			c.addLibrary(name, o.path)
		}
		return o, false
	}
	if pr.flavor == flavorMusl && muslReserved(name) {
		// musl's loader is its libc, and answers for the libraries
		// glibc splits off.
		pr.alias(pr.rtld, name)
		c.addLibrary(name, pr.rtld.path)
		return pr.rtld, false
	}
	if pr.missing[name] || c.libStop {
		return nil, false
	}
	if needer.depth+1 > maxDepth {
		c.stopLibraries(fmt.Sprintf("check cut short at library %s needed by %s: libraries nested more than %d deep", quote(name), needer.label, maxDepth))
		return nil, false
	}
	if c.loaded == maxLibraries {
		c.stopLibraries(fmt.Sprintf("check cut short at library %s needed by %s: more than %d libraries in one check", quote(name), needer.label, maxLibraries))
		return nil, false
	}
	s := &search{pr: pr, name: name, needer: needer, via: via}
	if pr.flavor == flavorGlibc {
		s.glibc()
	} else {
		s.musl()
	}
	switch {
	case s.found != nil:
		o := s.found
		if existing := pr.byReal[o.real]; existing != nil {
			// Found under another name: the same file is the same
			// object (the loader compares device and inode).
			pr.alias(existing, name)
			c.addLibrary(name, o.path)
			return existing, false
		}
		c.loaded++
		pr.add(o)
		c.addLibrary(name, o.path)
		return o, true
	case s.stopped:
	default:
		pr.missing[name] = true
		s.report()
	}
	return nil, false
}

// search is the search of one needed library.
type search struct {
	pr     *process
	name   string
	needer *object
	via    string // "LD_PRELOAD", or "" for a DT_NEEDED
	// searched are the places looked in, for the message.
	searched []string
	// skipped are candidates the loader passes over: another class or
	// machine, not readable by the user.
	skipped []string
	// uncertain says why the library may exist where the check could
	// not look; a miss is then a warning.
	uncertain string
	// found is the library; stopped means the search ended otherwise
	// with its problem recorded (the loader stops, or the check does);
	// ended that the loader looks no further (musl, after an error).
	found          *object
	stopped, ended bool
}

// done reports whether the search is over.
func (s *search) done() bool { return s.found != nil || s.stopped || s.ended }

// what names the library and who needs it, for messages.
func (s *search) what() string {
	if s.via != "" {
		return fmt.Sprintf("library %s of %s for %s", quote(s.name), s.via, s.pr.main.label)
	}
	if s.needer == s.pr.main {
		return fmt.Sprintf("library %s needed by %s", quote(s.name), s.needer.label)
	}
	return fmt.Sprintf("library %s needed by %s (loaded for %s)", quote(s.name), s.needer.label, s.pr.main.label)
}

// report records a library found nowhere: a failure, a warning when the
// check could not look everywhere the loader does, or for LD_PRELOAD,
// whose misses the loader only reports.
func (s *search) report() {
	msg := fmt.Sprintf("%s not found (searched: %s)", s.what(), safetext.List(s.searched, ", "))
	if len(s.skipped) > 0 {
		msg += "; passed over: " + safetext.List(s.skipped, "; ")
	}
	switch {
	case s.via != "":
		s.pr.c.warn("%s: the loader ignores it", msg)
	case s.uncertain != "":
		s.pr.c.warn("%s, but %s", msg, s.uncertain)
	default:
		s.pr.c.fail("%s", msg)
	}
}

// fatal records that the loader stops at the candidate at p.
func (s *search) fatal(p, why string) {
	s.pr.c.fail("%s: the loader stops at %s: %s", s.what(), quote(p), why)
	s.stopped = true
}

// note adds a place looked in to the message's list, once.
func (s *search) note(place string) {
	if !slices.Contains(s.searched, place) {
		s.searched = append(s.searched, place)
	}
}

// candidate is the outcome of trying one path.
type candidate int

const (
	// candMissing: no such file (ENOENT, ENOTDIR); the search goes on.
	candMissing candidate = iota
	// candPassed: a file the loader passes over (EACCES, another class
	// or machine); the search goes on.
	candPassed
	// candStopList: an error that ends the search of this list of
	// directories (ELOOP, ENAMETOOLONG), not the search.
	candStopList
	// candDone: found, or the search is over (the loader stops, or the
	// check does).
	candDone
)

// try opens the candidate at p (absolute) as the loader does, and
// verifies it as glibc's open_verify or musl's map_library.
func (s *search) try(p string) candidate {
	c := s.pr.c
	resolved, e, denied, rerr := c.walk(p)
	if rerr != nil {
		switch rerr.kind {
		case errNotExist, errNotDir:
			return candMissing
		case errLoop, errTooLong:
			return candStopList
		case errLimit:
			c.libStop = true
			s.stopped = true
			return candDone
		}
		s.uncertain = fmt.Sprintf("the check could not look at %s", rerr)
		return candMissing
	}
	if denied != "" {
		s.skipped = append(s.skipped, fmt.Sprintf("%s: directory %s not searchable by %s", quote(p), quote(denied), c.acct))
		return candPassed
	}
	if !e.Mode.IsRegular() {
		s.fatal(p, fmt.Sprintf("cannot read file data (%s)", describe(e)))
		return candDone
	}
	if !c.acct.may(e, permRead) {
		s.skipped = append(s.skipped, fmt.Sprintf("%s %s", quote(p), c.acct.deniedTo(e, permRead)))
		return candPassed
	}
	fr := newFileReader(c.fs, resolved, &c.budget)
	info, v, err := s.verify(fr)
	switch {
	case err != nil:
		if errors.Is(err, errCheckBudget) {
			c.readProblem(quote(p), err)
			s.stopped = true
			return candDone
		}
		s.uncertain = fmt.Sprintf("the check could not read %s: %s", quote(p), safetext.Clip(err.Error(), safetext.NameMax))
		return candMissing
	case v.pass != "":
		s.skipped = append(s.skipped, fmt.Sprintf("%s is %s", quote(p), v.pass))
		return candPassed
	case v.fail != "":
		s.fatal(p, v.fail)
		return candDone
	}
	o := &object{names: []string{s.name, p}, path: p, real: resolved, label: quote(p), loader: s.needer, depth: s.needer.depth + 1}
	if s.pr.byReal[resolved] != nil {
		s.found = &object{path: p, real: resolved}
		return candDone
	}
	dyn, err := newELFReader(fr, info).readDynamic()
	if err != nil {
		c.readProblem(quote(p), err)
	}
	if s.pr.flavor == flavorGlibc && dyn.flags1&elf.DF_1_PIE != 0 {
		s.fatal(p, "cannot dynamically load position-independent executable")
		return candDone
	}
	o.dyn = dyn
	s.found = o
	return candDone
}

// verdict is what a loader makes of a candidate's header: it passes
// over it (pass says why), fails on it (fail says why), or loads it.
type verdict struct{ pass, fail string }

// verify reads the header of a candidate as its loader checks it, as
// glibc's open_verify and _dl_map_object_from_fd do; err when the check
// cannot tell.
func (s *search) verify(fr *fileReader) (elfInfo, verdict, error) {
	want := s.pr.ident
	ehdr := 64
	if want.class == elf.ELFCLASS32 {
		ehdr = 52
	}
	head, err := fr.at(0, ehdr)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return elfInfo{}, verdict{fail: "file too short"}, nil
	case err != nil:
		return elfInfo{}, verdict{}, err
	case !isELF(head):
		return elfInfo{}, verdict{fail: "invalid ELF header"}, nil
	}
	if s.pr.flavor == flavorMusl {
		return s.verifyMusl(fr)
	}
	id := head[:elf.EI_NIDENT]
	// e_machine as the loader reads it, in its own byte order.
	machine := elf.Machine(binary.LittleEndian.Uint16(head[18:]))
	if want.data == elf.ELFDATA2MSB {
		machine = elf.Machine(binary.BigEndian.Uint16(head[18:]))
	}
	switch class := elf.Class(id[elf.EI_CLASS]); {
	case class != want.class:
		return elfInfo{}, verdict{pass: "of ELF class " + class.String()}, nil
	case machine != want.machine:
		// Debian's and Ubuntu's loader passes over another machine
		// before it looks at the byte order (upstream's stops at a
		// byte order not its own): an object of the other byte order
		// reads as another machine.
		return elfInfo{}, verdict{pass: "an ELF for " + machineName(machine)}, nil
	case elf.Data(id[elf.EI_DATA]) != want.data:
		return elfInfo{}, verdict{fail: "ELF file data encoding not " + endian(want.data)}, nil
	case id[elf.EI_VERSION] != byte(elf.EV_CURRENT):
		return elfInfo{}, verdict{fail: "ELF file version ident does not match current one"}, nil
	case !validOSABI(id[elf.EI_OSABI], id[elf.EI_ABIVERSION]):
		return elfInfo{}, verdict{fail: "ELF file OS ABI invalid"}, nil
	case slices.ContainsFunc(id[elf.EI_PAD:], func(b byte) bool { return b != 0 }):
		return elfInfo{}, verdict{fail: "nonzero padding in e_ident"}, nil
	}
	info, err := headerOf(fr)
	switch {
	case errors.Is(err, errShort):
		return elfInfo{}, verdict{fail: "cannot read file data"}, nil
	case err != nil:
		return elfInfo{}, verdict{}, err
	case info.machine != want.machine:
		return elfInfo{}, verdict{pass: "an ELF for " + machineName(info.machine)}, nil
	case info.typ != elf.ET_DYN && info.typ != elf.ET_EXEC:
		return elfInfo{}, verdict{fail: "only ET_DYN and ET_EXEC can be loaded"}, nil
	case !phentsizeOK(info):
		return elfInfo{}, verdict{fail: "ELF file's phentsize not the expected size"}, nil
	case info.typ == elf.ET_EXEC:
		return elfInfo{}, verdict{fail: "cannot dynamically load executable"}, nil
	}
	if seg, ok := (&elfReader{info: info}).dynamicSegment(); !ok || seg.Filesz == 0 {
		return elfInfo{}, verdict{fail: "object file has no dynamic section"}, nil
	}
	return info, verdict{}, nil
}

// verifyMusl checks a candidate as musl's map_library does: an ELF of
// the program's kind, else the load fails ("Exec format error"). musl
// does not pass over an object of another machine: it loads the first
// file it opens.
func (s *search) verifyMusl(fr *fileReader) (elfInfo, verdict, error) {
	info, err := headerOf(fr)
	switch {
	case errors.Is(err, errShort):
		return elfInfo{}, verdict{fail: "Exec format error (truncated ELF headers)"}, nil
	case err != nil:
		return elfInfo{}, verdict{}, err
	case identOf(info) != s.pr.ident:
		return elfInfo{}, verdict{fail: fmt.Sprintf("Exec format error (an ELF for %s, %s, %s)", machineName(info.machine), classBits(info.class), endian(info.data))}, nil
	case info.typ != elf.ET_DYN && info.typ != elf.ET_EXEC, !phentsizeOK(info):
		return elfInfo{}, verdict{fail: "Exec format error"}, nil
	}
	return info, verdict{}, nil
}

// phentsizeOK reports whether info's program header entries have the
// size of its class.
func phentsizeOK(info elfInfo) bool {
	if info.class == elf.ELFCLASS32 {
		return info.phentsize == 32
	}
	return info.phentsize == 56
}

// validOSABI is glibc's VALID_ELF_OSABI and VALID_ELF_ABIVERSION for
// Linux: System V, or GNU with an ABI version up to the few glibc knows.
func validOSABI(osabi, version byte) bool {
	switch elf.OSABI(osabi) {
	case elf.ELFOSABI_NONE:
		return version == 0
	case elf.ELFOSABI_LINUX:
		return version < 4
	}
	return false
}

// checkVersions checks every object's DT_VERNEED against the DT_VERDEF
// of the object it names, as glibc's _dl_check_map_versions does: a
// version the object does not define fails the load, unless the
// reference is weak or the object defines no versions at all.
func (pr *process) checkVersions() {
	for _, o := range pr.objs {
		for _, n := range o.dyn.needs {
			t := pr.find(n.file)
			if t == nil || !t.dyn.hasDefs {
				continue
			}
			for _, v := range n.vers {
				if v.flags&verFlgWeak != 0 || slices.ContainsFunc(t.dyn.defs, func(d version) bool { return d.hash == v.hash && d.name == v.name }) {
					continue
				}
				lib := quote(n.file)
				if t.path != n.file {
					lib += " (" + quote(t.path) + ")"
				}
				pr.c.fail("version %s of %s not found, required by %s", quote(v.name), lib, o.label)
			}
		}
	}
}
