package api

import (
	"encoding/json"
	"fmt"
)

// Job statuses and phases the agent reports. CubeMaster, not the agent,
// moves a job to READY after distribution.
const (
	StatusRunning = "RUNNING"
	StatusFailed  = "FAILED"
	StatusBuilt   = "BUILT"

	PhasePulling      = "PULLING"
	PhaseUnpacking    = "UNPACKING"
	PhaseBuildingExt4 = "BUILDING_EXT4"
	PhaseReady        = "READY"
)

// Progress values of the phase reports, as upstream sends them.
const (
	ProgressPulling   = 5
	ProgressUnpacking = 20
	ProgressBuilding  = 40
	ProgressDone      = 100
	// The upload to the blob store, after the image build's 95, moves
	// progress from ProgressUploadStart to ProgressUploadEnd.
	ProgressUploadStart = 96
	ProgressUploadEnd   = 99
)

// Report is one status callback body. Each kind of report is a struct of
// its own below; their fields are in the order of their JSON keys, sorted,
// which is the order CubeMaster has always received them in.
type Report struct{ body any }

// Encode renders the report.
func (r Report) Encode() ([]byte, error) {
	data, err := json.Marshal(r.body)
	if err != nil {
		return nil, fmt.Errorf("encode report: %w", err)
	}
	return data, nil
}

// runningBody says the job is in a phase at a progress percentage.
type runningBody struct {
	Phase    string `json:"phase"`
	Progress int    `json:"progress"`
	Status   string `json:"status"`
}

// RunningReport says the job is in a phase at a progress percentage.
func RunningReport(phase string, progress int) Report {
	return Report{runningBody{Phase: phase, Progress: progress, Status: StatusRunning}}
}

// fingerprintBody tells CubeMaster which artifact the job resolved to.
type fingerprintBody struct {
	ArtifactID   string `json:"artifact_id"`
	SourceDigest string `json:"source_image_digest"`
	Fingerprint  string `json:"template_spec_fingerprint"`
}

// FingerprintReport tells CubeMaster which artifact the job resolved to.
func FingerprintReport(artifactID, fingerprint, digest string) Report {
	return Report{fingerprintBody{ArtifactID: artifactID, SourceDigest: digest, Fingerprint: fingerprint}}
}

// Pull is the download progress of a job's image layers, as reported to
// CubeMaster.
type Pull struct {
	TotalBytes      int64
	DownloadedBytes int64
	TotalLayers     int
	CompletedLayers int
	SpeedBPS        int64
}

// pullBody carries download progress.
type pullBody struct {
	CompletedLayers int   `json:"pull_completed_layers"`
	DownloadedBytes int64 `json:"pull_downloaded_bytes"`
	SpeedBPS        int64 `json:"pull_speed_bps"`
	TotalBytes      int64 `json:"pull_total_bytes"`
	TotalLayers     int   `json:"pull_total_layers"`
}

// PullReport carries download progress.
func PullReport(p Pull) Report {
	return Report{pullBody{CompletedLayers: p.CompletedLayers, DownloadedBytes: p.DownloadedBytes, SpeedBPS: p.SpeedBPS,
		TotalBytes: p.TotalBytes, TotalLayers: p.TotalLayers}}
}

// failedBody ends a job with an error in the phase it failed in.
type failedBody struct {
	ErrorMessage string `json:"error_message"`
	Phase        string `json:"phase"`
	Progress     int    `json:"progress"`
	Status       string `json:"status"`
}

// FailedReport ends a job with an error in the phase it failed in.
func FailedReport(phase, message string) Report {
	return Report{failedBody{ErrorMessage: message, Phase: phase, Progress: ProgressDone, Status: StatusFailed}}
}

// Built describes a published artifact for the BUILT report. The agent also
// stores it in the spool (spool.Artifact.Result) to reuse the artifact; the
// json tags fix that record's keys to the Go field names earlier releases
// wrote, so renaming a field must keep its tag.
type Built struct {
	ArtifactID      string `json:"ArtifactID"`
	Fingerprint     string `json:"Fingerprint"`
	SourceDigest    string `json:"SourceDigest"`
	Ext4Path        string `json:"Ext4Path"`
	Ext4SHA256      string `json:"Ext4SHA256"`
	Ext4SizeBytes   int64  `json:"Ext4SizeBytes"`
	ImageConfigJSON string `json:"ImageConfigJSON"`
	MasterNodeIP    string `json:"MasterNodeIP"`
	CABaked         bool   `json:"CABaked"`
	CAFingerprint   string `json:"CAFingerprint"`
	CATargets       int    `json:"CATargets"`
	// StorageBackend ("s3" or "fs"), ObjectKey and, for S3, ArtifactURL
	// (presigned) are set only when the artifact's object is verified in
	// the blob store.
	StorageBackend string `json:"StorageBackend,omitempty"`
	ObjectKey      string `json:"ObjectKey,omitempty"`
	ArtifactURL    string `json:"ArtifactURL,omitempty"`
	// TemplateCheck is the start check's result, nil when it was off
	// (or for an artifact recorded before the check existed).
	TemplateCheck *TemplateCheck `json:"TemplateCheck,omitempty"`
}

// TemplateCheck is the start check's result: whether the template's
// start command can run in its image. Result is "ok", "warnings",
// "no_command" or, when the agent only warns (build.start_check: warn),
// "failed".
type TemplateCheck struct {
	Result      string   `json:"result"`
	Command     []string `json:"command,omitempty"`
	Resolved    string   `json:"resolved,omitempty"`
	Interpreter string   `json:"interpreter,omitempty"`
	Problems    []string `json:"problems,omitempty"`
	// Libraries maps each shared library that will load (by the name it
	// is needed as) to the path the loader opens; LibrariesOmitted counts
	// those left out to keep template_check within its bound.
	Libraries        map[string]string `json:"libraries,omitempty"`
	LibrariesOmitted int               `json:"libraries_omitted,omitempty"`
}

// builtBody ends a job successfully. The blob store's fields are sent
// only for a verified object, as upstream: CubeMaster and the Cubelets then
// download from the blob store.
type builtBody struct {
	ArtifactID     string `json:"artifact_id"`
	ArtifactStatus string `json:"artifact_status"`
	ArtifactURL    string `json:"artifact_url,omitempty"`
	CABaked        bool   `json:"cube_egress_ca_baked"`
	CAFingerprint  string `json:"cube_egress_ca_fingerprint"`
	CATargets      int    `json:"cube_egress_ca_targets_written"`
	Ext4Path       string `json:"ext4_path"`
	Ext4SHA256     string `json:"ext4_sha256"`
	Ext4SizeBytes  int64  `json:"ext4_size_bytes"`
	ImageConfig    string `json:"image_config_json"` // at most MaxImageConfigJSON bytes
	MasterNodeIP   string `json:"master_node_ip"`
	// ObjectKey and StorageBackend go together: both or neither.
	ObjectKey      *string `json:"object_key,omitempty"`
	Phase          string  `json:"phase"`
	Progress       int     `json:"progress"`
	SourceDigest   string  `json:"source_image_digest"`
	Status         string  `json:"status"`
	StorageBackend string  `json:"storage_backend,omitempty"`
	// TemplateCheck is absent when the check was off.
	TemplateCheck *TemplateCheck `json:"template_check,omitempty"`
	Fingerprint   string         `json:"template_spec_fingerprint"`
}

// BuiltReport ends a job successfully.
func BuiltReport(b Built) Report {
	body := builtBody{
		ArtifactID: b.ArtifactID, ArtifactStatus: "READY", ArtifactURL: b.ArtifactURL,
		CABaked: b.CABaked, CAFingerprint: b.CAFingerprint, CATargets: b.CATargets,
		Ext4Path: b.Ext4Path, Ext4SHA256: b.Ext4SHA256, Ext4SizeBytes: b.Ext4SizeBytes,
		ImageConfig: b.ImageConfigJSON, MasterNodeIP: b.MasterNodeIP,
		Phase: PhaseReady, Progress: ProgressDone, SourceDigest: b.SourceDigest, Status: StatusBuilt,
		TemplateCheck: b.TemplateCheck, Fingerprint: b.Fingerprint,
	}
	if b.StorageBackend != "" {
		key := b.ObjectKey
		body.StorageBackend, body.ObjectKey = b.StorageBackend, &key
	}
	return Report{body}
}

// MaxImageConfigJSON bounds image_config_json: CubeMaster stores it in a
// TEXT column (65,535 bytes in MySQL), and an insert that does not fit
// fails, losing the BUILT report.
const MaxImageConfigJSON = 65535
