package rootfs

import "context"

// Every build follows one recipe, the agent's jobs and the build command
// alike: Resolve the image, Plan the build, Build it. Plan is the one
// place that decides whether the egress CA is loaded and what goes into
// the build's names, so that a request gets the same fingerprint and
// artifact ID whichever of them builds it.

// Naming names a build from what only resolving its image and loading the
// egress CA tell: the image's digest and the CA's fingerprint ("" without
// the CA). It returns the template spec's fingerprint and the artifact ID
// derived from it; the agent's wire contract defines both
// (api.Build.Name), and rootfs does not import it.
type Naming func(imageDigest, caFingerprint string) (fingerprint, artifactID string, err error)

// CALoader loads the egress CA a build bakes; Builder is one.
type CALoader interface {
	LoadCA(ctx context.Context) (*CA, error)
}

// CAError is a build's egress CA that could not be loaded.
type CAError struct{ Err error }

func (e *CAError) Error() string { return "load cube egress CA: " + e.Err.Error() }

func (e *CAError) Unwrap() error { return e.Err }

// Plan loads the egress CA from ca when withCA and names the build of img
// with it: the Spec that Build takes, but for the envd, the start
// overrides and the start check mode, which the caller sets. A CA that
// does not load is a *CAError.
func Plan(ctx context.Context, ca CALoader, img *Image, withCA bool, name Naming) (Spec, error) {
	spec := Spec{Image: img}
	caFingerprint := ""
	if withCA {
		loaded, err := ca.LoadCA(ctx)
		if err != nil {
			return Spec{}, &CAError{Err: err}
		}
		spec.CA, caFingerprint = loaded, loaded.Fingerprint
	}
	var err error
	if spec.Fingerprint, spec.ArtifactID, err = name(img.Digest, caFingerprint); err != nil {
		return Spec{}, err
	}
	return spec, nil
}
