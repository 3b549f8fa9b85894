package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/blobcache"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fsutil"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// refNameAnnotation names an image inside an OCI layout's index.json.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// layoutImages reads images from OCI image layout directories under roots.
type layoutImages struct {
	roots    []string
	platform v1.Platform
}

var _ imageSource = layoutImages{}

// resolve reads an image from an OCI image layout directory. An
// explicit digest names a manifest or index blob of the layout; a tag matches
// the org.opencontainers.image.ref.name annotation of index.json entries;
// with neither, index.json must hold one entry (or only entries with
// platforms, from which the configured one is chosen). Indexes are followed
// down to the configured platform.
func (s layoutImages) resolve(ctx context.Context, pr ParsedRef, _ Source) (*Image, error) {
	what := "resolve " + pr.String()
	dir, err := localPath(s.roots, pr)
	if err != nil {
		return nil, err
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: not an OCI image layout: %w", what, err)
	}
	top, err := readLayoutIndex(ctx, lp)
	if err != nil {
		return nil, fmt.Errorf("%s: read index.json: %w", what, err)
	}
	desc, err := chooseLayoutEntry(top, pr, s.platform, what)
	if err != nil {
		return nil, err
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
			return nil, fmt.Errorf("%s: %w: media type %s", what, ErrUnsupported, safetext.Name(string(mt)))
		}
		if depth == 2 {
			return nil, fmt.Errorf("%s: %w: indexes nested too deep", what, ErrUnsupported)
		}
		im, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("%s: parse index: %w", what, err)
		}
		if desc, err = pickPlatform(im, s.platform, pr.String()); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
}

// chooseLayoutEntry picks the index.json entry pr names: by digest (any
// blob of the layout, listed or not), by tag, or the only image.
func chooseLayoutEntry(top *v1.IndexManifest, pr ParsedRef, platform v1.Platform, what string) (v1.Descriptor, error) {
	switch {
	case pr.Digest != "":
		h, err := v1.NewHash(pr.Digest)
		if err != nil {
			return v1.Descriptor{}, fmt.Errorf("%s: %w", what, err)
		}
		for _, d := range top.Manifests {
			if d.Digest == h {
				return d, nil
			}
		}
		return v1.Descriptor{Digest: h, Size: -1}, nil
	case pr.Tag != "":
		var matches []v1.Descriptor
		for _, d := range top.Manifests {
			if d.Annotations[refNameAnnotation] == pr.Tag {
				matches = append(matches, d)
			}
		}
		desc, err := pickLayoutEntry(matches, platform, what)
		if err != nil && len(matches) == 0 {
			return v1.Descriptor{}, fmt.Errorf("%s: %w: no entry of index.json is tagged %q (tags: %s)", what, ErrNotFound, pr.Tag, layoutTags(top))
		}
		return desc, err
	default:
		desc, err := pickLayoutEntry(top.Manifests, platform, what)
		if err != nil {
			if len(top.Manifests) == 0 {
				return v1.Descriptor{}, fmt.Errorf("%s: %w: index.json lists no image", what, ErrNotFound)
			}
			return v1.Descriptor{}, fmt.Errorf("%s: name one image with :TAG or @DIGEST (tags: %s): %w", what, layoutTags(top), err)
		}
		return desc, nil
	}
}

// readLayoutIndex reads the index.json of a layout, at most maxMetaSize
// bytes: a layout copied from elsewhere may hold anything, and
// go-containerregistry's ImageIndex reads the file whole, however large.
func readLayoutIndex(ctx context.Context, lp layout.Path) (*v1.IndexManifest, error) {
	f, err := os.Open(filepath.Join(string(lp), "index.json"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(fsutil.ContextReader(ctx, f), maxMetaSize+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxMetaSize {
		return nil, fmt.Errorf("%w: index.json is larger than %d bytes", ErrUnsupported, maxMetaSize)
	}
	return parseLayoutIndex(raw)
}

// parseLayoutIndex parses the content of index.json (a whole JSON value,
// as go-containerregistry's layout reader takes it).
func parseLayoutIndex(raw []byte) (*v1.IndexManifest, error) {
	var im v1.IndexManifest
	if err := json.Unmarshal(raw, &im); err != nil {
		return nil, err
	}
	return &im, nil
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
	return safetext.Names(tags)
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
		return nil, fmt.Errorf("%w: digest %s is not sha256", ErrUnsupported, safetext.Name(h.String()))
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

var _ blobSource = layoutSource{}

// layoutSource reads layer blobs from blobs/sha256/ of a layout directory.
type layoutSource struct {
	dir  string
	name string
}

func (s layoutSource) key() string { return s.name }

func (s layoutSource) openers(d v1.Hash) []blobOpener {
	return []blobOpener{{
		where: s.name,
		open: func(_ context.Context, offset, _, _ int64, _ bool) (io.ReadCloser, int64, error) {
			rc, err := layout.Path(s.dir).Blob(d)
			if err != nil {
				return nil, 0, err
			}
			// A blob file seeks; anything else is read from its start.
			if sk, ok := rc.(io.Seeker); ok && offset > 0 {
				if _, err := sk.Seek(offset, io.SeekStart); err == nil {
					return rc, offset, nil
				}
			}
			return rc, 0, nil
		},
	}}
}
