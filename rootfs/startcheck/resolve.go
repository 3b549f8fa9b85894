package startcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
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
}

// notFound describes an errNotExist for a caller that has said "NAME not
// found": "" when the path itself is missing, else why it is.
func (e *resolveError) notFound() string {
	switch {
	case e.kind != errNotExist:
		return " (" + e.Error() + ")"
	case e.link != "":
		return fmt.Sprintf(" (symlink %q -> %q dangles: %q not found)", e.link, e.target, e.at)
	case e.at != e.start:
		return fmt.Sprintf(" (%q not found)", e.at)
	}
	return ""
}

func (e *resolveError) Error() string {
	switch e.kind {
	case errNotExist:
		if e.link != "" {
			if e.link == e.start {
				return fmt.Sprintf("%q is a dangling symlink to %q (%q not found)", e.start, e.target, e.at)
			}
			return fmt.Sprintf("%q not found: symlink %q -> %q dangles (%q not found)", e.start, e.link, e.target, e.at)
		}
		if e.at != e.start {
			return fmt.Sprintf("%q not found (%q does not exist)", e.start, e.at)
		}
		return fmt.Sprintf("%q not found", e.start)
	case errLoop:
		return fmt.Sprintf("%q: more than %d symlinks (a loop), at %q", e.start, maxLinks, e.at)
	case errNotDir:
		return fmt.Sprintf("%q: %q is not a directory", e.start, e.at)
	default:
		return fmt.Sprintf("%q: read %q: %v", e.start, e.at, e.err)
	}
}

// resolve follows p (absolute) inside the image, symlinks included, the
// final one too: absolute targets from the image root, relative ones from
// their directory, ".." stopping at the root. It returns the resolved
// path and its entry.
func (c *checker) resolve(p string) (string, Entry, *resolveError) {
	start := path.Clean("/" + p)
	cur := "/"
	rest := components(splitPath(start), "", "")
	links := 0
	last, err := c.fs.Lstat("/")
	if err != nil {
		return "", Entry{}, &resolveError{kind: errRead, start: start, at: "/", err: err}
	}
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
			continue
		}
		next := path.Join(cur, comp)
		e, err := c.fs.Lstat(next)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "", Entry{}, &resolveError{kind: errNotExist, start: start, at: next, links: links, link: cm.link, target: cm.target}
			}
			return "", Entry{}, &resolveError{kind: errRead, start: start, at: next, links: links, err: err}
		}
		if e.Mode&fs.ModeSymlink != 0 {
			links++
			if links > maxLinks {
				return "", Entry{}, &resolveError{kind: errLoop, start: start, at: next, links: links}
			}
			if e.Target == "" {
				return "", Entry{}, &resolveError{kind: errNotExist, start: start, at: next, links: links, link: next, target: e.Target}
			}
			if path.IsAbs(e.Target) {
				cur = "/"
			}
			rest = append(components(splitPath(e.Target), next, e.Target), rest...)
			continue
		}
		if len(rest) > 0 && !e.Mode.IsDir() {
			return "", Entry{}, &resolveError{kind: errNotDir, start: start, at: next, links: links}
		}
		cur, last = next, e
	}
	return cur, last, nil
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
