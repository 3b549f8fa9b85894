package rootfs

import (
	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
)

// PullOptions configure image sources, the layer cache and the gzip
// inflater; the zero value of a field means its default. They are the
// puller's options themselves (rootfs/oci documents each field), so a
// field added there needs no copy here. Gzip also inflates the layers a
// build applies.
type PullOptions = oci.Options

// CacheStats describes the layer cache.
type CacheStats struct {
	// Bytes is the size of the cached files; Blobs the number of layers.
	Bytes int64
	Blobs int
	// ZstdBlobs counts layers kept in zstd form.
	ZstdBlobs int
	// TranscodePending counts layers queued for or being transcoded;
	// Transcoded and TranscodeFailures count outcomes since NewBuilder.
	TranscodePending  int
	Transcoded        int64
	TranscodeFailures int64
	// Hits counts the layers served from the cache since NewBuilder,
	// without fetching them; Misses those fetched from their source (or
	// from another fetch of it in flight).
	Hits, Misses int64
}

// ImageRef is a validated image reference.
type ImageRef struct {
	// Registry is the registry host of a registry reference, as requests
	// name it (docker.io is index.docker.io); "" for an offline source.
	Registry string
}

// ValidateImageRef checks an image reference (a registry reference or an
// offline oci-layout:/docker-archive: source) without any I/O.
func ValidateImageRef(ref string) (ImageRef, error) {
	pr, err := oci.ValidateImageRef(ref)
	if err != nil {
		return ImageRef{}, err
	}
	if pr.Kind != oci.KindRegistry {
		return ImageRef{}, nil
	}
	return ImageRef{Registry: pr.Reference.Context().RegistryStr()}, nil
}
