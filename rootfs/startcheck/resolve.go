package startcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// maxLinks bounds the symlinks one resolution follows, as the kernel's
// MAXSYMLINKS: beyond it the path is a loop (ELOOP), never a hang.
const maxLinks = 40

// The kinds of resolveError.
const (
	errNotExist = iota + 1
	errLoop
	errNotDir
	errRead
	// errTooLong is ENAMETOOLONG: the path or one of its components is
	// longer than the kernel accepts.
	errTooLong
	// errLimit means the check's own bounds stopped the resolution; the
	// path may well resolve. Callers record nothing for it: Check ends
	// with a warning naming where it stopped (a PATH search says so
	// itself).
	errLimit
)

// resolveError says why a path did not resolve in the image.
type resolveError struct {
	kind  int
	start string // the path asked for
	at    string // the path where resolution stopped
	links int    // symlinks followed before stopping
	err   error  // for errRead
	// link and target name the symlink whose target holds the missing
	// component, for errNotExist: a dangling symlink.
	link, target string
	// detail says what is too long (errTooLong) or which bound was
	// reached (errLimit).
	detail string
}

// notFound describes an errNotExist for a caller that has said "NAME not
// found": "" when the path itself is missing, else why it is.
func (e *resolveError) notFound() string {
	switch {
	case e.kind != errNotExist:
		return " (" + e.Error() + ")"
	case e.link != "":
		return fmt.Sprintf(" (symlink %s -> %s dangles: %s not found)", quote(e.link), quote(e.target), quote(e.at))
	case e.at != e.start:
		return fmt.Sprintf(" (%s not found)", quote(e.at))
	}
	return ""
}

// quote quotes a path or a name for a message, cut to safetext.NameMax.
func quote(s string) string { return safetext.Name(s) }

// errText is an error's text for a message, cut to safetext.NameMax: an
// FS's errors name the paths the check asked for.
func errText(err error) string { return safetext.Clip(err.Error(), safetext.NameMax) }

func (e *resolveError) Error() string {
	switch e.kind {
	case errNotExist:
		if e.link != "" {
			if e.link == e.start {
				return fmt.Sprintf("%s is a dangling symlink to %s (%s not found)", quote(e.start), quote(e.target), quote(e.at))
			}
			return fmt.Sprintf("%s not found: symlink %s -> %s dangles (%s not found)", quote(e.start), quote(e.link), quote(e.target), quote(e.at))
		}
		if e.at != e.start {
			return fmt.Sprintf("%s not found (%s does not exist)", quote(e.start), quote(e.at))
		}
		return fmt.Sprintf("%s not found", quote(e.start))
	case errLoop:
		return fmt.Sprintf("%s: more than %d symlinks (a loop), at %s", quote(e.start), maxLinks, quote(e.at))
	case errNotDir:
		return fmt.Sprintf("%s: %s is not a directory", quote(e.start), quote(e.at))
	case errTooLong, errLimit:
		return fmt.Sprintf("%s: %s", quote(e.start), e.detail)
	default:
		return fmt.Sprintf("%s: read %s: %s", quote(e.start), quote(e.at), errText(e.err))
	}
}

// resolve follows p (absolute) inside the image, symlinks included, the
// final one too: absolute targets from the image root, relative ones from
// their directory, ".." stopping at the root. It returns the resolved
// path and its entry. Its work counts against the check's bounds.
func (c *checker) resolve(p string) (string, Entry, *resolveError) {
	resolved, e, _, err := c.walk(p)
	return resolved, e, err
}

// walk is resolve that also returns the first directory on the way that
// the check's user may not search ("" when it may search them all): the
// kernel fails the path with EACCES there, once the walk is over. It
// takes ".." in p as the kernel does, from the directory reached (a path
// a loader builds, "$ORIGIN/../lib", is not clean).
func (c *checker) walk(p string) (resolved string, last Entry, denied string, rerr *resolveError) {
	start := p
	if !path.IsAbs(start) {
		start = "/" + start
	}
	if len(start) >= pathMax {
		return "", Entry{}, "", &resolveError{kind: errTooLong, start: start,
			detail: fmt.Sprintf("path of %d bytes, longer than the %d the kernel accepts", len(start), pathMax-1)}
	}
	cur := "/"
	rest := components(splitPath(start), "", "")
	links := 0
	if lerr := c.spend(start, false); lerr != nil {
		return "", Entry{}, "", lerr
	}
	last, err := c.fs.Lstat("/")
	if err != nil {
		return "", Entry{}, "", &resolveError{kind: errRead, start: start, at: "/", err: err}
	}
	// dirs are the entries of cur and of the directories above it, for
	// the search permission of each lookup.
	dirs := []Entry{last}
	for len(rest) > 0 {
		cm := rest[0]
		rest = rest[1:]
		comp := cm.name
		switch comp {
		case "", ".":
			continue
		case "..":
			// cur is a directory already checked; its parent is too.
			cur = path.Dir(cur)
			if len(dirs) > 1 {
				dirs = dirs[:len(dirs)-1]
			}
			continue
		}
		if len(comp) > nameMax {
			return "", Entry{}, "", &resolveError{kind: errTooLong, start: start,
				detail: fmt.Sprintf("name %s of %d bytes, longer than the %d a file name can have", quote(comp), len(comp), nameMax)}
		}
		next := path.Join(cur, comp)
		if len(next) >= pathMax {
			// The kernel would go on (it walks dentries, not strings);
			// the check stops rather than build ever longer paths.
			return "", Entry{}, "", c.stop(&resolveError{kind: errLimit, start: start,
				detail: fmt.Sprintf("symlinks lead to a path longer than %d bytes, where the check stops", pathMax-1)})
		}
		if lerr := c.spend(start, false); lerr != nil {
			return "", Entry{}, "", lerr
		}
		if denied == "" && !c.acct.may(dirs[len(dirs)-1], permExec) {
			denied = cur
		}
		e, err := c.fs.Lstat(next)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "", Entry{}, "", &resolveError{kind: errNotExist, start: start, at: next, links: links, link: cm.link, target: cm.target}
			}
			return "", Entry{}, "", &resolveError{kind: errRead, start: start, at: next, links: links, err: err}
		}
		if e.Mode&fs.ModeSymlink != 0 {
			links++
			if links > maxLinks {
				return "", Entry{}, "", &resolveError{kind: errLoop, start: start, at: next, links: links}
			}
			if lerr := c.spend(start, true); lerr != nil {
				return "", Entry{}, "", lerr
			}
			if len(e.Target) >= pathMax {
				return "", Entry{}, "", &resolveError{kind: errTooLong, start: start,
					detail: fmt.Sprintf("symlink %s has a target of %d bytes, longer than the %d the kernel accepts", quote(next), len(e.Target), pathMax-1)}
			}
			if e.Target == "" {
				return "", Entry{}, "", &resolveError{kind: errNotExist, start: start, at: next, links: links, link: next, target: e.Target}
			}
			if path.IsAbs(e.Target) {
				cur, dirs = "/", dirs[:1]
			}
			rest = append(components(splitPath(e.Target), next, e.Target), rest...)
			continue
		}
		if len(rest) > 0 && !e.Mode.IsDir() {
			return "", Entry{}, "", &resolveError{kind: errNotDir, start: start, at: next, links: links}
		}
		cur, last = next, e
		if e.Mode.IsDir() {
			dirs = append(dirs, e)
		}
	}
	return cur, last, denied, nil
}

// spend counts one FS.Lstat, or with link one symlink followed, against
// the check's bounds; past them it returns an errLimit for the resolution
// of start, as it does for every later one. A PATH search (searching)
// stops at half the bounds, so that the command found, its interpreter,
// the user and the envd are checked whatever the PATH; loading libraries
// (inLibraries) at three quarters, so that the envd is.
func (c *checker) spend(start string, link bool) *resolveError {
	if link {
		c.links++
	} else {
		c.lookups++
	}
	detail := ""
	switch {
	case c.lookups > maxLookups:
		detail = fmt.Sprintf("more than %d lookups in one check", maxLookups)
	case c.links > maxLinkSteps:
		detail = fmt.Sprintf("more than %d symlinks followed in one check", maxLinkSteps)
	case c.searching && c.lookups > maxLookups/2:
		return &resolveError{kind: errLimit, start: start, detail: fmt.Sprintf("more than %d lookups in one PATH search", maxLookups/2)}
	case c.searching && c.links > maxLinkSteps/2:
		return &resolveError{kind: errLimit, start: start, detail: fmt.Sprintf("more than %d symlinks followed in one PATH search", maxLinkSteps/2)}
	case c.inLibraries && c.lookups > maxLookups*3/4:
		detail = fmt.Sprintf("more than %d lookups for libraries in one check", maxLookups*3/4)
	case c.inLibraries && c.links > maxLinkSteps*3/4:
		detail = fmt.Sprintf("more than %d symlinks followed for libraries in one check", maxLinkSteps*3/4)
	default:
		return nil
	}
	return c.stop(&resolveError{kind: errLimit, start: start, detail: detail})
}

// stop records the first place where the check's bounds cut it short,
// and returns e.
func (c *checker) stop(e *resolveError) *resolveError {
	if c.cut == "" {
		c.cut = "check cut short at " + e.Error()
	}
	return e
}

// splitPath returns p's components; empty ones (from "//" or a leading
// '/') are skipped by resolve, but still make a file before them a
// "not a directory" error, as a trailing slash does in the kernel.
func splitPath(p string) []string { return strings.Split(p, "/") }

// component is one path component still to resolve, with the symlink
// whose target it comes from ("" for the path asked for).
type component struct {
	name, link, target string
}

func components(names []string, link, target string) []component {
	out := make([]component, len(names))
	for i, n := range names {
		out[i] = component{n, link, target}
	}
	return out
}
