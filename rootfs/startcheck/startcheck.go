package startcheck

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// FS is a read-only view of an image's tree.
type FS interface {
	// Lstat returns the entry at an absolute clean path, without following a final symlink; an error wrapping fs.ErrNotExist when missing.
	Lstat(path string) (Entry, error)
	// ReadHead returns up to n bytes from the start of the regular file at path.
	ReadHead(path string, n int) ([]byte, error)
	// ReadAt reads len(p) bytes at offset off of the regular file at
	// path, as io.ReaderAt does: fewer only with an error, io.EOF at the
	// end of the file. The check reads a shared object's dynamic section
	// with it, which lies far into large files.
	ReadAt(path string, p []byte, off int64) (int, error)
}

// Entry is one directory entry.
type Entry struct {
	Mode     fs.FileMode // type bits and permissions
	Target   string      // a symlink's target
	UID, GID uint32      // owner
}

// Spec is what starts in the sandbox.
type Spec struct {
	Argv       []string // effective command (Entrypoint+Cmd after overrides); empty: none
	Env        []string // KEY=VALUE, effective
	WorkingDir string   // effective; "" means /
	User       string   // effective: name, uid, name:group, uid:gid; "" means root
	Arch       string   // GOARCH of the image platform (amd64, arm64, ...)
	Envd       string   // path of the injected envd in the tree, "" for none
}

// Overrides are the parts of container_overrides the check reads (the caller maps api.ContainerOverrides to it, so rootfs does not import agent).
type Overrides struct {
	Command, Args []string
	Env           []string // KEY=VALUE, on top of the image's
	WorkingDir    string
	RunAsUsername string
	RunAsUser     *int64
}

// Result is the check's answer, marshalled as the BUILT report's
// template_check. Check returns it Bounded.
type Result struct {
	Result      string   `json:"result"` // "ok", "warnings", "no_command", "failed"
	Command     []string `json:"command,omitempty"`
	Resolved    string   `json:"resolved,omitempty"`
	Interpreter string   `json:"interpreter,omitempty"`
	Problems    []string `json:"problems,omitempty"`
	// Libraries maps each shared library the command, its interpreter
	// and the envd load (by the name they need it as) to the path the
	// loader opens; LibrariesOmitted counts those left out to keep the
	// result within its bounds.
	Libraries        map[string]string `json:"libraries,omitempty"`
	LibrariesOmitted int               `json:"libraries_omitted,omitempty"`
}

// The values of Result.Result.
const (
	ResultOK        = "ok"
	ResultWarnings  = "warnings"
	ResultNoCommand = "no_command"
	ResultFailed    = "failed"
)

// warningPrefix marks an uncertain problem in Result.Problems.
const warningPrefix = "warning: "

// Bounds on a Result's fields, so that its JSON stays within
// safetext.TemplateCheckMax whatever the image: each string is cut by the
// size of its JSON encoding (safetext.ClipJSON), each list to a few items
// and a count of the rest.
const (
	// maxArgs is how many words of the command a Result shows.
	maxArgs = 16
	// maxArgJSON bounds one word of the command.
	maxArgJSON = safetext.NameMax
	// maxPathJSON bounds Resolved and Interpreter.
	maxPathJSON = 512
	// maxResultJSON bounds Result.Result (one of the four values,
	// unless a record was tampered with).
	maxResultJSON = 16
	// maxProblemJSON bounds one problem; the first is also the failed
	// build's error_message.
	maxProblemJSON = 1280
	// resultJSONMax is the most a Bounded Result marshals to without its
	// libraries: the keys, braces and brackets (under 128 bytes), and
	// each item with its quotes and comma. The libraries get the room
	// left: at least TemplateCheckMax-resultJSONMax, 800 bytes, and
	// mostly far more (see boundLibraries).
	resultJSONMax = 128 + maxResultJSON + maxArgs*(maxArgJSON+3) + 2*maxPathJSON + safetext.ListMax*(maxProblemJSON+3)
	// maxLibrariesShown is how many libraries a Result names at most.
	maxLibrariesShown = 64
	// maxLibraryNameJSON bounds a library's name (a key of Libraries),
	// maxLibraryPathJSON its path.
	maxLibraryNameJSON = 128
	maxLibraryPathJSON = 256
)

// The bounds must fit in a template_check: an array of negative length
// does not compile.
var _ [safetext.TemplateCheckMax - resultJSONMax]struct{}

// Bounded returns r with every field within the bounds that keep its JSON
// under safetext.TemplateCheckMax. Check's results are bounded already;
// a result recorded by an earlier release may not be.
func (r Result) Bounded() Result {
	r.Result = safetext.ClipJSON(r.Result, maxResultJSON)
	if len(r.Command) > 0 {
		r.Command = safetext.Strings(r.Command, maxArgs, maxArgJSON)
	}
	r.Resolved = safetext.ClipJSON(r.Resolved, maxPathJSON)
	r.Interpreter = safetext.ClipJSON(r.Interpreter, maxPathJSON)
	if len(r.Problems) > 0 {
		r.Problems = safetext.Strings(r.Problems, safetext.ListMax, maxProblemJSON)
	}
	r.Libraries, r.LibrariesOmitted = boundLibraries(r)
	return r
}

// boundLibraries returns r's libraries within their bounds: at most
// maxLibrariesShown (by name), each name and path cut, and only as many
// as fit in the room the other fields leave under TemplateCheckMax; the
// second value counts the libraries left out, those r left out already
// included.
func boundLibraries(r Result) (map[string]string, int) {
	omitted := max(r.LibrariesOmitted, 0)
	if len(r.Libraries) == 0 {
		return nil, omitted
	}
	names := slices.Sorted(maps.Keys(r.Libraries))
	rest := r
	rest.Libraries, rest.LibrariesOmitted = nil, 0
	base, err := json.Marshal(rest)
	if err != nil {
		return nil, omitted + len(names)
	}
	// The field names, the braces and a count of up to 20 digits.
	room := safetext.TemplateCheckMax - len(base) - len(`,"libraries":{},"libraries_omitted":`) - 20
	out := make(map[string]string, min(len(names), maxLibrariesShown))
	for _, name := range names {
		key, val := safetext.ClipJSON(name, maxLibraryNameJSON), safetext.ClipJSON(r.Libraries[name], maxLibraryPathJSON)
		if _, dup := out[key]; dup || len(out) == maxLibrariesShown {
			omitted++
			continue
		}
		// A key and a value as JSON writes them, a colon and a comma.
		size := jsonSize(key) + jsonSize(val) + 2
		if size > room {
			omitted++
			continue
		}
		room -= size
		out[key] = val
	}
	if len(out) == 0 {
		out = nil
	}
	return out, omitted
}

// jsonSize is the length of s encoded as a JSON string.
func jsonSize(s string) int {
	b, _ := json.Marshal(s)
	return len(b)
}

// Bounds on one check's work. An image config can name a PATH of
// millions of entries, a working directory thousands of components deep
// and symlinks that loop; the check looks at a bounded part of such a
// spec and says what it left out, in milliseconds and a little memory.
const (
	// maxPathEntries is how many PATH entries a command lookup tries.
	maxPathEntries = 256
	// maxLookups bounds the FS.Lstat calls of one check; a normal image
	// needs a few dozen.
	maxLookups = 4096
	// maxLinkSteps bounds the symlinks one check follows, over all its
	// resolutions (each stops at maxLinks).
	maxLinkSteps = 1024
	// pathMax is the kernel's PATH_MAX, with its NUL: a longer path fails
	// with ENAMETOOLONG.
	pathMax = 4096
	// nameMax is ext4's NAME_MAX: no file has a longer name, and a longer
	// path component fails with ENAMETOOLONG.
	nameMax = 255
)

// Failed reports whether a certain problem was found (the first problem is the message: "command \"python3\" not found on PATH=...").
func (r Result) Failed() bool { return r.Result == ResultFailed }

// Check runs the check. It never hangs (symlink loops bounded at 40),
// reads headers (a few KiB per file) and the pages of shared objects the
// loader reads (within maxFileRead per file and maxCheckRead in all),
// does a bounded amount of work whatever the spec (maxPathEntries,
// maxLookups, maxLinkSteps, maxLibraries) and returns a Bounded result.
func Check(fsys FS, spec Spec) Result {
	c := &checker{fs: fsys, spec: spec, wd: cleanAbs("/", spec.WorkingDir), path: pathOf(spec.Env),
		budget: readBudget{left: maxCheckRead}}
	// The user comes first, as the runtime resolves it before it runs
	// anything: the command's permissions are its. Its problems come
	// after the command's.
	c.acct = c.checkUser()
	userCertain, userWarnings := c.certain, c.warnings
	c.certain, c.warnings = nil, nil
	var r Result
	if len(spec.Argv) > 0 {
		r.Command = safetext.Strings(spec.Argv, maxArgs, maxArgJSON)
		// Every relative path starts from the working directory: when
		// it cannot be entered, the command is not looked for.
		if c.checkWorkingDir() {
			c.checkCommand(&r)
		}
	}
	c.certain, c.warnings = append(c.certain, userCertain...), append(c.warnings, userWarnings...)
	c.checkEnvd()
	if c.cut != "" {
		c.warn("%s; what it would have looked at next was not checked", c.cut)
	}
	r.Problems = append(c.certain, c.warnings...)
	r.Libraries, r.LibrariesOmitted = c.libraries()
	switch {
	case len(c.certain) > 0:
		r.Result = ResultFailed
	case len(spec.Argv) == 0:
		r.Result = ResultNoCommand
	case len(c.warnings) > 0:
		r.Result = ResultWarnings
	default:
		r.Result = ResultOK
	}
	return r.Bounded()
}

// checker holds one check's state: the spec's derived values and the
// problems found so far.
type checker struct {
	fs       FS
	spec     Spec
	wd       string // absolute, clean
	path     string // effective PATH
	acct     account
	certain  []string
	warnings []string
	// lookups and links count the FS.Lstat calls and the symlinks
	// followed so far, against maxLookups and maxLinkSteps.
	lookups, links int
	// searching is set during a PATH search, which gets half the bounds;
	// inLibraries while libraries load, which get three quarters, so that
	// the envd is checked whatever they need. libStop ends the loading
	// of libraries once a bound is reached.
	searching, inLibraries, libStop bool
	// cut says why the check stopped short, "" while it has not: a
	// warning at the end.
	cut string
	// accountFiles holds /etc/passwd and /etc/group once read.
	accountFiles map[string][]byte
	// budget is what fileReaders may still read.
	budget readBudget
	// loaded counts the shared objects the check loaded, against
	// maxLibraries; libs are the libraries for Result.Libraries, in
	// load order.
	loaded   int
	libs     []library
	libNames map[string]bool
	// ldEntries are the entries of /etc/ld.so.cache once read (ldRead),
	// ldUncertain why the check could not read it; ldCaches the cache as
	// the loader of each ELF identity reads it.
	ldRead      bool
	ldEntries   []ldCacheEntry
	ldUncertain string
	ldCaches    map[elfIdent]*cacheState
	// musl holds the system search paths of musl's loaders, by path
	// file.
	musl map[string]*muslPath
}

func (c *checker) fail(format string, a ...any) {
	c.certain = append(c.certain, fmt.Sprintf(format, a...))
}

func (c *checker) warn(format string, a ...any) {
	c.warnings = append(c.warnings, warningPrefix+fmt.Sprintf(format, a...))
}

// cleanAbs makes p absolute against dir ("" is dir itself) and clean.
func cleanAbs(dir, p string) string {
	if p == "" {
		p = dir
	}
	if !path.IsAbs(p) {
		p = path.Join(dir, p)
	}
	return path.Clean(p)
}

// checkWorkingDir fails a working directory that exists as something
// other than a directory, or whose path is too long: the runtime cannot
// enter it. A missing one is fine, the runtime creates it. It reports
// whether paths relative to it can be looked up.
func (c *checker) checkWorkingDir() bool {
	_, e, err := c.resolve(c.wd)
	switch {
	case err == nil && !e.Mode.IsDir():
		c.fail("working directory %s is %s, not a directory", quote(c.wd), kindOf(e))
	case err != nil && err.kind == errTooLong:
		c.fail("working directory %v", err)
		return false
	case err != nil && err.kind != errNotExist && err.kind != errLimit:
		c.fail("working directory %v", err)
	}
	return true
}

// checkCommand resolves argv[0] and checks what it names.
func (c *checker) checkCommand(r *Result) {
	argv0 := c.spec.Argv[0]
	if argv0 == "" {
		c.fail("command is an empty string")
		return
	}
	t, ok := c.lookPath(argv0, "command "+quote(argv0))
	if !ok {
		return
	}
	r.Command[0] = t.path
	r.Resolved = t.resolved
	r.Interpreter = c.checkTarget(label(t.path, t.resolved), t, 0)
}

// target is a file the check found to run.
type target struct {
	path     string // as reached
	resolved string // where symlinks led
	e        Entry
	// denied is the first directory on the way the check's user may not
	// search, "" when there is none.
	denied string
}

// lookup resolves p (absolute) to a target.
func (c *checker) lookup(p string) (target, *resolveError) {
	resolved, e, denied, err := c.walk(p)
	return target{path: p, resolved: resolved, e: e, denied: denied}, err
}

// notExecutable says why the check's user cannot execute t, "" when it
// can: not a regular file, no execute bit, none for the user (root needs
// one of the three), or a directory on the way the user may not search.
func (c *checker) notExecutable(t target) string {
	switch {
	case !t.e.Mode.IsRegular() || t.e.Mode.Perm()&0o111 == 0:
		return describe(t.e)
	case t.denied != "":
		return fmt.Sprintf("in directory %s, not searchable by %s", quote(t.denied), c.acct)
	case !c.acct.may(t.e, permExec):
		return c.acct.deniedTo(t.e, permExec)
	}
	return ""
}

// label names a file in messages: the path as reached and, when symlinks
// led elsewhere, where they led.
func label(p, resolved string) string {
	if p == resolved {
		return quote(p)
	}
	return fmt.Sprintf("%s (-> %s)", quote(p), quote(resolved))
}

// lookPath finds name as execvp does: a name with '/' is a path (relative
// to the working directory), any other is searched on the effective PATH
// in order, skipping candidates that are missing or not executable files.
// It records a certain problem, described with what, when nothing is
// found; an uncertain one when the PATH has more than maxPathEntries
// entries, since the runtime goes on where the check stops.
func (c *checker) lookPath(name, what string) (target, bool) {
	if strings.Contains(name, "/") {
		t, err := c.lookup(cleanAbs(c.wd, name))
		switch {
		case err == nil:
			return t, true
		case err.kind == errLimit:
			// Check ends with the warning that says so.
		case path.IsAbs(name):
			c.fail("%s: %v", what, err)
		default:
			c.fail("%s in working directory %s: %v", what, quote(c.wd), err)
		}
		return target{}, false
	}
	if len(name) > nameMax {
		// Every candidate fails alike: no need to try them.
		c.fail("%s: name of %d bytes, longer than the %d a file name can have", what, len(name), nameMax)
		return target{}, false
	}
	var notes []string
	var skipped string // a candidate that exists but cannot be executed
	dirs, total := c.pathDirs()
	pathText := "PATH=" + safetext.Clip(c.path, safetext.NameMax)
	c.searching = true
	defer func() { c.searching = false }()
	for i, dir := range dirs {
		// An empty PATH element is the working directory, as in execvp.
		p := cleanAbs(c.wd, path.Join(cleanAbs(c.wd, dir), name))
		t, err := c.lookup(p)
		if err != nil {
			if err.kind == errLimit {
				if c.cut == "" {
					c.warn("%s not found in the first %d of the %d entries of %s: the search stopped at %v", what, i, total, pathText, err)
				}
				return target{}, false
			}
			if err.kind != errNotExist || err.link != "" {
				notes = append(notes, err.Error())
			}
			continue
		}
		// execvp goes on past a file it may not execute (EACCES).
		if why := c.notExecutable(t); why != "" {
			if skipped == "" {
				skipped = fmt.Sprintf("%s is %s", label(p, t.resolved), why)
			}
			continue
		}
		for _, n := range notes {
			c.warn("%s: skipped on PATH: %s", what, n)
		}
		return t, true
	}
	msg := fmt.Sprintf("%s not found on %s", what, pathText)
	if skipped != "" {
		msg = fmt.Sprintf("%s not executable on %s: %s", what, pathText, skipped)
	}
	if len(notes) > 0 {
		msg += " (" + safetext.List(notes, "; ") + ")"
	}
	if total > len(dirs) {
		c.warn("%s; only the first %d of its %d entries were looked at", msg, len(dirs), total)
		return target{}, false
	}
	c.fail("%s", msg)
	return target{}, false
}

// pathDirs returns the first maxPathEntries entries of the effective PATH
// and how many it has, without splitting the rest of it.
func (c *checker) pathDirs() (dirs []string, total int) {
	total = strings.Count(c.path, ":") + 1
	dirs = make([]string, 0, min(total, maxPathEntries))
	for dir := range strings.SplitSeq(c.path, ":") {
		if len(dirs) == maxPathEntries {
			break
		}
		dirs = append(dirs, dir)
	}
	return dirs, total
}

// describe says what kind of non-executable entry e is.
func describe(e Entry) string {
	switch {
	case e.Mode.IsDir():
		return "a directory"
	case !e.Mode.IsRegular():
		return fmt.Sprintf("not a regular file (mode %v)", e.Mode)
	case e.Mode.Perm()&0o111 == 0:
		return fmt.Sprintf("not executable (mode %04o)", e.Mode.Perm())
	}
	return "an executable file"
}

// checkTarget checks that the file t (named lbl in messages) can be
// executed by the check's user: a regular file it may execute, an ELF of
// the image's architecture with its loader and libraries, or a script
// its interpreter can read and run. Scripts are followed one level
// (depth 0 only). It returns the loader or the interpreter.
func (c *checker) checkTarget(lbl string, t target, depth int) string {
	if why := c.notExecutable(t); why != "" {
		c.fail("%s is %s", lbl, why)
		return ""
	}
	head, err := c.fs.ReadHead(t.resolved, headSize)
	if err != nil {
		c.warn("%s: read header: %v", lbl, err)
		return ""
	}
	switch {
	case isELF(head):
		return c.checkELF(lbl, t.resolved, head)
	case len(head) >= 2 && head[0] == '#' && head[1] == '!':
		if depth > 0 {
			// The kernel follows nested interpreters (a few levels);
			// checking one level is what the check promises.
			return ""
		}
		// The interpreter opens the script as the user.
		if !c.acct.may(t.e, permRead) {
			c.fail("%s is %s: its interpreter cannot read it", lbl, c.acct.deniedTo(t.e, permRead))
		}
		return c.checkScript(lbl, head)
	default:
		c.fail("%s is not an executable format (neither ELF nor a \"#!\" script; starts with %s)", lbl, quote(preview(head)))
		return ""
	}
}

// kindOf names the type of a non-directory entry.
func kindOf(e Entry) string {
	switch {
	case e.Mode.IsRegular():
		return "a regular file"
	case e.Mode&fs.ModeDevice != 0:
		return "a device"
	case e.Mode&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case e.Mode&fs.ModeSocket != 0:
		return "a socket"
	}
	return fmt.Sprintf("of mode %v", e.Mode)
}

// preview is the first bytes of a file, for messages.
func preview(head []byte) string {
	if len(head) > 8 {
		head = head[:8]
	}
	return string(head)
}
