package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// retryStatusCodes are the answers a registry request is repeated on.
var retryStatusCodes = []int{
	http.StatusRequestTimeout,
	http.StatusTooManyRequests,
	http.StatusInternalServerError,
	http.StatusBadGateway,
	http.StatusServiceUnavailable,
	http.StatusGatewayTimeout,
}

// maxRedirects bounds the redirects of one blob request.
const maxRedirects = 5

// endpoint is one place an image can be read from: a mirror or the
// registry itself, with the credentials for it. The authenticated transport
// (ping, token exchange) is made on first use and then reused by Fetch.
type endpoint struct {
	repo   name.Repository
	auth   authn.Authenticator
	mirror bool

	// shared keeps the transport for later resolves under key; nil for
	// an endpoint with the build request's own credentials.
	shared *transportCache
	key    string

	mu sync.Mutex
	rt http.RoundTripper
}

// transport returns ep's authenticated transport, made on first use over
// newBase(registry host): the registry's requests, its token realm's and
// its redirects' all go through it, so the network policy knows which
// registry they came from.
func (ep *endpoint) transport(ctx context.Context, newBase func(registry string) http.RoundTripper) (http.RoundTripper, error) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.rt != nil {
		return ep.rt, nil
	}
	if ep.shared != nil {
		if rt := ep.shared.get(ep.key); rt != nil {
			ep.rt = rt
			return rt, nil
		}
	}
	rt, err := transport.NewWithContext(ctx, ep.repo.Registry, ep.auth, newBase(ep.repo.RegistryStr()), []string{ep.repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, err
	}
	ep.rt = rt
	if ep.shared != nil {
		ep.shared.put(ep.key, rt)
	}
	return rt, nil
}

// keptConfig returns the image config of digest kept with ep's shared
// transport (transportCache), nil when there is none.
func (ep *endpoint) keptConfig(digest string) []byte {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.shared == nil || ep.rt == nil {
		return nil
	}
	return ep.shared.config(ep.key, ep.rt, digest)
}

// keepConfig keeps an image config read through ep's shared transport for
// later resolves; an endpoint with the request's own credentials keeps
// nothing.
func (ep *endpoint) keepConfig(raw []byte) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.shared != nil && ep.rt != nil {
		ep.shared.keepConfig(ep.key, ep.rt, raw)
	}
}

// forgetTransport stops later resolves from reusing ep's transport, after
// it failed: the next one pings the registry afresh.
func (ep *endpoint) forgetTransport() {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.shared != nil && ep.rt != nil {
		ep.shared.drop(ep.key, ep.rt)
	}
}

// registryImages reads images from registries, trying the mirrors of a
// registry before it.
type registryImages struct {
	platform v1.Platform
	mirrors  map[string][]mirror
	insecure map[string]bool
	keychain authn.Keychain
	// newBase makes the transport under an endpoint's authenticated one,
	// which carries its requests: network policy, stall watchdog, retries.
	newBase func(registry string) http.RoundTripper
	// transports keeps authenticated transports between resolves.
	transports *transportCache
}

var _ imageSource = (*registryImages)(nil)

// mirror is one parsed Options.Mirrors entry.
type mirror struct {
	prefix   string // host[:port][/path]
	insecure bool
}

// endpoints lists the mirrors of ref's registry, then the registry.
func (p *registryImages) endpoints(ctx context.Context, pr ParsedRef, src Source) ([]*endpoint, error) {
	origin := pr.Reference.Context()
	host := origin.RegistryStr()
	var eps []*endpoint
	for _, m := range p.mirrors[host] {
		var opts []name.Option
		if m.insecure || p.insecure[strings.SplitN(m.prefix, "/", 2)[0]] {
			opts = append(opts, name.Insecure)
		}
		repo, err := name.NewRepository(m.prefix+"/"+origin.RepositoryStr(), opts...)
		if err != nil {
			return nil, fmt.Errorf("mirror %s: %w", m.prefix, err)
		}
		auth, err := authn.Resolve(ctx, p.keychain, repo)
		if err != nil {
			return nil, fmt.Errorf("credentials for mirror %s: %w", m.prefix, err)
		}
		eps = append(eps, p.sharedEndpoint(repo, auth, true))
	}
	var opts []name.Option
	if pr.PlainHTTP || p.insecure[host] {
		opts = append(opts, name.Insecure)
	}
	repo, err := name.NewRepository(origin.Name(), opts...)
	if err != nil {
		return nil, fmt.Errorf("repository %s: %w", origin.Name(), err)
	}
	if src.Username != "" || src.Password != "" {
		// The request's own credentials: its transport is its own.
		return append(eps, &endpoint{repo: repo, auth: &authn.Basic{Username: src.Username, Password: src.Password}}), nil
	}
	auth, err := authn.Resolve(ctx, p.keychain, repo)
	if err != nil {
		return nil, fmt.Errorf("credentials for %s: %w", host, err)
	}
	return append(eps, p.sharedEndpoint(repo, auth, false)), nil
}

// sharedEndpoint is an endpoint with the node's credentials (keychain or
// anonymous), whose transport later resolves of repo reuse.
func (p *registryImages) sharedEndpoint(repo name.Repository, auth authn.Authenticator, mirror bool) *endpoint {
	ep := &endpoint{repo: repo, auth: auth, mirror: mirror}
	if p.transports != nil {
		// The scheme is part of the key: the same name may be configured
		// insecure later.
		ep.shared, ep.key = p.transports, repo.Registry.Scheme()+"://"+repo.Name()
	}
	return ep
}

// resolve tries each endpoint in turn; the first that serves the manifest
// also serves the layers (falling through to the later endpoints when it
// fails). The digest string always names the original repository.
func (p *registryImages) resolve(ctx context.Context, pr ParsedRef, src Source) (*Image, error) {
	eps, err := p.endpoints(ctx, pr, src)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", pr.Reference, err)
	}
	var mirrorErrs []string
	for i, ep := range eps {
		img, err := p.resolveAt(ctx, ep, pr.Reference)
		if errors.Is(err, ErrStalled) && ctx.Err() == nil {
			img, err = p.resolveAt(ctx, ep, pr.Reference) // once more, then give up
		}
		if err == nil {
			img.Digest = pr.sourceName() + "@" + img.ManifestDigest.String()
			img.src = &registrySource{p: p, eps: eps[i:]}
			img.secrets = secrets(src)
			return img, nil
		}
		ep.forgetTransport()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("resolve %s: %w", pr.Reference, ctx.Err())
		}
		if !ep.mirror {
			if len(mirrorErrs) > 0 {
				return nil, fmt.Errorf("%w (mirrors tried first: %s)", err, strings.Join(mirrorErrs, "; "))
			}
			return nil, err
		}
		mirrorErrs = append(mirrorErrs, err.Error())
	}
	return nil, fmt.Errorf("resolve %s: no endpoint", pr.Reference)
}

// resolveAt reads manifest and config of ref from one endpoint.
func (p *registryImages) resolveAt(ctx context.Context, ep *endpoint, ref name.Reference) (*Image, error) {
	host := ep.repo.RegistryStr()
	var r name.Reference = ep.repo.Tag(ref.Identifier())
	if d, ok := ref.(name.Digest); ok {
		r = ep.repo.Digest(d.DigestStr())
	}
	target := r.Name()
	if rest, ok := strings.CutPrefix(target, name.DefaultRegistry+"/"); ok {
		target = "docker.io/" + rest
	}
	what := "resolve " + target
	rt, err := ep.transport(ctx, p.newBase)
	if err != nil {
		return nil, classify(err, what, host)
	}
	mctx := withBodyCap(ctx, "manifest", MaxManifestBytes)
	ropts := []remote.Option{remote.WithTransport(rt), remote.WithContext(mctx), remote.WithPlatform(p.platform)}
	desc, err := remote.Get(r, ropts...)
	if err != nil {
		return nil, classify(err, what, host)
	}
	// Follow indexes (at most two levels) down to the platform's image.
	for depth := 0; desc.MediaType.IsIndex(); depth++ {
		if depth == 2 {
			return nil, fmt.Errorf("%s: %w: indexes nested too deep", what, ErrUnsupported)
		}
		im, err := v1.ParseIndexManifest(bytes.NewReader(desc.Manifest))
		if err != nil {
			return nil, fmt.Errorf("%s: parse index: %w", what, err)
		}
		child, err := pickPlatform(im, p.platform, target)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if desc, err = remote.Get(ep.repo.Digest(child.Digest.String()), ropts...); err != nil {
			return nil, classify(err, what, host)
		}
	}
	if !desc.MediaType.IsImage() {
		return nil, fmt.Errorf("%s: %w: manifest media type %s (Docker schema 1 and artifacts are not supported)", what, ErrUnsupported, safetext.Name(string(desc.MediaType)))
	}
	rawConfig, err := p.fetchConfig(ctx, ep, desc.Manifest)
	if err != nil {
		return nil, classify(err, what+": fetch config", host)
	}
	img, err := describe(displayRepo(ep.repo), desc.Manifest, rawConfig)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return img, nil
}

// fetchConfig reads the config blob a manifest names, refusing one larger
// than MaxConfigBytes before asking for it; describe verifies its digest.
// A config the endpoint's shared transport keeps is not read again.
func (p *registryImages) fetchConfig(ctx context.Context, ep *endpoint, rawManifest []byte) ([]byte, error) {
	m, err := v1.ParseManifest(bytes.NewReader(rawManifest))
	if err != nil {
		return nil, fmt.Errorf("parse manifest: %w", err)
	}
	c := bodyCap{what: "image config", limit: MaxConfigBytes}
	if m.Config.Size > c.limit {
		return nil, fmt.Errorf("%w (the manifest gives %d bytes)", c.err(), m.Config.Size)
	}
	if m.Config.Data != nil {
		return m.Config.Data, nil
	}
	if kept := ep.keptConfig(m.Config.Digest.String()); kept != nil {
		return kept, nil
	}
	rc, err := p.openDocumentBlob(withBodyCap(ctx, c.what, c.limit), ep, m.Config.Digest)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	// The digest check in describe catches a short or altered config; one
	// byte past the declared size is enough to tell it is wrong.
	b, err := io.ReadAll(io.LimitReader(rc, max(m.Config.Size, 0)+1))
	if err != nil {
		return nil, err
	}
	ep.keepConfig(b)
	return b, nil
}

// registrySource reads blobs from the endpoint that served the manifest,
// then from the endpoints after it.
type registrySource struct {
	p   *registryImages
	eps []*endpoint
}

var _ blobSource = (*registrySource)(nil)

func (s *registrySource) key() string { return "registry:" + s.eps[0].repo.Name() }

func (s *registrySource) openers(d v1.Hash) []blobOpener {
	out := make([]blobOpener, 0, len(s.eps))
	for _, ep := range s.eps {
		loc := &blobLocation{registry: blobURL(ep, d)}
		out = append(out, blobOpener{
			where:  displayRepo(ep.repo),
			host:   ep.repo.RegistryStr(),
			ranged: true,
			open: func(ctx context.Context, offset, end, size int64, whole bool) (io.ReadCloser, int64, error) {
				return s.p.openLayer(ctx, ep, loc, offset, end, size, whole)
			},
		})
	}
	return out
}

// blobLocation is where one blob's GETs at one endpoint go: its URL at
// the registry, or, once the registry redirected one (a presigned URL of
// an object store), the URL the redirect led to. The redirect is followed
// once per blob; the blob's other requests (chunks, resumes) go straight
// there. A reused URL answering as an expired signature does (400, 401,
// 403) is dropped, and that request asks the registry again, once.
type blobLocation struct {
	registry string
	// refresh is held while a request asks the registry again after an
	// expired URL: the other streams then take the URL it brings.
	refresh sync.Mutex

	mu  sync.Mutex
	url string // "" while no redirect was followed
}

// current returns the URL to ask, and whether it is a redirect's.
func (l *blobLocation) current() (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.url != "" {
		return l.url, true
	}
	return l.registry, false
}

// remember keeps the URL a request asked for u was answered from.
func (l *blobLocation) remember(u, final string) {
	if final == u || final == l.registry {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.url = final
}

// forget drops u, a redirect's URL that stopped working.
func (l *blobLocation) forget(u string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.url == u {
		l.url = ""
	}
}

// expiredStatus tells the answers of an object store to a presigned URL
// whose signature expired: S3 and Azure answer 403, GCS 400, some 401.
func expiredStatus(code int) bool {
	return code == http.StatusBadRequest || code == http.StatusUnauthorized || code == http.StatusForbidden
}

// openDocumentBlob GETs a blob that is a document (an image config),
// bound by a whole-request deadline (see guardTransport); the caller
// verifies what it reads. Layers go through openLayer.
func (p *registryImages) openDocumentBlob(ctx context.Context, ep *endpoint, d v1.Hash) (io.ReadCloser, error) {
	resp, err := p.getBlob(ctx, ep, d)
	if err != nil {
		return nil, err
	}
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp.Body, nil
}

// openLayer GETs bytes [offset, end) of a layer blob of size bytes at
// loc: the whole blob, without a Range header, when that is what is
// asked. Registries serve ranges on blobs (the distribution spec's blob
// GET). The answer is read here, the one place that decides it: a 206
// must name exactly the range asked (Content-Range, and Content-Length
// when given); a 200 is the whole blob (start 0) and a 416 is asked again
// for the whole blob, both when whole allows, else errNoRanges.
func (p *registryImages) openLayer(ctx context.Context, ep *endpoint, loc *blobLocation, offset, end, size int64, whole bool) (io.ReadCloser, int64, error) {
	rng := ""
	if offset > 0 || end < size {
		rng = fmt.Sprintf("bytes=%d-%d", offset, end-1)
	}
	resp, err := p.getLayer(ctx, ep, loc, rng)
	if err != nil {
		return nil, 0, err
	}
	if rng != "" && !whole && (resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusRequestedRangeNotSatisfiable) {
		resp.Body.Close()
		return nil, 0, errNoRanges
	}
	if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && rng != "" {
		// A registry refusing the range still serves the blob whole.
		resp.Body.Close()
		rng = ""
		if resp, err = p.getLayer(ctx, ep, loc, ""); err != nil {
			return nil, 0, err
		}
	}
	if err := transport.CheckError(resp, http.StatusOK, http.StatusPartialContent); err != nil {
		resp.Body.Close()
		return nil, 0, err
	}
	if resp.StatusCode == http.StatusOK || rng == "" {
		return resp.Body, 0, nil
	}
	var first, last, total int64
	cr := resp.Header.Get("Content-Range")
	if _, err := fmt.Sscanf(cr, "bytes %d-%d/%d", &first, &last, &total); err != nil || first != offset || last != end-1 || total != size {
		resp.Body.Close()
		return nil, 0, fmt.Errorf("asked for bytes %d-%d of %d, the registry answered with Content-Range %s",
			offset, end-1, size, safetext.Quote(cr, 80))
	}
	if resp.ContentLength >= 0 && resp.ContentLength != end-offset {
		resp.Body.Close()
		return nil, 0, fmt.Errorf("asked for bytes %d-%d of %d, the registry announced a body of %d bytes",
			offset, end-1, size, resp.ContentLength)
	}
	return resp.Body, offset, nil
}

// getLayer sends a layer GET to loc, and remembers where a redirect led.
// A redirect's URL answering as expired is asked again once: at the URL
// another request just brought, or at the registry.
func (p *registryImages) getLayer(ctx context.Context, ep *endpoint, loc *blobLocation, rng string) (*http.Response, error) {
	u, reused := loc.current()
	resp, err := p.get(ctx, ep, u, true, rng)
	if err != nil || !reused || !expiredStatus(resp.StatusCode) {
		return loc.took(u, resp), err
	}
	resp.Body.Close()
	loc.refresh.Lock()
	defer loc.refresh.Unlock()
	if cur, _ := loc.current(); cur != u {
		u = cur
	} else {
		loc.forget(u)
		u = loc.registry
	}
	resp, err = p.get(ctx, ep, u, true, rng)
	return loc.took(u, resp), err
}

// took remembers where the answer to a request for u came from, when it
// brings the blob; it returns resp.
func (l *blobLocation) took(u string, resp *http.Response) *http.Response {
	if resp != nil && (resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusPartialContent) {
		l.remember(u, resp.Request.URL.String())
	}
	return resp
}

// blobURL is the URL of blob d at ep.
func blobURL(ep *endpoint, d v1.Hash) string {
	u := url.URL{
		Scheme: ep.repo.Scheme(),
		Host:   ep.repo.RegistryStr(),
		Path:   fmt.Sprintf("/v2/%s/blobs/%s", ep.repo.RepositoryStr(), d),
	}
	return u.String()
}

// getBlob sends the GET of blob d, a document (see get).
func (p *registryImages) getBlob(ctx context.Context, ep *endpoint, d v1.Hash) (*http.Response, error) {
	return p.get(ctx, ep, blobURL(ep, d), false, "")
}

// get sends a GET of u through ep's transport, with a Range header when
// rng is set. A layer is a stream, bound by the minimum transfer rate
// alone; any other blob is a document.
func (p *registryImages) get(ctx context.Context, ep *endpoint, u string, layer bool, rng string) (*http.Response, error) {
	rt, err := ep.transport(ctx, p.newBase)
	if err != nil {
		return nil, err
	}
	if layer {
		ctx = withStream(ctx, u)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	client := &http.Client{Transport: rt, CheckRedirect: checkRedirect}
	return client.Do(req)
}

// checkRedirect bounds blob redirects and refuses any scheme but http(s).
// Where a redirect may lead is the network policy's to say (netpolicy.go:
// reach), on the address each connection reaches.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return fmt.Errorf("redirect to scheme %q refused", bound(req.URL.Scheme))
	}
	return nil
}
