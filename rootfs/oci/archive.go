package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fsutil"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// archiveImages reads images from `docker save` tarballs under roots.
type archiveImages struct {
	roots []string
}

var _ imageSource = archiveImages{}

// resolve reads a `docker save` tarball holding exactly one image.
// The tarball has no registry manifest, so one is synthesized: Docker v2
// schema 2, the config as stored, and each layer blob as stored (gzip or
// zstd layers are hashed here; an uncompressed layer's digest is its diff_id
// from the config, verified when Fetch copies it). For gzip-layer archives
// this is the manifest go-containerregistry's tarball.Image derives, so the
// digests agree.
func (s archiveImages) resolve(ctx context.Context, pr ParsedRef, _ Source) (*Image, error) {
	what := "resolve " + pr.String()
	file, err := localPath(s.roots, pr)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	a, err := readArchive(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	img, err := describe(pr.sourceName(), a.manifest, a.config)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	img.src = archiveSource{file: file, name: pr.sourceName(), members: a.members}
	return img, nil
}

// archiveFile is what readArchive needs of a tarball: *os.File in
// production, *bytes.Reader in the fuzz target.
type archiveFile interface {
	io.ReadSeeker
	io.ReaderAt
}

// archive is the one image of a `docker save` tarball.
type archive struct {
	// manifest is the synthesized registry manifest (see resolve).
	manifest []byte
	// config is the image config as stored.
	config []byte
	// members locates each layer blob by digest hex.
	members map[string]tarEntry
}

// readArchive reads the image of a `docker save` tarball: it indexes the
// members, reads manifest.json and the config (each capped at maxMetaSize)
// and synthesizes the manifest.
func readArchive(ctx context.Context, f archiveFile) (archive, error) {
	idx, err := indexTar(ctx, f)
	if err != nil {
		return archive{}, err
	}
	me, err := lookup(idx, "manifest.json")
	if err != nil {
		return archive{}, fmt.Errorf("not a docker save archive: %w", err)
	}
	raw, err := readMember(f, me)
	if err != nil {
		return archive{}, fmt.Errorf("manifest.json: %w", err)
	}
	var tm tarball.Manifest
	if err := json.Unmarshal(raw, &tm); err != nil {
		return archive{}, fmt.Errorf("parse manifest.json: %w", err)
	}
	if len(tm) != 1 {
		var tags []string
		for _, d := range tm {
			tags = append(tags, d.RepoTags...)
		}
		return archive{}, fmt.Errorf("%w: the archive holds %d images (tags: %s); save one image per archive",
			ErrUnsupported, len(tm), safetext.Names(tags))
	}
	desc := tm[0]
	ce, err := lookup(idx, desc.Config)
	if err != nil {
		return archive{}, fmt.Errorf("config: %w", err)
	}
	rawConfig, err := readMember(f, ce)
	if err != nil {
		return archive{}, fmt.Errorf("config: %w", err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(rawConfig))
	if err != nil {
		return archive{}, fmt.Errorf("parse config: %w", err)
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
			return archive{}, fmt.Errorf("layer %d: %w", i, err)
		}
		var magic [layercodec.MagicLen]byte
		n, _ := f.ReadAt(magic[:], e.off)
		codec := layercodec.Detect(magic[:n])
		ld := v1.Descriptor{MediaType: codec.MediaType(), Size: e.size}
		if codec == layercodec.Uncompressed {
			if i >= len(cf.RootFS.DiffIDs) {
				return archive{}, fmt.Errorf("layer %d has no diff_id in the config", i)
			}
			ld.Digest = cf.RootFS.DiffIDs[i]
		} else {
			h := sha256.New()
			if _, err := io.Copy(h, fsutil.ContextReader(ctx, io.NewSectionReader(f, e.off, e.size))); err != nil {
				return archive{}, fmt.Errorf("hash layer %d: %w", i, err)
			}
			ld.Digest = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
		}
		members[ld.Digest.Hex] = e
		m.Layers = append(m.Layers, ld)
	}
	rawManifest, err := json.Marshal(m)
	if err != nil {
		return archive{}, fmt.Errorf("encode manifest: %w", err)
	}
	return archive{manifest: rawManifest, config: rawConfig, members: members}, nil
}

var _ blobSource = archiveSource{}

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
		open: func(_ context.Context, offset, _, _ int64, _ bool) (io.ReadCloser, int64, error) {
			f, err := os.Open(s.file)
			if err != nil {
				return nil, 0, err
			}
			offset = min(offset, e.size)
			return sectionReadCloser{io.NewSectionReader(f, e.off+offset, e.size-offset), f}, offset, nil
		},
	}}
}

type sectionReadCloser struct {
	*io.SectionReader
	f *os.File
}

func (s sectionReadCloser) Close() error { return s.f.Close() }
