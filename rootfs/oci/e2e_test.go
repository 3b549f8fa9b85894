package oci

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cubesandbox/cubetemplatecenter/test/registry"
)

// TestDistributionRegistry pushes to Debian's docker-registry (distribution
// 2.8, htpasswd auth) and fetches the image back through the cache.
func TestDistributionRegistry(t *testing.T) {
	const user, pass = "builder", "Reg-Pa55-e2e"
	reg, err := registry.Start(context.Background(), registry.Options{Dir: t.TempDir(), Username: user, Password: pass})
	if err != nil {
		t.Fatalf("start registry: %v", err)
	}
	t.Cleanup(reg.Stop)
	img := testImage(t, 3, 64<<10)
	push(t, reg.Ref("team/app:v1"), img, remote.WithAuth(reg.Auth()))
	want := compressedLayers(t, img)

	p := newTestPuller(t, Options{})
	got := fetchAll(t, p, Source{Ref: reg.Ref("team/app:v1"), Username: user, Password: pass}, want)
	checkImage(t, got, img, reg.Host+"/team/app")
	byDigest := fetchAll(t, p, Source{Ref: reg.Ref("team/app@" + got.ManifestDigest.String()), Username: user, Password: pass}, want)
	if byDigest.Digest != got.Digest {
		t.Errorf("digest ref resolved to %q, tag to %q", byDigest.Digest, got.Digest)
	}

	_, err = p.Resolve(context.Background(), Source{Ref: reg.Ref("team/app:v1"), Username: user, Password: "wrong"})
	if !errors.Is(err, ErrUnauthorized) {
		t.Errorf("Resolve with a wrong password: error = %v, want ErrUnauthorized", err)
	}
	_, err = p.Resolve(context.Background(), Source{Ref: reg.Ref("team/missing:v1"), Username: user, Password: pass})
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("Resolve of a missing image: error = %v, want ErrNotFound", err)
	}
}

// TestDistributionRegistryChunked fetches a layer from Debian's
// docker-registry through a link capping each connection: the registry's
// own Range support serves the chunks of several connections, and the
// blob is right.
func TestDistributionRegistryChunked(t *testing.T) {
	reg, err := registry.Start(context.Background(), registry.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("start registry: %v", err)
	}
	t.Cleanup(reg.Stop)
	img := testImage(t, 1, 3<<20)
	push(t, reg.Ref("team/big:v1"), img)
	target, err := url.Parse("http://" + reg.Host)
	if err != nil {
		t.Fatal(err)
	}
	link := newLinkModel(8<<20, 0, 0)
	front := httptest.NewServer(link.wrap(httputil.NewSingleHostReverseProxy(target)))
	t.Cleanup(front.Close)
	host := strings.TrimPrefix(front.URL, "http://")

	p := newChunkingPuller(t, Options{})
	fetchAll(t, p, Source{Ref: host + "/team/big:v1"}, compressedLayers(t, img))
	d := layerDigests(t, img)[0]
	ranged := 0
	for _, q := range link.requests(d) {
		if q.rng != "" {
			ranged++
		}
	}
	t.Logf("%d requests, %d ranged, on %d connections", len(link.requests(d)), ranged, link.connections(d))
	if ranged == 0 || link.connections(d) < 2 {
		t.Errorf("%d ranged requests on %d connections, want chunks over several", ranged, link.connections(d))
	}
}
