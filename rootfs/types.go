package rootfs

import (
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/inject"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
)

// Source names the image to build from: a registry reference
// ("docker.io/library/debian:12", "http://host:5000/x:y") or an offline
// source ("oci-layout:DIR[:TAG]", "docker-archive:FILE.tar"), with optional
// registry credentials.
type Source struct {
	Ref      string
	Username string
	Password string
}

// ImageConfig is the part of the image configuration the template keeps;
// the JSON keys are those of Docker's image config.
type ImageConfig struct {
	Entrypoint []string `json:"Entrypoint"`
	Cmd        []string `json:"Cmd"`
	Env        []string `json:"Env"`
	WorkingDir string   `json:"WorkingDir"`
	User       string   `json:"User"`
}

// Image is a resolved image: its manifest and configuration are known, its
// layers not yet fetched.
type Image struct {
	// Digest is "<repository>@sha256:<manifest digest>".
	Digest string
	Config ImageConfig
	// CompressedSize is the sum of the layer sizes in the manifest.
	CompressedSize int64
	// Created is the image creation time (zero when unknown).
	Created time.Time
	// Arch is the GOARCH of the image config's architecture, "" when it
	// names none (the start check then assumes amd64).
	Arch string
	// resolved is what Build fetches the layers from.
	resolved *oci.Image
}

// CA is the egress root certificate to bake into images.
type CA = inject.CA

// Spec is everything one build needs beyond the image.
type Spec struct {
	Image       *Image
	ArtifactID  string
	Fingerprint string
	// Envd is the guest agent binary to install, nil for none.
	Envd []byte
	// CA is the egress CA to bake, nil for none.
	CA *CA
	// Start holds the request's overrides of the image's start command,
	// for the start check.
	Start StartOverrides
	// StartCheck says what the start check does; "" is StartCheckFail.
	StartCheck StartCheckMode
}

// Progress is a snapshot of a running build. Percent runs from 40 (start of
// the image build) to 99; Pull is set while layers download.
type Progress struct {
	Percent int
	Pull    *PullProgress
}

// PullProgress is the state of the layer downloads, as the puller tracks
// it (Done reports the final one).
type PullProgress = oci.Progress

// ProgressFunc receives progress; it must not block.
type ProgressFunc func(Progress)

// Artifact is a published template image.
type Artifact struct {
	ID     string
	Path   string
	SHA256 string
	Size   int64
	// ModTime of the published file, recorded to detect later changes.
	ModTime time.Time
	// CA reports what baking the egress CA did.
	CABaked   bool
	CATargets int
	// StartCheck is the start check's result, nil when it was off.
	StartCheck *StartCheck
}
