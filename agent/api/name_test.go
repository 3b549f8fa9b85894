package api

import "testing"

// TestBuildName: a build is named by the fingerprint of its template, the
// image's digest, the CA's fingerprint and its envd, and the artifact ID
// derived from it, whichever of the agent and the build command names it.
func TestBuildName(t *testing.T) {
	b := &Build{Template: TemplateRequest{SourceImageRef: "registry.test/app:1", WritableLayerSize: "20Gi", InstanceType: "cubebox"},
		EnvdSHA: "envdsha"}
	fp, id, err := b.Name("registry.test/app@sha256:abc", "cafp")
	if err != nil {
		t.Fatal(err)
	}
	want := fingerprint(t, &b.Template, "registry.test/app@sha256:abc", "cafp", "envdsha")
	if fp != want || id != ArtifactID(want) {
		t.Errorf("Name = (%s, %s), want (%s, %s)", fp, id, want, ArtifactID(want))
	}
	if other, _, _ := b.Name("registry.test/app@sha256:abc", ""); other == fp {
		t.Error("the CA's fingerprint does not change the build's name")
	}
}
