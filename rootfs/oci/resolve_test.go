package oci

import (
	"context"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// checkImage compares a resolved Image with the image that was pushed.
func checkImage(t *testing.T, got *Image, want v1.Image, repo string) {
	t.Helper()
	d := mustDigest(t, want)
	if wantDigest := repo + "@" + d.String(); got.Digest != wantDigest {
		t.Errorf("Digest = %q, want %q", got.Digest, wantDigest)
	}
	if got.ManifestDigest != d {
		t.Errorf("ManifestDigest = %s, want %s", got.ManifestDigest, d)
	}
	cf, err := want.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	wantCfg := ImageConfig{
		Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd, Env: cf.Config.Env,
		WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
	}
	if !reflect.DeepEqual(got.Config, wantCfg) {
		t.Errorf("Config = %+v, want %+v", got.Config, wantCfg)
	}
	if !got.Created.Equal(cf.Created.Time) {
		t.Errorf("Created = %v, want %v", got.Created, cf.Created.Time)
	}
	m, err := want.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Layers) != len(m.Layers) {
		t.Fatalf("%d layers, want %d", len(got.Layers), len(m.Layers))
	}
	var sum int64
	for i, l := range m.Layers {
		if got.Layers[i] != (Layer{Digest: l.Digest, Size: l.Size, MediaType: l.MediaType}) {
			t.Errorf("Layers[%d] = %+v, want %+v", i, got.Layers[i], l)
		}
		sum += l.Size
	}
	if got.CompressedSize != sum {
		t.Errorf("CompressedSize = %d, want %d", got.CompressedSize, sum)
	}
}

func TestResolveTagAndDigest(t *testing.T) {
	reg := newTestRegistry(t, nil)
	img := testImage(t, 3, 2048)
	push(t, reg.host+"/team/app:v1", img)
	p := newTestPuller(t, Options{})
	ctx := context.Background()

	byTag, err := p.Resolve(ctx, Source{Ref: reg.host + "/team/app:v1"})
	if err != nil {
		t.Fatalf("Resolve by tag: %v", err)
	}
	checkImage(t, byTag, img, reg.host+"/team/app")
	if byTag.Config.WorkingDir != "/srv" || byTag.Config.User != "1000:1000" || byTag.Config.Entrypoint[0] != "/bin/entry" {
		t.Errorf("Config = %+v, want the fields testImage sets", byTag.Config)
	}

	byDigest, err := p.Resolve(ctx, Source{Ref: "docker://" + reg.host + "/team/app@" + mustDigest(t, img).String()})
	if err != nil {
		t.Fatalf("Resolve by digest: %v", err)
	}
	checkImage(t, byDigest, img, reg.host+"/team/app")

	if n := reg.layerGets(t, img); n != 0 {
		t.Errorf("Resolve downloaded %d layer blobs, want 0", n)
	}
}

func TestResolveRejectsBadRef(t *testing.T) {
	p := newTestPuller(t, Options{})
	_, err := p.Resolve(context.Background(), Source{Ref: "registry.example/app;rm -rf /"})
	if !errors.Is(err, ErrInvalidRef) {
		t.Fatalf("Resolve(bad ref) error = %v, want ErrInvalidRef", err)
	}
}

func TestResolveMultiArch(t *testing.T) {
	reg := newTestRegistry(t, nil)
	amd := testImage(t, 1, 512)
	arm := testImage(t, 1, 512)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
	)
	ref, err := name.ParseReference(reg.host + "/multi:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatalf("push index: %v", err)
	}
	idxDigest, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		platform v1.Platform
		want     v1.Image
	}{
		{v1.Platform{OS: "linux", Architecture: "amd64"}, amd},
		{v1.Platform{OS: "linux", Architecture: "arm64"}, arm},
		{v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}, arm},
	} {
		t.Run(tc.platform.Architecture+tc.platform.Variant, func(t *testing.T) {
			p := newTestPuller(t, Options{Platform: tc.platform})
			for _, r := range []string{reg.host + "/multi:v1", reg.host + "/multi@" + idxDigest.String()} {
				img, err := p.Resolve(context.Background(), Source{Ref: r})
				if err != nil {
					t.Fatalf("Resolve(%s): %v", r, err)
				}
				checkImage(t, img, tc.want, reg.host+"/multi")
			}
		})
	}

	t.Run("NoMatch", func(t *testing.T) {
		for _, pl := range []v1.Platform{{OS: "linux", Architecture: "riscv64"}, {OS: "linux", Architecture: "arm64", Variant: "v9"}} {
			p := newTestPuller(t, Options{Platform: pl})
			_, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/multi:v1"})
			if !errors.Is(err, ErrNoPlatform) {
				t.Fatalf("Resolve for %s error = %v, want ErrNoPlatform", pl, err)
			}
			for _, s := range []string{pl.String(), `available: "linux/amd64", "linux/arm64/v8"`} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		}
	})

	t.Run("DefaultPlatformIsLinuxGOARCH", func(t *testing.T) {
		p := newTestPuller(t, Options{})
		if p.platform.OS != "linux" || p.platform.Architecture == "" {
			t.Fatalf("default platform = %+v", p.platform)
		}
	})
}

// basicAuth wraps a registry handler with an HTTP basic auth check.
func basicAuth(user, pass string) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
}

func TestBasicAuth(t *testing.T) {
	const user, pass = "alice", "s3cr3t-Pa55w0rd"
	reg := newTestRegistry(t, basicAuth(user, pass))
	img := testImage(t, 2, 1024)
	push(t, reg.host+"/private/app:v1", img, remote.WithAuth(&authn.Basic{Username: user, Password: pass}))
	ref := reg.host + "/private/app:v1"

	t.Run("Good", func(t *testing.T) {
		p := newTestPuller(t, Options{})
		got := fetchAll(t, p, Source{Ref: ref, Username: user, Password: pass}, compressedLayers(t, img))
		checkImage(t, got, img, reg.host+"/private/app")
	})
	for _, tc := range []struct{ name, user, pass string }{
		{"BadPassword", user, "wrong-Pa55-XYZ"},
		{"Anonymous", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPuller(t, Options{})
			_, err := p.Resolve(context.Background(), Source{Ref: ref, Username: tc.user, Password: tc.pass})
			if !errors.Is(err, ErrUnauthorized) {
				t.Fatalf("Resolve error = %v, want ErrUnauthorized", err)
			}
			want := "authentication to " + reg.host + " failed (check registry_username/registry_password)"
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not contain %q", err, want)
			}
			if tc.pass != "" {
				basic := base64.StdEncoding.EncodeToString([]byte(tc.user + ":" + tc.pass))
				if strings.Contains(err.Error(), tc.pass) || strings.Contains(err.Error(), basic) {
					t.Errorf("error %q leaks the password", err)
				}
			}
		})
	}
}

func TestKeychainFromDockerConfig(t *testing.T) {
	const user, pass = "bob", "k3ychain-pass"
	reg := newTestRegistry(t, basicAuth(user, pass))
	img := testImage(t, 1, 1024)
	push(t, reg.host+"/kc/app:v1", img, remote.WithAuth(&authn.Basic{Username: user, Password: pass}))

	home, cfgDir := t.TempDir(), t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("DOCKER_CONFIG", cfgDir)
	t.Setenv("REGISTRY_AUTH_FILE", "")
	t.Setenv("XDG_RUNTIME_DIR", "")
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	cfg := `{"auths":{"` + reg.host + `":{"auth":"` + auth + `"}}}`
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := newTestPuller(t, Options{Keychain: authn.DefaultKeychain})
	got := fetchAll(t, p, Source{Ref: reg.host + "/kc/app:v1"}, compressedLayers(t, img))
	checkImage(t, got, img, reg.host+"/kc/app")

	// Explicit credentials win over the keychain.
	_, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/kc/app:v1", Username: user, Password: "not-it"})
	if !errors.Is(err, ErrUnauthorized) {
		t.Errorf("Resolve with explicit wrong password: error = %v, want ErrUnauthorized", err)
	}
}

// fakeHostTransport sends every connection to addr, so a registry on
// loopback can be named by a host that go-containerregistry would otherwise
// reach over https.
func fakeHostTransport(addr string) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}
}

func TestPlainHTTP(t *testing.T) {
	reg := newTestRegistry(t, nil)
	img := testImage(t, 2, 1024)
	push(t, reg.host+"/plain/app:v1", img)
	_, port, err := net.SplitHostPort(reg.host)
	if err != nil {
		t.Fatal(err)
	}
	host := "registry.test:" + port
	tr := fakeHostTransport(reg.host)
	want := compressedLayers(t, img)

	t.Run("HTTPSByDefault", func(t *testing.T) {
		p := newTestPuller(t, Options{Transport: tr})
		if _, err := p.Resolve(context.Background(), Source{Ref: host + "/plain/app:v1"}); err == nil {
			t.Fatal("Resolve of a plain-HTTP registry without http:// or Insecure succeeded")
		}
	})
	t.Run("HTTPPrefix", func(t *testing.T) {
		p := newTestPuller(t, Options{Transport: tr})
		got := fetchAll(t, p, Source{Ref: "http://" + host + "/plain/app:v1"}, want)
		checkImage(t, got, img, host+"/plain/app")
	})
	t.Run("InsecureOption", func(t *testing.T) {
		p := newTestPuller(t, Options{Transport: tr, Insecure: []string{host}})
		got := fetchAll(t, p, Source{Ref: host + "/plain/app:v1"}, want)
		checkImage(t, got, img, host+"/plain/app")
	})
}

func TestMirrors(t *testing.T) {
	img := testImage(t, 2, 1024)
	want := compressedLayers(t, img)
	origin := newTestRegistry(t, nil)
	push(t, origin.host+"/lib/app:v1", img)
	empty := newTestRegistry(t, nil) // answers 404 for everything
	full := newTestRegistry(t, nil)
	push(t, full.host+"/cache/lib/app:v1", img) // a mirror with a path prefix
	// A mirror that has the manifest but fails every layer download.
	noBlobs := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for _, d := range layerDigests(t, img) {
				if strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
					http.Error(w, "gone", http.StatusNotFound)
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	})
	push(t, noBlobs.host+"/lib/app:v1", img)
	dead := "127.0.0.1:1" // nothing listens on port 1
	ref := origin.host + "/lib/app:v1"

	for _, tc := range []struct {
		name       string
		mirrors    []string
		servedBy   *testRegistry
		originUsed bool
	}{
		{"MissingFallsThrough", []string{empty.host}, origin, true},
		{"UnreachableFallsThrough", []string{dead}, origin, true},
		{"SecondMirrorServes", []string{empty.host, full.host + "/cache"}, full, false},
		{"BlobFailureFallsThrough", []string{noBlobs.host}, origin, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []*testRegistry{origin, empty, full, noBlobs} {
				r.reset()
			}
			p := newTestPuller(t, Options{Mirrors: map[string][]string{origin.host: tc.mirrors}})
			got := fetchAll(t, p, Source{Ref: ref}, want)
			checkImage(t, got, img, origin.host+"/lib/app")
			if n := tc.servedBy.layerGets(t, img); n != len(want) {
				t.Errorf("%d layer GETs at the serving registry, want %d", n, len(want))
			}
			if n := origin.requestCount(); (n > 0) != tc.originUsed {
				t.Errorf("origin got %d requests; want used=%v", n, tc.originUsed)
			}
		})
	}
}

func TestImageNotFound(t *testing.T) {
	reg := newTestRegistry(t, nil)
	p := newTestPuller(t, Options{})
	ref := reg.host + "/nope/app:v1"
	_, err := p.Resolve(context.Background(), Source{Ref: ref})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Resolve(%s) error = %v, want ErrNotFound", ref, err)
	}
	if !strings.Contains(err.Error(), "resolve "+ref) || !strings.Contains(err.Error(), "404") {
		t.Errorf("error %q should name the reference and the status", err)
	}
}

func TestResolveRejectsArtifact(t *testing.T) {
	reg := newTestRegistry(t, nil)
	img := mutate.ConfigMediaType(testImage(t, 1, 256), "application/vnd.cncf.helm.config.v1+json")
	push(t, reg.host+"/chart:v1", img)
	p := newTestPuller(t, Options{})
	_, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/chart:v1"})
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Resolve(artifact) error = %v, want ErrUnsupported", err)
	}
}

func TestNewOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"NoCacheDir", Options{}},
		{"NegativeJobs", Options{CacheDir: t.TempDir(), Jobs: -1}},
		{"NegativeQuota", Options{CacheDir: t.TempDir(), CacheQuotaBytes: -1}},
		{"BadInsecureHost", Options{CacheDir: t.TempDir(), Insecure: []string{"bad host"}}},
		{"BadMirror", Options{CacheDir: t.TempDir(), Mirrors: map[string][]string{"docker.io": {"bad mirror"}}}},
		{"RelativeLocalRoot", Options{CacheDir: t.TempDir(), LocalRoots: []string{"images"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if p, err := New(tc.opts); err == nil {
				p.Close()
				t.Fatalf("New(%+v) succeeded, want an error", tc.opts)
			}
		})
	}

	p := newTestPuller(t, Options{Jobs: 100})
	if p.jobs != MaxJobs {
		t.Errorf("Jobs 100 became %d, want %d", p.jobs, MaxJobs)
	}
	if p := newTestPuller(t, Options{}); p.jobs != DefaultJobs || p.cache.Quota() != DefaultCacheQuotaBytes {
		t.Errorf("defaults: jobs %d, quota %d; want %d, %d", p.jobs, p.cache.Quota(), DefaultJobs, DefaultCacheQuotaBytes)
	}
}

func TestMirrorEndpoints(t *testing.T) {
	p := newTestPuller(t, Options{
		Mirrors: map[string][]string{
			"docker.io":            {"mirror.example:5000", "http://proxy.internal/hub/"},
			"registry.example:443": {"https://cache.example"},
		},
		Insecure: []string{"mirror.example:5000"},
	})
	for _, tc := range []struct {
		ref  string
		want []string // endpoint repositories with their scheme
	}{
		{"ubuntu:22.04", []string{
			"http://mirror.example:5000/library/ubuntu",
			"http://proxy.internal/hub/library/ubuntu",
			"https://index.docker.io/library/ubuntu",
		}},
		{"registry.example:443/team/app:v1", []string{
			"https://cache.example/team/app",
			"https://registry.example:443/team/app",
		}},
		{"http://other.example/app:v1", []string{"http://other.example/app"}},
	} {
		pr, err := ValidateImageRef(tc.ref)
		if err != nil {
			t.Fatal(err)
		}
		eps, err := p.sources[KindRegistry].(*registryImages).endpoints(context.Background(), pr, Source{})
		if err != nil {
			t.Fatalf("endpoints(%s): %v", tc.ref, err)
		}
		var got []string
		for _, ep := range eps {
			got = append(got, ep.repo.Scheme()+"://"+ep.repo.Name())
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("endpoints(%s) = %v, want %v", tc.ref, got, tc.want)
		}
	}
}

func TestSourceCredentialsStayWithOrigin(t *testing.T) {
	p := newTestPuller(t, Options{Mirrors: map[string][]string{"registry.example": {"mirror.example"}}})
	pr, err := ValidateImageRef("registry.example/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	eps, err := p.sources[KindRegistry].(*registryImages).endpoints(context.Background(), pr, Source{Username: "u", Password: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 {
		t.Fatalf("%d endpoints, want 2", len(eps))
	}
	if eps[0].auth != authn.Anonymous {
		t.Errorf("mirror auth = %v, want anonymous (the keychain has nothing)", eps[0].auth)
	}
	if b, ok := eps[1].auth.(*authn.Basic); !ok || b.Username != "u" || b.Password != "p" {
		t.Errorf("origin auth = %#v, want the Source's basic credentials", eps[1].auth)
	}
}
