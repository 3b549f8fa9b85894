package rootfs

import (
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
)

// PullOptions configure image sources and the layer cache; the zero value
// of a field means its default (rootfs/oci documents each).
type PullOptions struct {
	// CacheDir holds the layer cache; required. One Builder at a time may
	// use it.
	CacheDir string
	// CacheQuotaBytes is the size the cache is evicted down to (20 GiB
	// when 0).
	CacheQuotaBytes int64
	// Platform picks the image of a multi-platform index (linux/GOARCH
	// when empty).
	Platform v1.Platform
	// Mirrors maps a registry host to mirrors tried first, in order.
	Mirrors map[string][]string
	// Insecure lists registry hosts spoken to over plain HTTP.
	Insecure []string
	// Jobs bounds parallel layer downloads per build (6 when 0, at most 32).
	Jobs int
	// Keychain supplies registry credentials when a Source has none
	// (docker's config.json and credential helpers when nil).
	Keychain authn.Keychain
	// Transport carries all registry traffic (a default transport when
	// nil); it must be an *http.Transport, which gets the network policy
	// installed (rootfs/oci documents how).
	Transport http.RoundTripper
	// DenyNetworks lists the networks registry connections may not reach
	// (link-local and cloud metadata addresses when nil; an empty slice
	// denies nothing).
	DenyNetworks []netip.Prefix
	// AllowNetworks, when not empty, is the only networks registry
	// connections may reach.
	AllowNetworks []netip.Prefix
	// StallTimeout ends a registry download that brings no data for this
	// long, or less than MinTransferRate over this long (5 minutes when 0);
	// it is tried once more, then the build fails.
	StallTimeout time.Duration
	// MinTransferRate is the slowest a registry response may deliver, in
	// bytes per second averaged over StallTimeout (1 KiB/s when 0).
	MinTransferRate int64
	// TranscodeZstd has the cache re-encode gzip layers as zstd in the
	// background, so later builds decompress them faster.
	TranscodeZstd bool
	// Logger receives the cache's warnings (discarded when nil).
	Logger *slog.Logger
	// LocalRoots lists the directories offline sources must lie under;
	// when empty, offline sources are refused.
	LocalRoots []string
}

// ociOptions maps o onto the puller's options.
func (o PullOptions) ociOptions() oci.Options {
	return oci.Options{
		CacheDir:        o.CacheDir,
		CacheQuotaBytes: o.CacheQuotaBytes,
		Platform:        o.Platform,
		Mirrors:         o.Mirrors,
		Insecure:        o.Insecure,
		Jobs:            o.Jobs,
		Keychain:        o.Keychain,
		Transport:       o.Transport,
		DenyNetworks:    o.DenyNetworks,
		AllowNetworks:   o.AllowNetworks,
		StallTimeout:    o.StallTimeout,
		MinTransferRate: o.MinTransferRate,
		TranscodeZstd:   o.TranscodeZstd,
		Logger:          o.Logger,
		LocalRoots:      o.LocalRoots,
	}
}

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
