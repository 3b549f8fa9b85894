package oci

import (
	"errors"
	"strings"
	"testing"
)

// FuzzValidateImageRef checks that ValidateImageRef never panics, fails
// only with ErrInvalidRef, that the canonical String of a parsed
// reference parses to the same reference: parse(format(parse(s))) ==
// parse(s), and that the docker:// transport changes nothing, as
// upstream strips it before the scheme: parse("docker://"+s) == parse(s).
func FuzzValidateImageRef(f *testing.F) {
	const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, s := range []string{
		"ubuntu", "docker.io/library/ubuntu:22.04", "docker://quay.io/org/app:1.0",
		"https://registry.example:5000/a/b@sha256:" + hex64, "http://registry.example:5000/a/b:tag",
		"localhost:5000/x_y-z.w", "oci-layout:/srv/img", "oci-layout:/srv/img:v1.2",
		"oci-layout:/srv/v1.0/img@sha256:" + hex64, "docker-archive:/srv/images/app.tar",
		"", "-x", "a//b", "http://", "oci-layout:relative", "oci-layout:/a/../b", "docker-archive:/a:b",
		"UPPER/case", "a:b:c", "a@sha256:short", "docker://http://x", "oci-layout:/a:b/c",
		"docker://http://harbor.internal:5000/ns/app:tag", "docker://https://registry.example/a/b:1",
		"docker://docker://library/nginx", "http://docker://library/nginx", "https://http://x/a", "docker://http://",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkTransport(t, s)
		pr, err := ValidateImageRef(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidRef) {
				t.Fatalf("ValidateImageRef(%q) error %v does not wrap ErrInvalidRef", s, err)
			}
			return
		}
		canon := pr.String()
		again, err := ValidateImageRef(canon)
		if err != nil {
			t.Fatalf("ValidateImageRef(%q) = %q, which does not parse: %v", s, canon, err)
		}
		if !sameRef(pr, again) {
			t.Fatalf("ValidateImageRef(%q) = %+v; its String %q parses as %+v", s, pr, canon, again)
		}
		if again.String() != canon {
			t.Fatalf("String round trip: %q then %q", canon, again.String())
		}
	})
}

// checkTransport checks that s and docker://s parse alike, for an s that
// is a registry reference without the transport already.
func checkTransport(t *testing.T, s string) {
	if strings.HasPrefix(s, "docker://") || strings.HasPrefix(s, ociLayoutPrefix) || strings.HasPrefix(s, dockerArchivePrefix) {
		return
	}
	bare, berr := ValidateImageRef(s)
	full, ferr := ValidateImageRef("docker://" + s)
	switch {
	case (berr == nil) != (ferr == nil):
		t.Fatalf("ValidateImageRef(%q) error %v, but with docker:// %v", s, berr, ferr)
	case berr == nil && !sameRef(bare, full):
		t.Fatalf("ValidateImageRef(%q) = %+v, but with docker:// %+v", s, bare, full)
	}
}

// sameRef compares parsed references by what a pull uses of them.
func sameRef(a, b ParsedRef) bool {
	if a.Kind != b.Kind || a.PlainHTTP != b.PlainHTTP || a.Path != b.Path || a.Tag != b.Tag || a.Digest != b.Digest {
		return false
	}
	if (a.Reference == nil) != (b.Reference == nil) {
		return false
	}
	if a.Reference == nil {
		return true
	}
	return a.Reference.Name() == b.Reference.Name() && a.Reference.Context().Scheme() == b.Reference.Context().Scheme() &&
		a.sourceName() == b.sourceName()
}
