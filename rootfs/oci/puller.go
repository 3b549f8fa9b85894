package oci

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/blobcache"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// Defaults and limits of Options.
const (
	// DefaultCacheQuotaBytes is the cache size used when Options.CacheQuotaBytes is 0.
	DefaultCacheQuotaBytes = 20 << 30
	// DefaultJobs is the number of layer downloads connected at once when Options.Jobs is 0.
	DefaultJobs = 6
	// MaxJobs caps Options.Jobs.
	MaxJobs = 32
	// DefaultDownloadConnections is Options.DownloadConnections when 0.
	DefaultDownloadConnections = 8
	// MaxDownloadConnections caps Options.DownloadConnections.
	MaxDownloadConnections = 64
	// DefaultLayerConnections is Options.LayerConnections when 0.
	DefaultLayerConnections = 8
)

// guardedBase makes the base transport of each registry: the reach
// policy's pools, stall and minimum-rate guards, and retries.
func guardedBase(opts Options, policy *netPolicy, ps *pools) func(registry string) http.RoundTripper {
	stall := cmp.Or(opts.StallTimeout, DefaultStallTimeout)
	rate := cmp.Or(opts.MinTransferRate, DefaultMinTransferRate)
	minBytes := max(int64(float64(rate)*stall.Seconds()), 1)
	return func(registry string) http.RoundTripper {
		return transport.NewRetry(&guardTransport{inner: newReach(policy, ps, registry), policy: policy, stall: stall, minBytes: minBytes},
			transport.WithRetryStatusCodes(retryStatusCodes...))
	}
}

// addHosts records the insecure registries and the mirrors of opts, and
// lists their hosts with the reach policy as named by the operator.
func (reg *registryImages) addHosts(opts Options, policy *netPolicy) error {
	for _, h := range opts.Insecure {
		r, err := name.NewRegistry(h)
		if err != nil {
			return fmt.Errorf("insecure registry %q: %w", h, err)
		}
		reg.insecure[r.RegistryStr()] = true
		policy.list(r.RegistryStr())
	}
	for host, list := range opts.Mirrors {
		r, err := name.NewRegistry(host)
		if err != nil {
			return fmt.Errorf("mirrors of %q: %w", host, err)
		}
		for _, m := range list {
			mi, err := parseMirror(m)
			if err != nil {
				return fmt.Errorf("mirror %q of %s: %w", m, host, err)
			}
			reg.mirrors[r.RegistryStr()] = append(reg.mirrors[r.RegistryStr()], mi)
			mhost, _, _ := strings.Cut(mi.prefix, "/")
			policy.list(mhost)
		}
	}
	return nil
}

// Options configure a Puller.
type Options struct {
	// CacheDir holds the blob cache in <CacheDir>/blobs/sha256/<hex>; required.
	// One Puller at a time may use it (New takes a lock).
	CacheDir string
	// CacheQuotaBytes is the size the cache is LRU-evicted down to
	// (DefaultCacheQuotaBytes when 0). Blobs pinned by open Layers are never
	// evicted, so the cache can exceed it while large builds run.
	CacheQuotaBytes int64
	// Platform picks the image of a multi-platform index; the default is
	// linux/<runtime.GOARCH>. A Variant, when set, must match too.
	Platform v1.Platform
	// Mirrors maps a registry host (as in references: docker.io, quay.io,
	// host:port) to mirrors tried first, in order, before the registry
	// itself. A mirror is host[:port][/path-prefix], optionally written
	// http://... for plain HTTP. Mirrors get keychain credentials only; the
	// Source's username and password go to the original registry alone.
	Mirrors map[string][]string
	// Insecure lists registry hosts spoken to over plain HTTP, besides
	// references written http://... .
	Insecure []string
	// Jobs bounds the layer downloads of one Fetch connected at once
	// (DefaultJobs when 0, at most MaxJobs). Their bodies are read by as
	// many streams as DownloadConnections and the adaptive rule allow,
	// bottom layer first, so the layer a build applies first gets the
	// link first; the others wait connected, ready to go on.
	Jobs int
	// DownloadConnections bounds the response bodies read at once by all
	// the Fetches of the Puller (DefaultDownloadConnections when 0, at
	// most MaxDownloadConnections). Each Fetch starts with one and
	// doubles its streams while that raises its throughput by more than
	// an eighth; the extra streams fetch a layer's bytes as parallel
	// ranged chunks (at least 8 MiB blobs), the layer being applied
	// first, then the next ones. 1 reads one body at a time.
	DownloadConnections int
	// LayerConnections bounds the streams of one layer blob
	// (DefaultLayerConnections when 0, at most DownloadConnections).
	LayerConnections int
	// Keychain supplies credentials when a Source has none
	// (authn.DefaultKeychain when nil: docker's config.json, DOCKER_CONFIG
	// honoured, and credential helpers).
	Keychain authn.Keychain
	// Transport carries all registry traffic (remote.DefaultTransport's
	// settings when nil). It must be an *http.Transport: New uses clones
	// with the network policy installed (one per side a registry keeps
	// its connections to, so that no connection is reused across sides;
	// see netpolicy.go, reach). A nil DialContext becomes a dialer
	// that checks every resolved address before connecting; a DialContext
	// or DialTLSContext of its own is kept, and the address each of its
	// connections reached is checked before a byte is sent on it.
	Transport http.RoundTripper
	// DenyNetworks lists networks no registry connection may reach
	// (registry, token endpoint, blob redirects, mirrors), besides
	// DefaultDenyNetworks, which always apply. Names are checked after
	// resolution, IPv4-mapped IPv6 addresses as IPv4. Through an HTTP
	// proxy, the proxy resolves: a URL's address, and the addresses the
	// node's own resolver gives its name, are checked before the request
	// goes to the proxy; a name the node cannot resolve is the proxy's to
	// place.
	DenyNetworks []netip.Prefix
	// LiftDefaultDeny lists entries of DefaultDenyNetworks that do not
	// apply; each must be one of them, as written there.
	LiftDefaultDeny []netip.Prefix
	// AllowNetworks, when not empty, is the only networks registry
	// connections may reach (DenyNetworks still applies). An address in
	// it may be reached even if it is one of the host's own.
	AllowNetworks []netip.Prefix
	// StallTimeout ends a registry request whose response headers bring
	// no data for this long, or whose body brings less than
	// MinTransferRate × StallTimeout bytes in a window this long
	// (DefaultStallTimeout when 0). A small document (ping, token,
	// manifest, config) must also be complete within twice StallTimeout.
	// A stalled manifest or layer download is tried once more, then fails
	// with ErrStalled.
	StallTimeout time.Duration
	// MinTransferRate is the slowest a registry response may deliver, in
	// bytes per second averaged over StallTimeout (DefaultMinTransferRate
	// when 0).
	MinTransferRate int64
	// TranscodeZstd has the cache re-encode gzip layers as zstd in the
	// background once the build that fetched them ends: later builds
	// decompress them several times faster. Layers.Open then returns the
	// zstd form. Close stops a transcode in progress.
	TranscodeZstd bool
	// Gzip inflates gzip layers for the zstd re-encode
	// (layercodec.NewGzipInflater(layercodec.InflaterAuto) when nil).
	Gzip *layercodec.GzipInflater
	// Logger receives the cache's warnings (slog.DiscardHandler when nil).
	Logger *slog.Logger
	// LocalRoots lists the directories offline sources (oci-layout:,
	// docker-archive:) must lie under, after resolving symlinks. When empty,
	// offline sources are refused: a build request must not read arbitrary
	// files of the node.
	LocalRoots []string
}

// Source is what a build asks for: an image reference and optional registry
// credentials.
type Source struct {
	Ref      string
	Username string
	Password string
}

// ImageConfig is the part of the image config a template keeps; the JSON keys
// are those of upstream's DockerImageConfig.
type ImageConfig struct {
	Entrypoint []string `json:"Entrypoint"`
	Cmd        []string `json:"Cmd"`
	Env        []string `json:"Env"`
	WorkingDir string   `json:"WorkingDir"`
	User       string   `json:"User"`
}

// Layer describes one layer blob of an image's manifest.
type Layer struct {
	Digest    v1.Hash
	Size      int64
	MediaType types.MediaType
}

// Image is a resolved image: identity, config and layer list. Fetch uses the
// unexported fields to download the layers from where the manifest came.
type Image struct {
	// Digest is "<repository>@sha256:<manifest digest>" as upstream's native
	// mode writes it (index.docker.io/ shown as docker.io/). For a
	// multi-platform index it is the digest of the chosen platform's manifest.
	// Offline sources use the reference without tag or digest in place of the
	// repository: "oci-layout:/srv/img@sha256:…", "docker-archive:/srv/a.tar@sha256:…".
	Digest string
	// ManifestDigest is the manifest digest alone.
	ManifestDigest v1.Hash
	// Config holds Entrypoint, Cmd, Env, WorkingDir and User.
	Config ImageConfig
	// Created is the image config's "created" time (zero if absent).
	Created time.Time
	// Architecture is the image config's GOARCH ("amd64", "arm64"; ""
	// if absent).
	Architecture string
	// Layers lists the layer blobs in manifest order (bottom first).
	Layers []Layer
	// CompressedSize is the sum of the layer sizes in the manifest.
	CompressedSize int64

	src     blobSource
	secrets []string
}

// Puller resolves images and fetches their layers into the shared cache.
// It is safe for concurrent use.
type Puller struct {
	platform v1.Platform
	jobs     int
	// slots holds a token per response body read, across Fetches
	// (Options.DownloadConnections); perBlob is Options.LayerConnections.
	slots   chan struct{}
	perBlob int
	chunks  chunking
	// firstStreams is the streams a Fetch starts with (1 when 0); tests
	// that need several streams from the first byte on set more.
	firstStreams int
	// sources resolves references by kind.
	sources map[RefKind]imageSource

	cache *blobcache.Cache
}

// New checks opts and opens the layer cache in opts.CacheDir (see
// rootfs/blobcache): it creates the directory, locks it against other
// Pullers and removes temp files a crash left behind.
func New(opts Options) (*Puller, error) {
	if opts.CacheDir == "" {
		return nil, errors.New("new puller: CacheDir is required")
	}
	if opts.CacheQuotaBytes < 0 || opts.Jobs < 0 || opts.StallTimeout < 0 || opts.MinTransferRate < 0 ||
		opts.DownloadConnections < 0 || opts.LayerConnections < 0 {
		return nil, errors.New("new puller: CacheQuotaBytes, Jobs, StallTimeout, MinTransferRate, DownloadConnections and LayerConnections must not be negative")
	}
	p := &Puller{platform: opts.Platform, jobs: opts.Jobs, chunks: defaultChunking}
	conns := cmp.Or(opts.DownloadConnections, DefaultDownloadConnections)
	conns = min(conns, MaxDownloadConnections)
	p.slots = make(chan struct{}, conns)
	p.perBlob = min(cmp.Or(opts.LayerConnections, DefaultLayerConnections), conns)
	reg := &registryImages{
		mirrors:    make(map[string][]mirror),
		insecure:   make(map[string]bool),
		keychain:   opts.Keychain,
		transports: newTransportCache(),
	}
	if p.platform.OS == "" {
		p.platform.OS = "linux"
	}
	if p.platform.Architecture == "" {
		p.platform.Architecture = runtime.GOARCH
	}
	if p.jobs == 0 {
		p.jobs = DefaultJobs
	}
	p.jobs = min(p.jobs, MaxJobs)
	if reg.keychain == nil {
		reg.keychain = authn.DefaultKeychain
	}
	policy, err := newNetPolicy(opts.DenyNetworks, opts.AllowNetworks, opts.LiftDefaultDeny, nil)
	if err != nil {
		return nil, fmt.Errorf("new puller: %w", err)
	}
	dt, ok := remote.DefaultTransport.(*http.Transport)
	if !ok {
		return nil, errors.New("new puller: remote.DefaultTransport is not an *http.Transport")
	}
	pools, err := policy.policyTransports(opts.Transport, dt)
	if err != nil {
		return nil, fmt.Errorf("new puller: %w", err)
	}
	policy.list(proxyTargets(pools.any)...)
	// Keep a connection per stream and per download connected ahead: a
	// chunk's request then reuses one instead of connecting again.
	for _, tr := range []*http.Transport{pools.any, pools.public, pools.internal} {
		if idle := cap(p.slots) + p.jobs; tr.MaxIdleConnsPerHost < idle {
			tr.MaxIdleConnsPerHost = idle
		}
	}
	reg.newBase = guardedBase(opts, policy, pools)
	if err := reg.addHosts(opts, policy); err != nil {
		return nil, fmt.Errorf("new puller: %w", err)
	}
	for _, r := range opts.LocalRoots {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("new puller: local root %q is not absolute", r)
		}
	}
	reg.platform = p.platform
	p.sources = map[RefKind]imageSource{
		KindRegistry:      reg,
		KindOCILayout:     layoutImages{roots: opts.LocalRoots, platform: p.platform},
		KindDockerArchive: archiveImages{roots: opts.LocalRoots},
	}

	quota := opts.CacheQuotaBytes
	if quota == 0 {
		quota = DefaultCacheQuotaBytes
	}
	c, err := blobcache.Open(blobcache.Options{Dir: opts.CacheDir, QuotaBytes: quota,
		TranscodeZstd: opts.TranscodeZstd, Gzip: opts.Gzip, Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("new puller: %w", err)
	}
	p.cache = c
	return p, nil
}

// Close stops the cache's transcoder and releases the cache lock. Layers
// still open stay readable, but the Puller must not be used afterwards.
func (p *Puller) Close() error {
	if err := p.cache.Close(); err != nil {
		return fmt.Errorf("close puller: %w", err)
	}
	return nil
}

// CacheStats describes the layer cache.
type CacheStats struct {
	// Bytes is the size of the cached files; Blobs the number of layers.
	Bytes int64
	Blobs int
	// ZstdBlobs counts layers kept in zstd form.
	ZstdBlobs int
	// TranscodePending counts layers queued for or being transcoded;
	// Transcoded and TranscodeFailures count outcomes since New.
	TranscodePending  int
	Transcoded        int64
	TranscodeFailures int64
	// Hits counts the layers served from the cache since New, Misses
	// those fetched from their source (or from another fetch of it in
	// flight).
	Hits, Misses int64
}

// Cached reports whether every layer of img is in the layer cache, so
// that fetching it downloads nothing (unless a blob turns out corrupt).
func (p *Puller) Cached(img *Image) bool {
	for _, l := range img.Layers {
		if !p.cache.Has(l.Digest.Hex) {
			return false
		}
	}
	return true
}

// CacheStats returns the state of the layer cache and its transcoder.
func (p *Puller) CacheStats() CacheStats {
	st := p.cache.Stats()
	return CacheStats{Bytes: st.Bytes, Blobs: st.Blobs, ZstdBlobs: st.ZstdBlobs,
		TranscodePending: st.TranscodePending, Transcoded: st.Transcoded, TranscodeFailures: st.TranscodeFailures,
		Hits: st.Hits, Misses: st.Misses}
}

func parseMirror(m string) (mirror, error) {
	out := mirror{prefix: m}
	switch {
	case strings.HasPrefix(m, "http://"):
		out.prefix, out.insecure = strings.TrimPrefix(m, "http://"), true
	case strings.HasPrefix(m, "https://"):
		out.prefix = strings.TrimPrefix(m, "https://")
	}
	out.prefix = strings.TrimSuffix(out.prefix, "/")
	host, _, _ := strings.Cut(out.prefix, "/")
	if _, err := name.NewRegistry(host); err != nil {
		return mirror{}, err
	}
	if _, err := name.NewRepository(out.prefix+"/x", name.StrictValidation); err != nil {
		return mirror{}, err
	}
	return out, nil
}

// Resolve reads the manifest and config of src's image, choosing the
// configured platform from an index. It downloads no layer.
func (p *Puller) Resolve(ctx context.Context, src Source) (*Image, error) {
	pr, err := ValidateImageRef(src.Ref)
	if err != nil {
		return nil, err
	}
	var img *Image
	if is, ok := p.sources[pr.Kind]; ok {
		img, err = is.resolve(ctx, pr, src)
	} else {
		err = fmt.Errorf("%w: unknown reference kind %v", ErrInvalidRef, pr.Kind)
	}
	if err != nil {
		return nil, safetext.RedactError(err, secrets(src)...)
	}
	return img, nil
}

// secrets lists the strings of src that must never appear in an error.
func secrets(src Source) []string {
	if src.Password == "" {
		return nil
	}
	return []string{
		src.Password,
		base64.StdEncoding.EncodeToString([]byte(src.Username + ":" + src.Password)),
	}
}

// describe fills an Image from a manifest and config, checking that they
// describe a container image and that the config matches its digest.
func describe(sourceName string, rawManifest, rawConfig []byte) (*Image, error) {
	m, err := v1.ParseManifest(bytes.NewReader(rawManifest))
	if err != nil {
		return nil, fmt.Errorf("parse manifest: %w", err)
	}
	if m.MediaType != "" && !m.MediaType.IsImage() {
		return nil, fmt.Errorf("%w: manifest media type %s", ErrUnsupported, safetext.Name(string(m.MediaType)))
	}
	if m.Config.MediaType != "" && !m.Config.MediaType.IsConfig() {
		return nil, fmt.Errorf("%w: config media type %s is not a container image config (an artifact?)", ErrUnsupported, safetext.Name(string(m.Config.MediaType)))
	}
	sum := sha256.Sum256(rawConfig)
	if got := "sha256:" + hex.EncodeToString(sum[:]); m.Config.Digest.String() != got || m.Config.Size != int64(len(rawConfig)) {
		return nil, fmt.Errorf("config: %w: expected %s (%d bytes), got %s (%d bytes)",
			ErrDigestMismatch, m.Config.Digest, m.Config.Size, got, len(rawConfig))
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(rawConfig))
	if err != nil {
		return nil, fmt.Errorf("parse image config: %w", err)
	}
	msum := sha256.Sum256(rawManifest)
	md := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(msum[:])}
	img := &Image{
		Digest:         sourceName + "@" + md.String(),
		ManifestDigest: md,
		Config: ImageConfig{
			Entrypoint: cf.Config.Entrypoint,
			Cmd:        cf.Config.Cmd,
			Env:        cf.Config.Env,
			WorkingDir: cf.Config.WorkingDir,
			User:       cf.Config.User,
		},
		Created:      cf.Created.Time,
		Architecture: cf.Architecture,
	}
	for i, l := range m.Layers {
		if !l.MediaType.IsLayer() {
			return nil, fmt.Errorf("%w: layer %d has media type %s", ErrUnsupported, i, safetext.Name(string(l.MediaType)))
		}
		if l.Digest.Algorithm != "sha256" || !blobcache.IsHex64(l.Digest.Hex) {
			return nil, fmt.Errorf("%w: layer %d digest %s is not sha256", ErrUnsupported, i, safetext.Name(l.Digest.String()))
		}
		if l.Size < 0 {
			return nil, fmt.Errorf("%w: layer %d has negative size", ErrUnsupported, i)
		}
		img.Layers = append(img.Layers, Layer{Digest: l.Digest, Size: l.Size, MediaType: l.MediaType})
		img.CompressedSize += l.Size
	}
	return img, nil
}

// pickPlatform chooses the first manifest of an index matching want, or
// explains which platforms the index offers.
func pickPlatform(im *v1.IndexManifest, want v1.Platform, where string) (v1.Descriptor, error) {
	var avail []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			continue
		}
		if d.Platform.Satisfies(want) && (d.MediaType.IsImage() || d.MediaType.IsIndex()) {
			return d, nil
		}
		avail = append(avail, d.Platform.String())
	}
	listed := "none declared"
	if len(avail) > 0 {
		listed = safetext.Names(avail)
	}
	return v1.Descriptor{}, fmt.Errorf("%w: %s has no image for %s; available: %s",
		ErrNoPlatform, where, want.String(), listed)
}
