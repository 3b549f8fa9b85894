package startcheck

import (
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// FS is a read-only view of an image's tree.
type FS interface {
	// Lstat returns the entry at an absolute clean path, without following a final symlink; an error wrapping fs.ErrNotExist when missing.
	Lstat(path string) (Entry, error)
	// ReadHead returns up to n bytes from the start of the regular file at path.
	ReadHead(path string, n int) ([]byte, error)
}

// Entry is one directory entry.
type Entry struct {
	Mode   fs.FileMode // type bits and permissions
	Target string      // a symlink's target
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

// Result is the check's answer, marshalled as the BUILT report's template_check.
type Result struct {
	Result      string   `json:"result"` // "ok", "warnings", "no_command", "failed"
	Command     []string `json:"command,omitempty"`
	Resolved    string   `json:"resolved,omitempty"`
	Interpreter string   `json:"interpreter,omitempty"`
	Problems    []string `json:"problems,omitempty"`
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

// Failed reports whether a certain problem was found (the first problem is the message: "command \"python3\" not found on PATH=...").
func (r Result) Failed() bool { return r.Result == ResultFailed }

// Check runs the check. It never hangs (symlink loops bounded at 40) and reads only headers (a few KiB per file).
func Check(fsys FS, spec Spec) Result {
	c := &checker{fs: fsys, spec: spec, wd: cleanAbs("/", spec.WorkingDir), path: pathOf(spec.Env)}
	var r Result
	if len(spec.Argv) > 0 {
		c.checkWorkingDir()
		c.checkCommand(&r)
	}
	c.checkUser()
	c.checkEnvd()
	r.Problems = append(c.certain, c.warnings...)
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
	return r
}

// checker holds one check's state: the spec's derived values and the
// problems found so far.
type checker struct {
	fs       FS
	spec     Spec
	wd       string // absolute, clean
	path     string // effective PATH
	certain  []string
	warnings []string
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
// other than a directory: the runtime cannot enter it. A missing one is
// fine, the runtime creates it.
func (c *checker) checkWorkingDir() {
	_, e, err := c.resolve(c.wd)
	switch {
	case err == nil && !e.Mode.IsDir():
		c.fail("working directory %q is %s, not a directory", c.wd, kindOf(e))
	case err != nil && err.kind != errNotExist:
		c.fail("working directory %v", err)
	}
}

// checkCommand resolves argv[0] and checks what it names.
func (c *checker) checkCommand(r *Result) {
	argv0 := c.spec.Argv[0]
	r.Command = append([]string{}, c.spec.Argv...)
	if argv0 == "" {
		c.fail("command is an empty string")
		return
	}
	found, resolved, e, ok := c.lookPath(argv0, fmt.Sprintf("command %q", argv0))
	if !ok {
		return
	}
	r.Command[0] = found
	r.Resolved = resolved
	r.Interpreter = c.checkTarget(label(found, resolved), resolved, e, 0)
}

// label names a file in messages: the path as reached and, when symlinks
// led elsewhere, where they led.
func label(p, resolved string) string {
	if p == resolved {
		return strconv.Quote(p)
	}
	return fmt.Sprintf("%q (-> %q)", p, resolved)
}

// lookPath finds name as execvp does: a name with '/' is a path (relative
// to the working directory), any other is searched on the effective PATH
// in order, skipping candidates that are missing or not executable files.
// It records a certain problem, described with what, when nothing is
// found.
func (c *checker) lookPath(name, what string) (found, resolved string, e Entry, ok bool) {
	if strings.Contains(name, "/") {
		p := cleanAbs(c.wd, name)
		resolved, e, err := c.resolve(p)
		if err != nil {
			if path.IsAbs(name) {
				c.fail("%s: %v", what, err)
			} else {
				c.fail("%s in working directory %q: %v", what, c.wd, err)
			}
			return "", "", Entry{}, false
		}
		return p, resolved, e, true
	}
	var notes []string
	var skipped string // a candidate that exists but cannot be executed
	for _, dir := range strings.Split(c.path, ":") {
		// An empty PATH element is the working directory, as in execvp.
		p := cleanAbs(c.wd, path.Join(cleanAbs(c.wd, dir), name))
		resolved, e, err := c.resolve(p)
		if err != nil {
			if err.kind != errNotExist || err.link != "" {
				notes = append(notes, err.Error())
			}
			continue
		}
		if !e.Mode.IsRegular() || e.Mode.Perm()&0o111 == 0 {
			if skipped == "" {
				skipped = fmt.Sprintf("%s is %s", label(p, resolved), describe(e))
			}
			continue
		}
		for _, n := range notes {
			c.warn("%s: skipped on PATH: %s", what, n)
		}
		return p, resolved, e, true
	}
	msg := fmt.Sprintf("%s not found on PATH=%s", what, c.path)
	if skipped != "" {
		msg = fmt.Sprintf("%s not executable on PATH=%s: %s", what, c.path, skipped)
	}
	if len(notes) > 0 {
		msg += " (" + strings.Join(notes, "; ") + ")"
	}
	c.fail("%s", msg)
	return "", "", Entry{}, false
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

// checkTarget checks that the file at resolved (named lbl in messages)
// can be executed: a regular file with an execute bit, an ELF of the
// image's architecture with its loader, or a script whose interpreter can
// run. Scripts are followed one level (depth 0 only). It returns the
// loader or the interpreter.
func (c *checker) checkTarget(lbl, resolved string, e Entry, depth int) string {
	if !e.Mode.IsRegular() || e.Mode.Perm()&0o111 == 0 {
		c.fail("%s is %s", lbl, describe(e))
		return ""
	}
	head, err := c.fs.ReadHead(resolved, headSize)
	if err != nil {
		c.warn("%s: read header: %v", lbl, err)
		return ""
	}
	switch {
	case isELF(head):
		return c.checkELF(lbl, resolved, head)
	case len(head) >= 2 && head[0] == '#' && head[1] == '!':
		if depth > 0 {
			// The kernel follows nested interpreters (a few levels);
			// checking one level is what the check promises.
			return ""
		}
		return c.checkScript(lbl, head)
	default:
		c.fail("%s is not an executable format (neither ELF nor a \"#!\" script; starts with %q)", lbl, preview(head))
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
