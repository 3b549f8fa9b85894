package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"time"
)

// entry is one file of a layer.
type entry struct {
	name     string // relative, no leading or trailing slash
	kind     byte   // tar.TypeDir, TypeReg, TypeSymlink, TypeLink
	mode     os.FileMode
	uid, gid int
	data     []byte
	link     string
	owner    string // the package (or "image") that brought it, for errors
}

// tree is a layer's files by name.
type tree struct {
	entries map[string]*entry
}

func newTree() *tree { return &tree{entries: map[string]*entry{}} }

// add puts e in the tree. A directory several packages ship is merged; any
// other path shipped twice must be the same file, as dpkg would insist.
func (t *tree) add(e *entry) error {
	old, ok := t.entries[e.name]
	if !ok {
		t.entries[e.name] = e
		return nil
	}
	if old.kind == tar.TypeDir && e.kind == tar.TypeDir {
		return nil
	}
	if old.kind == e.kind && old.mode == e.mode && old.link == e.link && bytes.Equal(old.data, e.data) {
		return nil
	}
	return fmt.Errorf("%s is shipped by both %s and %s, differently", e.name, old.owner, e.owner)
}

// set puts e in the tree, replacing what was there (the image's own files).
func (t *tree) set(e *entry) { t.entries[e.name] = e }

// writeTar writes the tree as a tar stream: entries sorted by name (a
// directory before its contents), parents made when missing (root-owned,
// 0755), every time mtime, no user or group names. Hard links become
// copies, so no entry depends on another's position.
func (t *tree) writeTar(w io.Writer, mtime time.Time) error {
	for name := range t.entries {
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if _, ok := t.entries[dir]; !ok {
				t.entries[dir] = &entry{name: dir, kind: tar.TypeDir, mode: 0o755, owner: "image"}
			}
		}
	}
	names := make([]string, 0, len(t.entries))
	for n := range t.entries {
		names = append(names, n)
	}
	slices.Sort(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		e := t.entries[n]
		h := &tar.Header{
			Name:    e.name,
			Mode:    tarMode(e.mode),
			Uid:     e.uid,
			Gid:     e.gid,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		data := e.data
		switch e.kind {
		case tar.TypeDir:
			h.Typeflag, h.Name = tar.TypeDir, e.name+"/"
		case tar.TypeReg:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		case tar.TypeSymlink:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		case tar.TypeLink:
			target := t.entries[e.link]
			if target == nil || target.kind != tar.TypeReg {
				return fmt.Errorf("%s: hard link to %s, which is not a regular file of the image", e.name, e.link)
			}
			data = target.data
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		default:
			return fmt.Errorf("%s: unsupported entry type %q", e.name, e.kind)
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("write %s: %w", e.name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(data); err != nil {
				return fmt.Errorf("write %s: %w", e.name, err)
			}
		}
	}
	return tw.Close()
}

// tarMode is the permission and special bits of m as a tar mode.
func tarMode(m os.FileMode) int64 {
	v := int64(m.Perm())
	if m&os.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}

// gzipLayer returns the tree as a gzip-compressed tar. compress/gzip writes
// no time or name in its header, so the bytes depend on the content alone.
func gzipLayer(t *tree, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if err := t.writeTar(zw, mtime); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
