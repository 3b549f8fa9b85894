package oci

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestValidateImageRef(t *testing.T) {
	const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	valid := []struct {
		ref        string
		kind       RefKind
		plainHTTP  bool
		name       string // ParsedRef.Reference.Name() for registry refs
		source     string // sourceName(): the part of Image.Digest before '@'
		path       string
		tag, digst string
	}{
		{ref: "ubuntu", kind: KindRegistry, name: "index.docker.io/library/ubuntu:latest", source: "docker.io/library/ubuntu"},
		{ref: "docker.io/library/ubuntu:22.04", kind: KindRegistry, name: "index.docker.io/library/ubuntu:22.04", source: "docker.io/library/ubuntu"},
		{ref: "docker://quay.io/org/app:1.0", kind: KindRegistry, name: "quay.io/org/app:1.0", source: "quay.io/org/app"},
		{ref: "https://registry.example:5000/a/b@sha256:" + hex64, kind: KindRegistry, name: "registry.example:5000/a/b@sha256:" + hex64, source: "registry.example:5000/a/b"},
		{ref: "http://registry.example:5000/a/b:tag", kind: KindRegistry, plainHTTP: true, name: "registry.example:5000/a/b:tag", source: "registry.example:5000/a/b"},
		{ref: "localhost:5000/x_y-z.w", kind: KindRegistry, name: "localhost:5000/x_y-z.w:latest", source: "localhost:5000/x_y-z.w"},
		// Upstream strips the transport, then the scheme.
		{ref: "docker://http://harbor.internal:5000/ns/app:tag", kind: KindRegistry, plainHTTP: true, name: "harbor.internal:5000/ns/app:tag", source: "harbor.internal:5000/ns/app"},
		{ref: "docker://https://registry.example/a/b:1", kind: KindRegistry, name: "registry.example/a/b:1", source: "registry.example/a/b"},
		{ref: "oci-layout:/srv/img", kind: KindOCILayout, source: "oci-layout:/srv/img", path: "/srv/img"},
		{ref: "oci-layout:/srv/img:v1.2", kind: KindOCILayout, source: "oci-layout:/srv/img", path: "/srv/img", tag: "v1.2"},
		{ref: "oci-layout:/srv/v1.0/img@sha256:" + hex64, kind: KindOCILayout, source: "oci-layout:/srv/v1.0/img", path: "/srv/v1.0/img", digst: "sha256:" + hex64},
		{ref: "docker-archive:/srv/images/app.tar", kind: KindDockerArchive, source: "docker-archive:/srv/images/app.tar", path: "/srv/images/app.tar"},
	}
	for _, tc := range valid {
		t.Run("Valid", func(t *testing.T) {
			pr, err := ValidateImageRef(tc.ref)
			if err != nil {
				t.Fatalf("ValidateImageRef(%q) error: %v", tc.ref, err)
			}
			if pr.Kind != tc.kind || pr.PlainHTTP != tc.plainHTTP || pr.Path != tc.path || pr.Tag != tc.tag || pr.Digest != tc.digst {
				t.Errorf("ValidateImageRef(%q) = %+v", tc.ref, pr)
			}
			if tc.kind == KindRegistry {
				if got := pr.Reference.Name(); got != tc.name {
					t.Errorf("ValidateImageRef(%q).Reference.Name() = %q, want %q", tc.ref, got, tc.name)
				}
				wantScheme := "https"
				if tc.plainHTTP || strings.HasPrefix(tc.name, "localhost:") {
					wantScheme = "http"
				}
				if got := pr.Reference.Context().Scheme(); got != wantScheme {
					t.Errorf("ValidateImageRef(%q) scheme = %q, want %q", tc.ref, got, wantScheme)
				}
			}
			if got := pr.sourceName(); got != tc.source {
				t.Errorf("ValidateImageRef(%q).sourceName() = %q, want %q", tc.ref, got, tc.source)
			}
			again, err := ValidateImageRef(pr.String())
			if err != nil {
				t.Fatalf("ValidateImageRef(String() = %q) error: %v", pr.String(), err)
			}
			if again.String() != pr.String() {
				t.Errorf("String() round trip: %q then %q", pr.String(), again.String())
			}
		})
	}

	invalid := []string{
		"",
		"-foo",
		"docker://-foo",
		"http://--help",
		"a;b",
		"a b",
		"ubuntu:latest;rm -rf /",
		"$(id)",
		"`id`",
		"a|b",
		"a&b",
		"ubuntu\nlatest",
		"ubuntu'",
		"Ubuntu/UPPER",
		"ubuntu@sha256:1234",
		"a//b",
		"/",
		"/a/b",
		"a/",
		"a/:tag",
		"docker://",
		"http://",
		"docker://http://",
		"docker://https://",
		"docker://docker://library/nginx",
		"http://docker://library/nginx",
		"https://http://example.com/a",
		"http://http://example.com/a",
		"docker://http://-x",
		"docker://http://a//b",
		"oci-layout:relative/dir",
		"oci-layout:/srv/../etc",
		"oci-layout:/srv/img/",
		"oci-layout:/srv/img:bad$tag",
		"oci-layout:/srv/img:-tag",
		"oci-layout:/srv/img@sha256:zz",
		"oci-layout:",
		"docker-archive:",
		"docker-archive:rel.tar",
		"docker-archive:/srv/a.tar:tag",
		"docker-archive:/srv/a.tar@sha256:" + hex64,
		"docker-archive:/srv/a b.tar",
	}
	for _, ref := range invalid {
		t.Run("Invalid", func(t *testing.T) {
			pr, err := ValidateImageRef(ref)
			if err == nil {
				t.Fatalf("ValidateImageRef(%q) = %+v, want an error", ref, pr)
			}
			if !errors.Is(err, ErrInvalidRef) {
				t.Errorf("ValidateImageRef(%q) error %v is not ErrInvalidRef", ref, err)
			}
		})
	}
}

// TestValidateImageRefAsUpstream: the references upstream's own test
// (pkg/image TestValidateImageRef) accepts are accepted, and those it
// refuses are refused.
func TestValidateImageRefAsUpstream(t *testing.T) {
	valid := []string{
		"docker://registry.example.com/image:latest",
		"http://harbor.internal:5000/ns/app:tag",
		"https://registry.example.com/image:latest",
		"docker://http://harbor.internal:5000/ns/app:tag",
		"registry.example.com:5000/ns/app:1.2.3",
		"nginx",
		"library/nginx",
		"library/nginx@sha256:" + strings.Repeat("a", 64),
		"reg.io/my_app.name/sub-component:tag_1.0",
	}
	for _, ref := range valid {
		if _, err := ValidateImageRef(ref); err != nil {
			t.Errorf("ValidateImageRef(%q) = %v; upstream accepts it", ref, err)
		}
	}
	invalid := []string{
		"", "docker://", "http://", "-rm -rf", "--authfile=/etc/shadow",
		"registry.example.com/image --authfile /etc/shadow", "registry.example.com/image\t--flag",
		"registry.example.com/image\n--flag", "image;rm -rf /", "image$(whoami)", "image`whoami`",
		"library/nginx:", "library/nginx@sha256:not-a-digest", "docker://docker://library/nginx",
	}
	for _, ref := range invalid {
		if pr, err := ValidateImageRef(ref); err == nil {
			t.Errorf("ValidateImageRef(%q) = %+v; upstream refuses it", ref, pr)
		}
	}
}

// TestPlainHTTPReferenceKeepsThePolicy: a reference that asks for plain
// HTTP (http://, after docker:// too) is pulled over plain HTTP, but is
// not a registry the operator listed: the host's own addresses stay
// refused until registry.insecure (or a mirror, or allow_networks) names
// it.
func TestPlainHTTPReferenceKeepsThePolicy(t *testing.T) {
	img := testImage(t, 1, 512)
	want := compressedLayers(t, img)
	reg := newTestRegistry(t, nil) // plain HTTP, on 127.0.0.1
	push(t, reg.host+"/ns/app:tag", img)
	refs := []string{"docker://http://" + reg.host + "/ns/app:tag", "http://" + reg.host + "/ns/app:tag"}
	ctx := context.Background()

	strict := newStrictPuller(t, Options{})
	for _, ref := range refs {
		_, err := strict.Resolve(ctx, Source{Ref: ref})
		if !errors.Is(err, ErrNetworkDenied) || !strings.Contains(err.Error(), "is loopback, denied by default") {
			t.Errorf("Resolve(%q) with loopback denied: %v; want the loopback refusal", ref, err)
		}
	}
	listed := newStrictPuller(t, Options{Insecure: []string{reg.host}})
	allowed := newTestPuller(t, Options{})
	for _, p := range []*Puller{listed, allowed} {
		for _, ref := range refs {
			fetchAll(t, p, Source{Ref: ref}, want)
		}
	}
}
