package rootfs_test

import (
	"context"
	"errors"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// caLoader hands out ca, or fails with err, and counts its loads.
type caLoader struct {
	ca    *rootfs.CA
	err   error
	loads int
}

func (l *caLoader) LoadCA(context.Context) (*rootfs.CA, error) {
	l.loads++
	return l.ca, l.err
}

// naming records what Plan names the build from.
type naming struct {
	digest, caFingerprint string
	err                   error
}

func (n *naming) name(digest, caFingerprint string) (string, string, error) {
	n.digest, n.caFingerprint = digest, caFingerprint
	return "fp-of-" + digest + "-" + caFingerprint, "id-" + caFingerprint, n.err
}

func TestPlanNamesTheBuildAfterImageAndCA(t *testing.T) {
	img := &rootfs.Image{Digest: "sha256:abc"}
	ca := &rootfs.CA{Fingerprint: "cafp"}
	for _, tc := range []struct {
		withCA    bool
		wantCA    *rootfs.CA
		wantLoads int
		wantFP    string
	}{
		{withCA: true, wantCA: ca, wantLoads: 1, wantFP: "cafp"},
		// Without the CA the loader is never asked: a node without the CA
		// file still builds such templates.
		{withCA: false, wantCA: nil, wantLoads: 0, wantFP: ""},
	} {
		loader, n := &caLoader{ca: ca}, &naming{}
		spec, err := rootfs.Plan(context.Background(), loader, img, tc.withCA, n.name)
		if err != nil {
			t.Fatalf("withCA %v: Plan: %v", tc.withCA, err)
		}
		if loader.loads != tc.wantLoads || n.digest != img.Digest || n.caFingerprint != tc.wantFP {
			t.Errorf("withCA %v: %d loads, named from (%q, %q); want %d loads, (%q, %q)",
				tc.withCA, loader.loads, n.digest, n.caFingerprint, tc.wantLoads, img.Digest, tc.wantFP)
		}
		want := rootfs.Spec{Image: img, CA: tc.wantCA, Fingerprint: "fp-of-sha256:abc-" + tc.wantFP, ArtifactID: "id-" + tc.wantFP}
		if spec.Image != want.Image || spec.CA != want.CA || spec.Fingerprint != want.Fingerprint || spec.ArtifactID != want.ArtifactID {
			t.Errorf("withCA %v: spec %+v, want %+v", tc.withCA, spec, want)
		}
	}
}

func TestPlanErrors(t *testing.T) {
	img := &rootfs.Image{Digest: "sha256:abc"}
	missing := errors.New("load CA: open /etc/cube/ca/cube-root-ca.crt: no such file or directory")
	_, err := rootfs.Plan(context.Background(), &caLoader{err: missing}, img, true, (&naming{}).name)
	var caErr *rootfs.CAError
	if !errors.As(err, &caErr) || caErr.Err != missing || !errors.Is(err, missing) {
		t.Fatalf("Plan with a CA that does not load = %v, want a *CAError wrapping %v", err, missing)
	}
	// The message a failed job reports.
	if got, want := err.Error(), "load cube egress CA: "+missing.Error(); got != want {
		t.Errorf("CA error = %q, want %q", got, want)
	}

	unnamed := errors.New("encode fingerprint payload")
	_, err = rootfs.Plan(context.Background(), &caLoader{}, img, false, (&naming{err: unnamed}).name)
	if !errors.Is(err, unnamed) || errors.As(err, &caErr) {
		t.Errorf("Plan with a failing naming = %v, want %v and no *CAError", err, unnamed)
	}
}
