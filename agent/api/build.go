package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// MaxEnvdBytes is the largest envd binary a build request may carry.
const MaxEnvdBytes = 16 << 20

// elfMagic starts every ELF binary.
var elfMagic = []byte{0x7f, 'E', 'L', 'F'}

// jobIDPattern admits CubeMaster's UUID job ids and similar plain tokens; the
// id ends up in a callback URL path and in logs.
var jobIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// BuildRequest is the body of POST /tc/api/v1/build.
type BuildRequest struct {
	JobID string `json:"job_id"`
	// Request is the normalized CreateTemplateFromImageReq, kept verbatim
	// so fields this agent does not know survive.
	Request         json.RawMessage `json:"request"`
	DownloadBaseURL string          `json:"download_base_url,omitempty"`
	EnvdSHA256      string          `json:"envd_sha256,omitempty"`
	EnvdData        []byte          `json:"envd_data,omitempty"`
}

// TemplateRequest holds the fields of CreateTemplateFromImageReq the build
// uses. Decoding is case-insensitive on names, as CubeMaster's is.
type TemplateRequest struct {
	RequestID          string              `json:"requestID"`
	SourceImageRef     string              `json:"source_image_ref,omitempty"`
	RegistryUsername   string              `json:"registry_username,omitempty"`
	RegistryPassword   string              `json:"registry_password,omitempty"`
	TemplateID         string              `json:"template_id,omitempty"`
	InstanceType       string              `json:"instance_type,omitempty"`
	NetworkType        string              `json:"network_type,omitempty"`
	WritableLayerSize  string              `json:"writable_layer_size,omitempty"`
	ExposedPorts       []int32             `json:"exposed_ports,omitempty"`
	ContainerOverrides *ContainerOverrides `json:"container_overrides,omitempty"`
	WithCubeCA         *bool               `json:"with_cube_ca,omitempty"`
}

// WantsCA reports whether the egress CA is to be baked (nil means yes).
func (t *TemplateRequest) WantsCA() bool { return t.WithCubeCA == nil || *t.WithCubeCA }

// Build is a validated build request.
type Build struct {
	BuildRequest
	Template TemplateRequest
	// EnvdSHA is the SHA-256 of EnvdData computed here, empty without envd.
	EnvdSHA string
}

// ValidationError is a request CubeMaster sent that can never be built; the
// HTTP layer answers it with 400.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ParseBuild decodes and validates a build request body. Every error it
// returns is a *ValidationError.
func ParseBuild(body []byte) (*Build, error) {
	var b Build
	if err := json.Unmarshal(body, &b.BuildRequest); err != nil {
		return nil, invalid("", "malformed JSON body: %v", err)
	}
	b.JobID = strings.TrimSpace(b.JobID)
	switch {
	case b.JobID == "":
		return nil, invalid("job_id", "required")
	case !jobIDPattern.MatchString(b.JobID):
		return nil, invalid("job_id", "must be 1-128 characters of letters, digits and . _ : - (got %s)", safetext.Quote(b.JobID, 64))
	}
	raw := bytes.TrimSpace(b.Request)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, invalid("request", "required")
	}
	if raw[0] != '{' {
		return nil, invalid("request", "must be a JSON object")
	}
	if err := json.Unmarshal(raw, &b.Template); err != nil {
		return nil, invalid("request", "%v", err)
	}
	t := &b.Template
	t.SourceImageRef = strings.TrimSpace(t.SourceImageRef)
	if t.SourceImageRef == "" {
		return nil, invalid("request.source_image_ref", "required")
	}
	if strings.TrimSpace(t.WritableLayerSize) == "" {
		return nil, invalid("request.writable_layer_size", "required")
	}
	if err := b.ValidateEnvd(); err != nil {
		return nil, err
	}
	return &b, nil
}

// ValidateEnvd checks the envd payload and computes its digest. A caller's
// envd_sha256 is only a claim: it must match the bytes, and without bytes
// it is ignored (nothing is injected, so it must not shape the fingerprint).
func (b *Build) ValidateEnvd() error {
	if b.EnvdData == nil {
		return nil
	}
	switch {
	case len(b.EnvdData) == 0:
		return invalid("envd_data", "empty")
	case len(b.EnvdData) > MaxEnvdBytes:
		return invalid("envd_data", "%d bytes is over the %d byte limit", len(b.EnvdData), MaxEnvdBytes)
	case !bytes.HasPrefix(b.EnvdData, elfMagic):
		return invalid("envd_data", "not an ELF binary")
	}
	sum := sha256.Sum256(b.EnvdData)
	b.EnvdSHA = hex.EncodeToString(sum[:])
	if claimed := strings.ToLower(strings.TrimSpace(b.EnvdSHA256)); claimed != "" && claimed != b.EnvdSHA {
		return invalid("envd_sha256", "%s does not match the envd_data bytes (sha256 %s)", safetext.Quote(claimed, 64), b.EnvdSHA)
	}
	return nil
}

// Fingerprint is the template spec fingerprint: the SHA-256 of the JSON
// encoding of exactly these fields in this order, as CubeMaster computes it,
// so both sides key artifacts identically.
func Fingerprint(t *TemplateRequest, sourceImageDigest, caFingerprint, envdSHA string) (string, error) {
	payload := struct {
		SourceImageDigest       string              `json:"source_image_digest"`
		WritableLayerSize       string              `json:"writable_layer_size"`
		ExposedPorts            []int32             `json:"exposed_ports,omitempty"`
		InstanceType            string              `json:"instance_type"`
		NetworkType             string              `json:"network_type"`
		ContainerOverrides      *ContainerOverrides `json:"container_overrides,omitempty"`
		CubeEgressCAFingerprint string              `json:"cube_egress_ca_fingerprint,omitempty"`
		EnvdBinarySHA256        string              `json:"envd_binary_sha256,omitempty"`
	}{sourceImageDigest, t.WritableLayerSize, t.ExposedPorts, t.InstanceType, t.NetworkType,
		t.ContainerOverrides, caFingerprint, envdSHA}
	data, err := json.Marshal(payload)
	if err != nil {
		return "", fmt.Errorf("encode fingerprint payload: %w", err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// Name names the build of b from what only resolving its image and loading
// the egress CA tell: the image's digest and the CA's fingerprint ("" for
// a build without the CA). It returns the template spec's fingerprint and
// the artifact ID derived from it.
func (b *Build) Name(sourceImageDigest, caFingerprint string) (fingerprint, artifactID string, err error) {
	fingerprint, err = Fingerprint(&b.Template, sourceImageDigest, caFingerprint, b.EnvdSHA)
	if err != nil {
		return "", "", err
	}
	return fingerprint, ArtifactID(fingerprint), nil
}

// ArtifactID names the artifact of a fingerprint: deterministic, so the same
// spec always lands at the same path.
func ArtifactID(fingerprint string) string { return "rfs-" + fingerprint[:24] }

// artifactIDPattern admits artifact ids of this agent ("rfs-" + 24 hex) and
// of older builders (with a UUID suffix), and nothing that could name a path
// outside the store.
var artifactIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)

// ValidArtifactID reports whether id is a plain artifact id, safe to use as
// one path component.
func ValidArtifactID(id string) bool { return artifactIDPattern.MatchString(id) }

// NormalizeBaseURL adds http:// to a base URL without a scheme, as upstream
// does for download_base_url.
func NormalizeBaseURL(u string) string {
	u = strings.TrimSpace(u)
	if u == "" || strings.Contains(u, "://") {
		return u
	}
	return "http://" + u
}
