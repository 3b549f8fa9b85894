// Package inspect reads a finished ext4 template image without mounting it
// (through github.com/diskfs/go-diskfs), for the `templatecenter inspect`
// command and for read-back checks in tests. It never writes to the image.
package inspect

import (
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/ext4"
)

// Image is an ext4 image opened read-only.
type Image struct {
	f  *os.File
	fs *ext4.FileSystem
}

// Entry is one directory entry with its inode's metadata.
type Entry struct {
	Name    string
	Mode    iofs.FileMode
	UID     uint32
	GID     uint32
	Size    int64
	ModTime time.Time
	Nlink   uint16
	Inode   uint32
	// LinkTarget is set for symlinks.
	LinkTarget string
	// Major and Minor are set for device nodes.
	Major, Minor uint32
	// Blocks is the space allocated to the inode, in 512-byte units.
	Blocks int64
}

// Open opens the image at path read-only. The file may hold anything: its
// superblock is checked before go-diskfs reads it, and a panic of the
// reader is an error.
func Open(imagePath string) (im *Image, err error) {
	f, err := os.Open(imagePath)
	if err != nil {
		return nil, fmt.Errorf("open image: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat image: %w", err)
	}
	if err := checkSuperblock(f, fi.Size()); err != nil {
		return nil, fmt.Errorf("read ext4 filesystem in %s: %w", imagePath, err)
	}
	defer guard("open", imagePath, &err)
	fs, err := ext4.Read(file.New(f, true), fi.Size(), 0, 512)
	if err != nil {
		return nil, fmt.Errorf("read ext4 filesystem in %s: %w", imagePath, err)
	}
	return &Image{f: f, fs: fs}, nil
}

// Close releases the image file.
func (im *Image) Close() error { return im.f.Close() }

// fsPath maps an absolute image path ("/etc/passwd", "/") to the form the
// reader takes ("etc/passwd", ".").
func fsPath(p string) (string, error) {
	clean := strings.TrimPrefix(path.Clean("/"+p), "/")
	if clean == "" {
		clean = "."
	}
	if !iofs.ValidPath(clean) {
		return "", fmt.Errorf("invalid path %q", p)
	}
	return clean, nil
}

// Stat describes the inode at p.
func (im *Image) Stat(p string) (e Entry, err error) {
	defer guard("stat", p, &err)
	fp, err := fsPath(p)
	if err != nil {
		return Entry{}, err
	}
	if fp == "." {
		return Entry{Name: "/", Mode: iofs.ModeDir | 0o755}, nil
	}
	fi, err := im.fs.Stat(fp)
	if err != nil {
		return Entry{}, fmt.Errorf("stat %s: %w", p, err)
	}
	return entryOf(path.Base(fp), fi), nil
}

// Lstat describes the entry at p without following a final symlink, like
// Stat, but tells a missing entry apart: its error then wraps
// fs.ErrNotExist, as the reader's own errors do not. Symlinks in p's
// directories are not followed.
func (im *Image) Lstat(p string) (e Entry, err error) {
	defer guard("stat", p, &err)
	fp, err := fsPath(p)
	if err != nil {
		return Entry{}, err
	}
	if fp == "." {
		return im.Stat(p)
	}
	des, err := im.fs.ReadDir(path.Dir(fp))
	if err != nil {
		return Entry{}, fmt.Errorf("stat %s: %w", p, err)
	}
	if !slices.ContainsFunc(des, func(de iofs.DirEntry) bool { return de.Name() == path.Base(fp) }) {
		return Entry{}, fmt.Errorf("stat %s: %w", p, iofs.ErrNotExist)
	}
	return im.Stat(p)
}

// List returns the entries of the directory at p, sorted by name.
func (im *Image) List(p string) (list []Entry, err error) {
	defer guard("list", p, &err)
	fp, err := fsPath(p)
	if err != nil {
		return nil, err
	}
	des, err := im.fs.ReadDir(fp)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	out := make([]Entry, 0, len(des))
	for _, de := range des {
		// Stat, unlike the listing's Info, carries the permission bits.
		fi, err := im.fs.Stat(path.Join(fp, de.Name()))
		if err != nil {
			return nil, fmt.Errorf("stat %s: %w", path.Join(p, de.Name()), err)
		}
		out = append(out, entryOf(de.Name(), fi))
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func entryOf(name string, fi iofs.FileInfo) Entry {
	e := Entry{Name: name, Mode: fi.Mode(), Size: fi.Size(), ModTime: fi.ModTime()}
	if st, ok := fi.Sys().(*ext4.StatT); ok && st != nil {
		e.UID, e.GID, e.Nlink, e.Inode = st.UID, st.GID, st.Nlink, st.Ino
		e.LinkTarget, e.Major, e.Minor, e.Blocks = st.LinkTarget, st.Major, st.Minor, int64(st.Blocks)
	}
	return e
}

// maxReadFile bounds what ReadFile loads into memory.
const maxReadFile = 256 << 20

// ReadFile returns the content of the regular file at p. go-diskfs v1.9.4
// reads a file correctly only in one call from offset 0 and only when it
// has no holes, so sparse files are refused rather than misread.
func (im *Image) ReadFile(p string) ([]byte, error) {
	return im.read(p, -1)
}

// ReadHead returns up to n bytes from the start of the regular file at p
// (a symlink is not followed), reading only them, under the same rules as
// ReadFile.
func (im *Image) ReadHead(p string, n int) ([]byte, error) {
	return im.read(p, max(n, 0))
}

// ReadAt reads len(b) bytes at offset off of the regular file at p (a
// symlink is not followed), as io.ReaderAt does: fewer only with an
// error, io.EOF at the end of the file. go-diskfs v1.9.4 misreads a file
// from an offset (it takes the extent before the offset for the one
// holding it), so ReadAt reads the file from its start, under the rules
// of ReadFile: off+len(b) may not exceed maxReadFile.
func (im *Image) ReadAt(p string, b []byte, off int64) (int, error) {
	if off < 0 || off > maxReadFile-int64(len(b)) {
		return 0, fmt.Errorf("read %s: %d bytes at %d, beyond the %d bytes inspect reads of a file", p, len(b), off, maxReadFile)
	}
	data, err := im.read(p, int(off)+len(b))
	if err != nil {
		return 0, err
	}
	if off >= int64(len(data)) {
		return 0, io.EOF
	}
	n := copy(b, data[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

// read returns the first n bytes of the regular file at p, or the whole
// file when n is negative (refusing one larger than maxReadFile).
func (im *Image) read(p string, n int) (data []byte, err error) {
	e, err := im.Stat(p)
	if err != nil {
		return nil, err
	}
	if !e.Mode.IsRegular() {
		return nil, fmt.Errorf("read %s: not a regular file (%s)", p, e.Mode.Type())
	}
	want := e.Size
	if n >= 0 {
		want = min(int64(n), e.Size)
	} else if e.Size > maxReadFile {
		return nil, fmt.Errorf("read %s: %d bytes is more than inspect prints (%d); mount the image to read it", p, e.Size, maxReadFile)
	}
	if allocated, needed := e.Blocks*512, (e.Size+4095)/4096*4096; allocated < needed {
		return nil, fmt.Errorf("read %s: sparse file (%d of %d bytes allocated); mount the image to read it", p, allocated, needed)
	}
	data = make([]byte, want)
	if want == 0 {
		return data, nil
	}
	fp, _ := fsPath(p)
	f, err := im.fs.OpenFile(fp, os.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close()
	defer guard("read", p, &err)
	got, err := f.Read(data)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if int64(got) != want {
		return nil, fmt.Errorf("read %s: got %d of %d bytes", p, got, want)
	}
	return data, nil
}

// guard turns a panic of the go-diskfs reader into an error. It is a
// third-party parser of what may be a hostile file, and v1.9.4 indexes
// slices with on-disk values it does not check (it panics even on valid
// images, e.g. on names of 248 bytes or more): a panic there must fail the
// one call, not the process.
func guard(op, p string, err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%s %s: the ext4 reader failed: %v", op, p, r)
	}
}
