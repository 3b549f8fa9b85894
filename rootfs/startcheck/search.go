package startcheck

import (
	"debug/elf"
	"fmt"
	"path"
	"slices"
	"strings"
)

// glibc searches for a library as glibc's _dl_map_new_object does: a
// name with '/' is a path; any other is looked for in the DT_RPATH of
// the needing object and of the objects that loaded it, up to the
// program's (only when the needing object has no DT_RUNPATH), then
// LD_LIBRARY_PATH, the needing object's DT_RUNPATH, /etc/ld.so.cache
// and the system directories (both skipped for DF_1_NODEFLIB).
func (s *search) glibc() {
	pr := s.pr
	if strings.Contains(s.name, "/") {
		s.path(s.name)
		return
	}
	if !s.needer.dyn.hasRunPath {
		didMain := false
		for l := s.needer; l != nil && !s.done(); l = l.loader {
			if l.dyn.hasRPath {
				s.dirs(pr.objectPath(l), "DT_RPATH of "+l.label)
				didMain = didMain || l == pr.main
			}
		}
		if !didMain && pr.main.dyn.hasRPath && !s.done() {
			s.dirs(pr.objectPath(pr.main), "DT_RPATH of "+pr.main.label)
		}
	}
	if llp := pr.libraryPath(); llp != nil && !s.done() {
		s.dirs(*llp, "LD_LIBRARY_PATH")
	}
	if s.needer.dyn.hasRunPath && !s.done() {
		s.dirs(pr.objectPath(s.needer), "DT_RUNPATH of "+s.needer.label)
	}
	nodeflib := s.needer.dyn.flags1&elf.DF_1_NODEFLIB != 0
	if !s.done() {
		s.cache(nodeflib)
	}
	if !nodeflib && !s.done() {
		s.dirs(searchList{dirs: pr.arch.defaultDirs()}, "")
	}
}

// musl searches for a library as musl's load_library does: a name with
// '/' is a path; any other is looked for in LD_LIBRARY_PATH, then the
// DT_RUNPATH or DT_RPATH of the needing object and of each object that
// loaded it, then the directories of /etc/ld-musl-ARCH.path (beside the
// loader's prefix) or /lib:/usr/local/lib:/usr/lib.
func (s *search) musl() {
	pr := s.pr
	if strings.Contains(s.name, "/") {
		s.path(s.name)
		return
	}
	if len(s.name) > nameMax {
		s.note(fmt.Sprintf("nowhere: a name longer than %d bytes", nameMax))
		return
	}
	if llp := pr.libraryPath(); llp != nil && !s.done() {
		s.dirs(*llp, "LD_LIBRARY_PATH")
	}
	for l := s.needer; l != nil && !s.done(); l = l.loader {
		if rp := pr.objectPath(l); len(rp.dirs) > 0 || rp.uncertain != "" {
			s.dirs(rp, "DT_RUNPATH of "+l.label)
		}
	}
	if !s.done() {
		s.dirs(pr.muslSystemPath(), "")
	}
}

// path tries a needed name that is a path, relative ones from the
// working directory (glibc expands its tokens first).
func (s *search) path(name string) {
	pr := s.pr
	names := []string{name}
	if pr.flavor == flavorGlibc {
		l := pr.searchPath(name, "", s.needer)
		names = l.dirs
		if l.uncertain != "" {
			s.uncertain = l.uncertain
		}
	}
	for _, n := range names {
		// The loader opens the path as it stands, its ".." taken
		// where the kernel reaches it.
		p := n
		if !path.IsAbs(n) {
			p = cleanAbs(pr.c.wd, n)
		}
		s.note(quote(p))
		if s.try(p) == candDone {
			return
		}
	}
}

// searchList is a list of directories to search: the first
// maxPathEntries of a path list, its tokens expanded.
type searchList struct {
	dirs []string
	// uncertain says why the list may hold more than dirs.
	uncertain string
}

// libraryPath returns LD_LIBRARY_PATH as the process's loader splits it,
// once per process; nil when the environment has none (glibc: or an
// empty one).
func (pr *process) libraryPath() *searchList {
	if !pr.llpDone {
		pr.llpDone = true
		if llp, ok := lookupEnv(pr.c.spec.Env, "LD_LIBRARY_PATH"); ok && (llp != "" || pr.flavor == flavorMusl) {
			seps := ":;"
			if pr.flavor == flavorMusl {
				seps = ":\n"
			}
			l := pr.searchPath(llp, seps, pr.main)
			pr.llp = &l
		}
	}
	return pr.llp
}

// objectPath returns the search path of o, once per object: glibc's
// DT_RUNPATH, else its DT_RPATH; musl's (muslRpath).
func (pr *process) objectPath(o *object) searchList {
	if o.search == nil {
		var l searchList
		switch {
		case pr.flavor == flavorMusl:
			if rp, ok := pr.muslRpath(o); ok {
				l = pr.searchPath(rp, ":\n", o)
			}
		case o.dyn.hasRunPath:
			l = pr.searchPath(o.dyn.runpath, ":", o)
		case o.dyn.hasRPath:
			l = pr.searchPath(o.dyn.rpath, ":", o)
		}
		o.search = &l
	}
	return *o.search
}

// searchPath splits a path list at any of seps ("" for a single path),
// its first maxPathEntries entries; glibc's loader expands their tokens
// for the object o, takes an empty entry for the working directory and
// a directory once, musl's skips empty entries.
func (pr *process) searchPath(list, seps string, o *object) searchList {
	var l searchList
	elems, total := []string{list}, 1
	if seps != "" {
		elems, total = splitAny(list, seps, maxPathEntries)
	}
	if total > len(elems) {
		l.uncertain = fmt.Sprintf("only the first %d of the %d entries of a search path were looked at", len(elems), total)
	}
	for _, e := range elems {
		if pr.flavor == flavorMusl {
			if e != "" {
				l.dirs = append(l.dirs, e)
			}
			continue
		}
		values, why := pr.expandDST(e, o)
		if why != "" {
			l.uncertain = why
		}
		for _, v := range values {
			if !slices.Contains(l.dirs, v) {
				l.dirs = append(l.dirs, v)
			}
		}
	}
	return l
}

// splitAny splits s at every byte of seps, returning the first n parts
// and how many there are, without splitting the rest.
func splitAny(s, seps string, n int) (parts []string, total int) {
	total = 1
	for i := 0; i < len(seps); i++ {
		total += strings.Count(s, seps[i:i+1])
	}
	parts = make([]string, 0, min(total, n))
	for len(parts) < n {
		i := strings.IndexAny(s, seps)
		if i < 0 {
			return append(parts, s), total
		}
		parts = append(parts, s[:i])
		s = s[i+1:]
	}
	return parts, total
}

// dirs searches the directories of l for the library; what names the
// list in the message ("" names each directory).
func (s *search) dirs(l searchList, what string) {
	if l.uncertain != "" {
		s.uncertain = l.uncertain
	}
	for _, dir := range l.dirs {
		// The loader opens DIR/NAME as it stands (a relative DIR from
		// the working directory), and reports that path.
		p := strings.TrimRight(dir, "/")
		if !path.IsAbs(dir) {
			p = strings.TrimRight(path.Join(s.pr.c.wd, dir), "/")
		}
		place := quote(p)
		if p == "" {
			place = quote("/")
		}
		if what != "" {
			place = what + " " + place
		}
		s.note(place)
		switch s.try(p + "/" + s.name) {
		case candDone:
			return
		case candStopList:
			// glibc ends the list at an error other than ENOENT,
			// EACCES and ENOTDIR; musl the whole search.
			s.ended = s.pr.flavor == flavorMusl
			return
		}
	}
}

// expandDST expands the dynamic string tokens of one path element as
// glibc's _dl_dst_substitute does, for the object o: $ORIGIN (its
// directory), $LIB and $PLATFORM, also as ${...}; an unknown $NAME
// stays. It returns every value the element can take ($LIB differs
// between distributions, each builds one), none when a token has no
// value; why says when the value is not known to the check.
func (pr *process) expandDST(e string, o *object) (values []string, why string) {
	values = []string{""}
	for len(e) > 0 {
		i := strings.IndexByte(e, '$')
		if i < 0 {
			break
		}
		lit := e[:i]
		rest := e[i+1:]
		var repl []string
		n := 0
		switch {
		case dstIs(rest, "ORIGIN") > 0:
			n = dstIs(rest, "ORIGIN")
			if o != nil {
				repl = []string{pr.origin(o)}
			}
		case dstIs(rest, "PLATFORM") > 0:
			n = dstIs(rest, "PLATFORM")
			if pr.arch.platform == "" {
				return nil, "$PLATFORM's value is not known for " + machineName(pr.ident.machine)
			}
			repl = []string{pr.arch.platform}
		case dstIs(rest, "LIB") > 0:
			n = dstIs(rest, "LIB")
			repl = pr.arch.libValues()
		default:
			// No token the loader knows: a literal '$'.
			values = appendAll(values, lit+"$")
			e = rest
			continue
		}
		if len(repl) == 0 {
			return nil, ""
		}
		values = appendAll(values, lit)
		var next []string
		for _, v := range values {
			for _, r := range repl {
				next = append(next, v+r)
			}
		}
		values, e = next, rest[n:]
	}
	values = appendAll(values, e)
	for i, v := range values {
		// glibc drops trailing slashes (but "/" itself).
		for len(v) > 1 && strings.HasSuffix(v, "/") {
			v = v[:len(v)-1]
		}
		values[i] = v
	}
	return values, ""
}

func appendAll(values []string, s string) []string {
	for i := range values {
		values[i] += s
	}
	return values
}

// dstIs returns the length of the token name at the start of s ("NAME"
// or "{NAME}", not followed by an identifier byte), 0 when it is not
// there; as glibc's is_dst.
func dstIs(s, name string) int {
	curly := strings.HasPrefix(s, "{")
	if curly {
		s = s[1:]
	}
	if !strings.HasPrefix(s, name) {
		return 0
	}
	rest := s[len(name):]
	if curly {
		if !strings.HasPrefix(rest, "}") {
			return 0
		}
		return len(name) + 2
	}
	if rest != "" {
		c := rest[0]
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' {
			return 0
		}
	}
	return len(name)
}

// origin is o's $ORIGIN: the directory of the program's file once
// symlinks are followed (/proc/self/exe), or of the path a library was
// opened as.
func (pr *process) origin(o *object) string {
	if o == pr.main {
		return path.Dir(o.real)
	}
	return path.Dir(cleanAbs(pr.c.wd, o.path))
}

// cache looks the library up in /etc/ld.so.cache and tries what it
// names; with nodeflib, not an entry in a system directory.
func (s *search) cache(nodeflib bool) {
	cs := s.pr.c.ldCache(s.pr.ident, s.pr.arch)
	s.note("/etc/ld.so.cache")
	if cs.uncertain != "" {
		s.uncertain = cs.uncertain
		return
	}
	p, ok := cs.cache[s.name]
	if !ok {
		return
	}
	if nodeflib {
		for _, d := range s.pr.arch.defaultDirs() {
			if strings.HasPrefix(p, d+"/") {
				return
			}
		}
	}
	s.try(cleanAbs("/", p))
}

// cacheState is /etc/ld.so.cache as one loader reads it.
type cacheState struct {
	cache ldCache
	// uncertain says why the check cannot tell what the cache holds.
	uncertain string
}

// ldCache returns the cache for the loader of ident, reading the file
// once per check. A missing or unreadable cache, or one the loader does
// not recognise, is none; one the check cannot read is uncertain.
func (c *checker) ldCache(ident elfIdent, arch glibcArch) *cacheState {
	if cs, ok := c.ldCaches[ident]; ok {
		return cs
	}
	if c.ldCaches == nil {
		c.ldCaches = make(map[elfIdent]*cacheState)
	}
	cs := &cacheState{}
	c.ldCaches[ident] = cs
	entries, uncertain := c.readLDCache()
	cs.uncertain = uncertain
	cs.cache = newLDCache(entries, arch.cacheFlagsOK)
	return cs
}

// maxLDCache bounds what the check reads of /etc/ld.so.cache: a cache of
// every package Debian has is a few hundred KiB.
const maxLDCache = 4 << 20

// readLDCache reads and parses /etc/ld.so.cache, once per check.
func (c *checker) readLDCache() ([]ldCacheEntry, string) {
	if c.ldRead {
		return c.ldEntries, c.ldUncertain
	}
	c.ldRead = true
	const file = "/etc/ld.so.cache"
	resolved, e, denied, rerr := c.walk(file)
	switch {
	case rerr != nil && (rerr.kind == errNotExist || rerr.kind == errNotDir):
		return nil, ""
	case rerr != nil:
		c.ldUncertain = fmt.Sprintf("the check could not look at %s", rerr)
		return nil, c.ldUncertain
	case denied != "" || !e.Mode.IsRegular() || !c.acct.may(e, permRead):
		// The loader cannot read it, and goes on without.
		return nil, ""
	}
	if c.budget.left < maxLDCache {
		c.ldUncertain = "the check read all it may before reading " + file
		return nil, c.ldUncertain
	}
	b, err := c.fs.ReadHead(resolved, maxLDCache)
	if err != nil {
		c.ldUncertain = fmt.Sprintf("the check could not read %s: %s", file, errText(err))
		return nil, c.ldUncertain
	}
	c.budget.left -= len(b)
	if len(b) >= maxLDCache {
		c.ldUncertain = fmt.Sprintf("%s is larger than the %d MiB the check reads", file, maxLDCache>>20)
		return nil, c.ldUncertain
	}
	entries, err := parseLDCache(b)
	if err != nil {
		if len(b) >= len(ldCacheMagicOld) && (strings.HasPrefix(string(b), ldCacheMagicNew) || strings.HasPrefix(string(b), ldCacheMagicOld)) {
			c.ldUncertain = fmt.Sprintf("the check could not parse %s: %v", file, err)
			return nil, c.ldUncertain
		}
		// Not a cache to the loader either: it goes on without.
		return nil, ""
	}
	c.ldEntries = entries
	return entries, ""
}

// muslReserved reports whether musl's loader answers for name itself:
// libc, libdl, libm, libpthread, librt, libutil, libxnet and libcrypt
// are all its libc (ldso/dynlink.c, load_library).
func muslReserved(name string) bool {
	rest, ok := strings.CutPrefix(name, "lib")
	if !ok {
		return false
	}
	for _, r := range []string{"c.", "pthread.", "rt.", "m.", "dl.", "util.", "xnet."} {
		if strings.HasPrefix(rest, r) {
			return true
		}
	}
	return false
}

// muslRpath returns the search path of o as musl reads it: DT_RUNPATH,
// else DT_RPATH, with $ORIGIN and ${ORIGIN} expanded; a path with any
// other '$' is not used.
func (pr *process) muslRpath(o *object) (string, bool) {
	rp := o.dyn.rpath
	if o.dyn.hasRunPath {
		rp = o.dyn.runpath
	} else if !o.dyn.hasRPath {
		return "", false
	}
	if !strings.Contains(rp, "$") {
		return rp, true
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(rp, '$')
		if i < 0 {
			b.WriteString(rp)
			return b.String(), true
		}
		b.WriteString(rp[:i])
		switch rest := rp[i:]; {
		case strings.HasPrefix(rest, "${ORIGIN}"):
			rp = rest[len("${ORIGIN}"):]
		case strings.HasPrefix(rest, "$ORIGIN"):
			rp = rest[len("$ORIGIN"):]
		default:
			return "", false
		}
		b.WriteString(pr.origin(o))
	}
}

// muslArches are musl's LDSO_ARCH by ELF identity, for a loader whose
// name does not say it.
var muslArches = map[elfIdent]string{
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_X86_64}:    "x86_64",
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_AARCH64}:   "aarch64",
	{elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_386}:       "i386",
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_PPC64}:     "powerpc64le",
	{elf.ELFCLASS64, elf.ELFDATA2MSB, elf.EM_S390}:      "s390x",
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_RISCV}:     "riscv64",
	{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_LOONGARCH}: "loongarch64",
}

// muslArch is the ARCH of the loader's path file: the one its name
// carries (ld-musl-ARCH.so.1, or libc.musl-ARCH.so.1 where it leads), else
// the usual one of the machine.
func (pr *process) muslArch() string {
	for _, n := range []string{pr.interp, pr.rtld.real} {
		b := path.Base(n)
		for _, prefix := range []string{"ld-musl-", "libc.musl-"} {
			if arch, ok := strings.CutPrefix(b, prefix); ok {
				if arch, ok := strings.CutSuffix(arch, ".so.1"); ok && arch != "" {
					return arch
				}
			}
		}
	}
	return muslArches[pr.ident]
}

// muslPath is a musl loader's system search path.
type muslPath struct {
	dirs      []string
	uncertain string
}

// maxMuslPathFile bounds what the check reads of a musl path file.
const maxMuslPathFile = 64 << 10

// muslSystemPath returns the system search path of the process's musl
// loader: the directories of PREFIX/etc/ld-musl-ARCH.path, where PREFIX
// is the loader's directory's parent ("" for /lib/ld-musl-x86_64.so.1)
// and ARCH its name's, split at ':' and newlines; /lib:/usr/local/lib:
// /usr/lib when there is no such file; none when it cannot be read.
func (pr *process) muslSystemPath() searchList {
	c := pr.c
	name := pr.interp
	prefix := ""
	if strings.HasPrefix(name, "/") {
		if dir := path.Dir(path.Clean(name)); dir != "/" {
			prefix = path.Dir(dir)
			if prefix == "/" {
				prefix = ""
			}
		}
	}
	arch := pr.muslArch()
	if arch == "" {
		return searchList{uncertain: fmt.Sprintf("the check does not know which file names the system search path of musl's loader %s", quote(name))}
	}
	file := prefix + "/etc/ld-musl-" + arch + ".path"
	if mp, ok := c.musl[file]; ok {
		return searchList{dirs: mp.dirs, uncertain: mp.uncertain}
	}
	if c.musl == nil {
		c.musl = make(map[string]*muslPath)
	}
	mp := &muslPath{}
	c.musl[file] = mp
	resolved, e, denied, rerr := c.walk(file)
	switch {
	case rerr != nil && rerr.kind == errNotExist:
		mp.dirs = []string{"/lib", "/usr/local/lib", "/usr/lib"}
	case rerr != nil:
		mp.uncertain = fmt.Sprintf("the check could not look at %s", rerr)
	case denied != "" || !c.acct.may(e, permRead):
		// musl searches no system directory when it cannot open it.
	case !e.Mode.IsRegular():
		mp.uncertain = fmt.Sprintf("%s is %s", quote(file), describe(e))
	default:
		b, err := c.fs.ReadHead(resolved, maxMuslPathFile)
		switch {
		case err != nil:
			mp.uncertain = fmt.Sprintf("the check could not read %s: %s", quote(file), errText(err))
		case len(b) >= maxMuslPathFile:
			mp.uncertain = fmt.Sprintf("%s is larger than the %d KiB the check reads", quote(file), maxMuslPathFile>>10)
		default:
			l := pr.searchPath(string(b), ":\n", nil)
			mp.dirs, mp.uncertain = l.dirs, l.uncertain
		}
	}
	return searchList{dirs: mp.dirs, uncertain: mp.uncertain}
}
