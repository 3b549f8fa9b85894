package startcheck

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"strings"
)

// shebangSize is the kernel's BINPRM_BUF_SIZE: the bytes of a script it
// reads for the "#!" line.
const shebangSize = 256

// shebang is a parsed "#!" line, as the kernel splits it: the
// interpreter, then at most one argument (the rest of the line, spaces
// inside included).
type shebang struct {
	interp string
	arg    string
}

// parseShebang parses the "#!" line at the start of head as
// fs/binfmt_script.c does: spaces and tabs separate, the line ends at a
// newline or after shebangSize bytes; an interpreter cut by that end is
// an error (ENOEXEC), an argument is cut silently. A '\r' is an ordinary
// byte to the kernel and stays in the result.
func parseShebang(head []byte) (shebang, error) {
	if !bytes.HasPrefix(head, []byte("#!")) {
		return shebang{}, errors.New(`no "#!"`)
	}
	buf := head[:min(len(head), shebangSize)]
	line, _, found := bytes.Cut(buf[2:], []byte("\n"))
	// A NUL ends the line too: the kernel works on a C string.
	line, _, _ = bytes.Cut(line, []byte{0})
	isSpace := func(r rune) bool { return r == ' ' || r == '\t' }
	rest := bytes.TrimLeftFunc(line, isSpace)
	i := bytes.IndexFunc(rest, isSpace)
	if i < 0 {
		i = len(rest)
		if !found && len(head) >= shebangSize && len(line) == len(buf)-2 {
			return shebang{}, fmt.Errorf("interpreter name longer than the %d bytes the kernel reads", shebangSize)
		}
	}
	sb := shebang{interp: string(rest[:i])}
	if sb.interp == "" {
		return shebang{}, errors.New(`no interpreter after "#!"`)
	}
	sb.arg = string(bytes.TrimFunc(rest[i:], isSpace))
	return sb, nil
}

// envName returns the command that "#!/usr/bin/env ARG" runs: ARG, or
// with "-S" the first word of the split string that is neither an option
// nor an assignment. ok is false when ARG holds options the check does
// not follow.
func envName(arg string) (name string, ok bool) {
	if arg == "" {
		return "", false
	}
	if !strings.HasPrefix(arg, "-") {
		return arg, true
	}
	s, isSplit := strings.CutPrefix(arg, "-S")
	if !isSplit {
		return "", false
	}
	for _, w := range strings.Fields(s) {
		if strings.HasPrefix(w, "-") || strings.Contains(w, "=") {
			continue
		}
		return w, true
	}
	return "", false
}

// checkScript checks the interpreter of a "#!" script (named lbl) and,
// for "#!/usr/bin/env NAME", NAME on the effective PATH. It returns the
// interpreter that runs the script.
func (c *checker) checkScript(lbl string, head []byte) string {
	sb, err := parseShebang(head)
	if err != nil {
		c.fail("%s: bad \"#!\" line: %v", lbl, err)
		return ""
	}
	crlf := "the script has CRLF (Windows) line endings; convert it to LF"
	p := cleanAbs(c.wd, sb.interp)
	t, rerr := c.lookup(p)
	if rerr != nil {
		before, crlfEnded := strings.CutSuffix(sb.interp, "\r")
		switch {
		case rerr.kind == errLimit:
		case crlfEnded:
			c.fail("%s: interpreter %s not found: the \"#!\" line ends in \\r, so the kernel looks for %s; %s", lbl, quote(before), quote(sb.interp), crlf)
		case rerr.kind != errNotExist:
			c.fail("%s: interpreter %s: %v", lbl, quote(sb.interp), rerr)
		default:
			c.fail("%s: interpreter %s not found%s", lbl, quote(sb.interp), rerr.notFound())
		}
		return ""
	}
	ilbl := fmt.Sprintf("%s: interpreter %s", lbl, label(p, t.resolved))
	c.checkTarget(ilbl, t, 1)
	if path.Base(sb.interp) != "env" {
		if strings.HasSuffix(sb.arg, "\r") {
			c.warn("%s: the \"#!\" argument %s ends in \\r; %s", lbl, quote(sb.arg), crlf)
		}
		return p
	}
	name, ok := envName(sb.arg)
	if !ok {
		return p
	}
	if before, ok := strings.CutSuffix(name, "\r"); ok {
		c.fail("%s: \"#!%s %s\" runs %s (ending in \\r), which env cannot find; %s", lbl, sb.interp, before, quote(name), crlf)
		return ""
	}
	nt, ok := c.lookPath(name, fmt.Sprintf("%s: \"#!%s %s\": command %s", lbl, sb.interp, sb.arg, quote(name)))
	if !ok {
		return ""
	}
	c.checkTarget(fmt.Sprintf("%s: interpreter %s", lbl, label(nt.path, nt.resolved)), nt, 1)
	return nt.path
}
