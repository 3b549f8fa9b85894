package images

import (
	"crypto/subtle"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is go-containerregistry's in-memory registry served over plain
// HTTP on a loopback httptest server, counting the blob downloads it
// serves.
type Registry struct {
	// Host is "127.0.0.1:<port>": references are Host + "/repo:tag", and
	// pullers must list Host as insecure (plain HTTP).
	Host string

	srv *httptest.Server

	mu       sync.Mutex
	blobGETs map[string]int // by "sha256:<hex>"
}

// StartRegistry starts a registry that lives until the test ends. wrap,
// when not nil, wraps the registry handler (inside the request counter):
// use it to require credentials (BasicAuth) or to inject failures.
func StartRegistry(tb testing.TB, wrap func(http.Handler) http.Handler) *Registry {
	tb.Helper()
	r := &Registry{blobGETs: make(map[string]int)}
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if d, ok := BlobDigest(req); ok && req.Method == http.MethodGet {
			r.mu.Lock()
			r.blobGETs[d]++
			r.mu.Unlock()
		}
		h.ServeHTTP(w, req)
	}))
	tb.Cleanup(r.srv.Close)
	r.Host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// BlobDigest returns the digest of a blob request ("sha256:<hex>").
func BlobDigest(req *http.Request) (string, bool) {
	i := strings.Index(req.URL.Path, "/blobs/")
	if i < 0 || strings.Contains(req.URL.Path, "/blobs/uploads") {
		return "", false
	}
	return req.URL.Path[i+len("/blobs/"):], true
}

// Ref is the reference of repoAndTag ("team/app:v1") in this registry.
func (r *Registry) Ref(repoAndTag string) string { return r.Host + "/" + repoAndTag }

// Push writes img as repoAndTag and returns its reference; opts are passed
// to remote.Write (remote.WithAuth for a registry behind BasicAuth).
func (r *Registry) Push(tb testing.TB, repoAndTag string, img v1.Image, opts ...remote.Option) string {
	tb.Helper()
	ref := r.Ref(repoAndTag)
	if err := remote.Write(parseRef(tb, ref), img, opts...); err != nil {
		tb.Fatalf("images: push %s: %v", ref, err)
	}
	return ref
}

// PushIndex writes an image index and its images as repoAndTag and returns
// its reference.
func (r *Registry) PushIndex(tb testing.TB, repoAndTag string, idx v1.ImageIndex, opts ...remote.Option) string {
	tb.Helper()
	ref := r.Ref(repoAndTag)
	if err := remote.WriteIndex(parseRef(tb, ref), idx, opts...); err != nil {
		tb.Fatalf("images: push %s: %v", ref, err)
	}
	return ref
}

func parseRef(tb testing.TB, ref string) name.Reference {
	tb.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		tb.Fatalf("images: parse %s: %v", ref, err)
	}
	return r
}

// BlobGETs returns how often the blob with digest d was downloaded.
func (r *Registry) BlobGETs(d v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGETs[d.String()]
}

// BasicAuth returns a wrapper that answers 401 with a Basic challenge
// unless a request carries exactly user:password.
func BasicAuth(user, password string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			u, p, ok := req.BasicAuth()
			if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 ||
				subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
				w.Header().Set("WWW-Authenticate", `Basic realm="images"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
			next.ServeHTTP(w, req)
		})
	}
}
