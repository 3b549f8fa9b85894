package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/blobcache"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fsutil"
)

// maxMetaSize bounds manifests, indexes and configs read from local sources.
const maxMetaSize = 16 << 20

// refNameAnnotation names an image inside an OCI layout's index.json.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// localPath checks that an offline source lies under one of the allowed
// roots and returns its symlink-free path.
func (p *Puller) localPath(pr ParsedRef) (string, error) {
	if len(p.localRoots) == 0 {
		return "", fmt.Errorf("%w: %s: offline sources are disabled (no local roots configured)", ErrLocalDisabled, pr)
	}
	real, err := filepath.EvalSymlinks(pr.Path)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", pr, err)
	}
	for _, root := range p.localRoots {
		rr, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		rel, err := filepath.Rel(rr, real)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return real, nil
		}
	}
	return "", fmt.Errorf("%w: %s is outside the allowed local roots", ErrLocalDisabled, pr.Path)
}

// resolveLayout reads an image from an OCI image layout directory. An
// explicit digest names a manifest or index blob of the layout; a tag matches
// the org.opencontainers.image.ref.name annotation of index.json entries;
// with neither, index.json must hold one entry (or only entries with
// platforms, from which the configured one is chosen). Indexes are followed
// down to the configured platform.
func (p *Puller) resolveLayout(ctx context.Context, pr ParsedRef) (*Image, error) {
	what := "resolve " + pr.String()
	dir, err := p.localPath(pr)
	if err != nil {
		return nil, err
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: not an OCI image layout: %w", what, err)
	}
	ii, err := lp.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	top, err := ii.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: read index.json: %w", what, err)
	}

	var desc v1.Descriptor
	switch {
	case pr.Digest != "":
		h, err := v1.NewHash(pr.Digest)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		desc = v1.Descriptor{Digest: h, Size: -1}
		for _, d := range top.Manifests {
			if d.Digest == h {
				desc = d
				break
			}
		}
	case pr.Tag != "":
		var matches []v1.Descriptor
		for _, d := range top.Manifests {
			if d.Annotations[refNameAnnotation] == pr.Tag {
				matches = append(matches, d)
			}
		}
		if desc, err = pickLayoutEntry(matches, p.platform, what); err != nil {
			if len(matches) == 0 {
				return nil, fmt.Errorf("%s: %w: no entry of index.json is tagged %q (tags: %s)", what, ErrNotFound, pr.Tag, layoutTags(top))
			}
			return nil, err
		}
	default:
		if desc, err = pickLayoutEntry(top.Manifests, p.platform, what); err != nil {
			if len(top.Manifests) == 0 {
				return nil, fmt.Errorf("%s: %w: index.json lists no image", what, ErrNotFound)
			}
			return nil, fmt.Errorf("%s: name one image with :TAG or @DIGEST (tags: %s): %w", what, layoutTags(top), err)
		}
	}

	for depth := 0; ; depth++ {
		raw, err := readLayoutBlob(ctx, lp, desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		mt := desc.MediaType
		if mt == "" {
			mt = sniffMediaType(raw)
		}
		if mt.IsImage() {
			m, err := v1.ParseManifest(bytes.NewReader(raw))
			if err != nil {
				return nil, fmt.Errorf("%s: parse manifest: %w", what, err)
			}
			rawConfig, err := readLayoutBlob(ctx, lp, m.Config.Digest)
			if err != nil {
				return nil, fmt.Errorf("%s: config: %w", what, err)
			}
			img, err := describe(pr.sourceName(), raw, rawConfig)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			img.src = layoutSource{dir: dir, name: pr.sourceName()}
			return img, nil
		}
		if !mt.IsIndex() {
			return nil, fmt.Errorf("%s: %w: media type %s", what, ErrUnsupported, mt)
		}
		if depth == 2 {
			return nil, fmt.Errorf("%s: %w: indexes nested too deep", what, ErrUnsupported)
		}
		im, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("%s: parse index: %w", what, err)
		}
		if desc, err = pickPlatform(im, p.platform, pr.String()); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
}

// pickLayoutEntry chooses among index.json entries: the only one, or by
// platform when every entry declares one.
func pickLayoutEntry(ds []v1.Descriptor, want v1.Platform, what string) (v1.Descriptor, error) {
	switch len(ds) {
	case 0:
		return v1.Descriptor{}, fmt.Errorf("%s: %w", what, ErrNotFound)
	case 1:
		return ds[0], nil
	}
	for _, d := range ds {
		if d.Platform == nil {
			return v1.Descriptor{}, fmt.Errorf("%w: %d entries match and not all declare a platform", ErrInvalidRef, len(ds))
		}
	}
	return pickPlatform(&v1.IndexManifest{Manifests: ds}, want, what)
}

func layoutTags(im *v1.IndexManifest) string {
	var tags []string
	for _, d := range im.Manifests {
		if t := d.Annotations[refNameAnnotation]; t != "" {
			tags = append(tags, t)
		}
	}
	if len(tags) == 0 {
		return "none"
	}
	sort.Strings(tags)
	return strings.Join(tags, ", ")
}

// sniffMediaType guesses the type of a manifest without a mediaType field.
func sniffMediaType(raw []byte) types.MediaType {
	var probe struct {
		MediaType types.MediaType `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
	}
	if json.Unmarshal(raw, &probe) != nil {
		return ""
	}
	if probe.MediaType != "" {
		return probe.MediaType
	}
	if probe.Manifests != nil {
		return types.OCIImageIndex
	}
	return types.OCIManifestSchema1
}

// readLayoutBlob reads a small blob of the layout and checks its digest.
func readLayoutBlob(ctx context.Context, lp layout.Path, h v1.Hash) ([]byte, error) {
	if h.Algorithm != "sha256" || !blobcache.IsHex64(h.Hex) {
		return nil, fmt.Errorf("%w: digest %q is not sha256", ErrUnsupported, h)
	}
	rc, err := lp.Blob(h)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: blob %s is missing from the layout", ErrNotFound, h)
	}
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(fsutil.ContextReader(ctx, rc), maxMetaSize+1))
	if err != nil {
		return nil, fmt.Errorf("read blob %s: %w", h, err)
	}
	if len(b) > maxMetaSize {
		return nil, fmt.Errorf("%w: blob %s is larger than %d bytes", ErrUnsupported, h, maxMetaSize)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != h.Hex {
		return nil, fmt.Errorf("%w: blob %s: expected %s, got sha256:%s", ErrDigestMismatch, h, h, got)
	}
	return b, nil
}

// layoutSource reads layer blobs from blobs/sha256/ of a layout directory.
type layoutSource struct {
	dir  string
	name string
}

func (s layoutSource) key() string { return s.name }

func (s layoutSource) openers(d v1.Hash) []blobOpener {
	return []blobOpener{{
		where: s.name,
		open: func(context.Context) (io.ReadCloser, error) {
			return layout.Path(s.dir).Blob(d)
		},
	}}
}

// tarEntry locates a member's data inside a tarball.
type tarEntry struct {
	off, size int64
	typ       byte
	link      string
}

// indexTar maps the members of a tarball to their data offsets, so members
// can be read in any order without rescanning. archive/tar reads exactly the
// header blocks, so the file offset after Next is the start of the data.
func indexTar(ctx context.Context, f *os.File) (map[string]tarEntry, error) {
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
			return tarEntry{}, fmt.Errorf("%w: %s is not in the archive", ErrNotFound, n)
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
			return tarEntry{}, fmt.Errorf("%w: %s is not a regular file", ErrUnsupported, n)
		}
	}
	return tarEntry{}, fmt.Errorf("%w: too many links at %s", ErrUnsupported, n)
}

func readMember(f *os.File, e tarEntry) ([]byte, error) {
	if e.size > maxMetaSize {
		return nil, fmt.Errorf("%w: member of %d bytes is too large", ErrUnsupported, e.size)
	}
	b := make([]byte, e.size)
	if _, err := f.ReadAt(b, e.off); err != nil {
		return nil, err
	}
	return b, nil
}

// resolveArchive reads a `docker save` tarball holding exactly one image.
// The tarball has no registry manifest, so one is synthesized: Docker v2
// schema 2, the config as stored, and each layer blob as stored (gzip or
// zstd layers are hashed here; an uncompressed layer's digest is its diff_id
// from the config, verified when Fetch copies it). For gzip-layer archives
// this is the manifest go-containerregistry's tarball.Image derives, so the
// digests agree.
func (p *Puller) resolveArchive(ctx context.Context, pr ParsedRef) (*Image, error) {
	what := "resolve " + pr.String()
	file, err := p.localPath(pr)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	idx, err := indexTar(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	me, err := lookup(idx, "manifest.json")
	if err != nil {
		return nil, fmt.Errorf("%s: not a docker save archive: %w", what, err)
	}
	raw, err := readMember(f, me)
	if err != nil {
		return nil, fmt.Errorf("%s: manifest.json: %w", what, err)
	}
	var tm tarball.Manifest
	if err := json.Unmarshal(raw, &tm); err != nil {
		return nil, fmt.Errorf("%s: parse manifest.json: %w", what, err)
	}
	if len(tm) != 1 {
		var tags []string
		for _, d := range tm {
			tags = append(tags, d.RepoTags...)
		}
		return nil, fmt.Errorf("%s: %w: the archive holds %d images (tags: %s); save one image per archive",
			what, ErrUnsupported, len(tm), strings.Join(tags, ", "))
	}
	desc := tm[0]
	ce, err := lookup(idx, desc.Config)
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", what, err)
	}
	rawConfig, err := readMember(f, ce)
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", what, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(rawConfig))
	if err != nil {
		return nil, fmt.Errorf("%s: parse config: %w", what, err)
	}
	csum := sha256.Sum256(rawConfig)
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.DockerManifestSchema2,
		Config: v1.Descriptor{
			MediaType: types.DockerConfigJSON,
			Size:      int64(len(rawConfig)),
			Digest:    v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(csum[:])},
		},
	}
	members := make(map[string]tarEntry)
	for i, lpath := range desc.Layers {
		e, err := lookup(idx, lpath)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %d: %w", what, i, err)
		}
		var magic [4]byte
		n, _ := f.ReadAt(magic[:], e.off)
		var ld v1.Descriptor
		switch {
		case n >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
			ld.MediaType = types.DockerLayer
		case n == 4 && bytes.Equal(magic[:], []byte{0x28, 0xb5, 0x2f, 0xfd}):
			ld.MediaType = types.OCILayerZStd
		default:
			ld.MediaType = types.DockerUncompressedLayer
		}
		ld.Size = e.size
		if ld.MediaType == types.DockerUncompressedLayer {
			if i >= len(cf.RootFS.DiffIDs) {
				return nil, fmt.Errorf("%s: layer %d has no diff_id in the config", what, i)
			}
			ld.Digest = cf.RootFS.DiffIDs[i]
		} else {
			h := sha256.New()
			if _, err := io.Copy(h, fsutil.ContextReader(ctx, io.NewSectionReader(f, e.off, e.size))); err != nil {
				return nil, fmt.Errorf("%s: hash layer %d: %w", what, i, err)
			}
			ld.Digest = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
		}
		members[ld.Digest.Hex] = e
		m.Layers = append(m.Layers, ld)
	}
	rawManifest, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	img, err := describe(pr.sourceName(), rawManifest, rawConfig)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	img.src = archiveSource{file: file, name: pr.sourceName(), members: members}
	return img, nil
}

// archiveSource reads layer blobs straight out of a tarball.
type archiveSource struct {
	file    string
	name    string
	members map[string]tarEntry
}

func (s archiveSource) key() string { return s.name }

func (s archiveSource) openers(d v1.Hash) []blobOpener {
	e, ok := s.members[d.Hex]
	if !ok {
		return nil
	}
	return []blobOpener{{
		where: s.name,
		open: func(context.Context) (io.ReadCloser, error) {
			f, err := os.Open(s.file)
			if err != nil {
				return nil, err
			}
			return sectionReadCloser{io.NewSectionReader(f, e.off, e.size), f}, nil
		},
	}}
}

type sectionReadCloser struct {
	*io.SectionReader
	f *os.File
}

func (s sectionReadCloser) Close() error { return s.f.Close() }
