package oci

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// tarEntry locates a member's data inside a tarball.
type tarEntry struct {
	off, size int64
	typ       byte
	link      string
}

// indexTar maps the members of a tarball to their data offsets, so members
// can be read in any order without rescanning. archive/tar reads exactly the
// header blocks, so the file offset after Next is the start of the data.
func indexTar(ctx context.Context, f io.ReadSeeker) (map[string]tarEntry, error) {
	out := make(map[string]tarEntry)
	tr := tar.NewReader(f)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read tar: %w", err)
		}
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, fmt.Errorf("read tar: %w", err)
		}
		out[cleanTarName(hdr.Name)] = tarEntry{off: off, size: hdr.Size, typ: hdr.Typeflag, link: hdr.Linkname}
	}
}

func cleanTarName(n string) string {
	return path.Clean("/" + n)[1:]
}

// lookup follows symlinks and hardlinks (as `docker save` writes for shared
// layers) to a regular member.
func lookup(idx map[string]tarEntry, n string) (tarEntry, error) {
	n = cleanTarName(n)
	for range 16 {
		e, ok := idx[n]
		if !ok {
			return tarEntry{}, fmt.Errorf("%w: %s is not in the archive", ErrNotFound, safetext.Name(n))
		}
		switch e.typ {
		case tar.TypeReg:
			return e, nil
		case tar.TypeSymlink:
			if strings.HasPrefix(e.link, "/") {
				n = cleanTarName(e.link)
			} else {
				n = cleanTarName(path.Join(path.Dir(n), e.link))
			}
		case tar.TypeLink:
			n = cleanTarName(e.link)
		default:
			return tarEntry{}, fmt.Errorf("%w: %s is not a regular file", ErrUnsupported, safetext.Name(n))
		}
	}
	return tarEntry{}, fmt.Errorf("%w: too many links at %s", ErrUnsupported, safetext.Name(n))
}

// readMember reads a small member whole: at most maxMetaSize bytes, and
// only what the file holds (a header may claim more than a truncated
// tarball has), so memory follows the data, not the claim.
func readMember(f io.ReaderAt, e tarEntry) ([]byte, error) {
	if e.size > maxMetaSize {
		return nil, fmt.Errorf("%w: member of %d bytes is larger than %d bytes", ErrUnsupported, e.size, maxMetaSize)
	}
	b, err := io.ReadAll(io.NewSectionReader(f, e.off, e.size))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != e.size {
		return nil, fmt.Errorf("member truncated: %d of %d bytes: %w", len(b), e.size, io.ErrUnexpectedEOF)
	}
	return b, nil
}
