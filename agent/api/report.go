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
)

// Report is one status callback body: a flat JSON object.
type Report map[string]any

// Encode renders the report.
func (r Report) Encode() ([]byte, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode report: %w", err)
	}
	return data, nil
}

// RunningReport says the job is in a phase at a progress percentage.
func RunningReport(phase string, progress int) Report {
	return Report{"status": StatusRunning, "phase": phase, "progress": progress}
}

// FingerprintReport tells CubeMaster which artifact the job resolved to.
func FingerprintReport(artifactID, fingerprint, digest string) Report {
	return Report{"artifact_id": artifactID, "template_spec_fingerprint": fingerprint, "source_image_digest": digest}
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

// PullReport carries download progress.
func PullReport(p Pull) Report {
	return Report{
		"pull_total_bytes":      p.TotalBytes,
		"pull_downloaded_bytes": p.DownloadedBytes,
		"pull_total_layers":     p.TotalLayers,
		"pull_completed_layers": p.CompletedLayers,
		"pull_speed_bps":        p.SpeedBPS,
	}
}

// FailedReport ends a job with an error in the phase it failed in.
func FailedReport(phase, message string) Report {
	return Report{"status": StatusFailed, "phase": phase, "progress": ProgressDone, "error_message": message}
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
}

// BuiltReport ends a job successfully.
func BuiltReport(b Built) Report {
	r := Report{
		"status":                         StatusBuilt,
		"phase":                          PhaseReady,
		"progress":                       ProgressDone,
		"artifact_id":                    b.ArtifactID,
		"artifact_status":                "READY",
		"template_spec_fingerprint":      b.Fingerprint,
		"source_image_digest":            b.SourceDigest,
		"ext4_path":                      b.Ext4Path,
		"ext4_sha256":                    b.Ext4SHA256,
		"ext4_size_bytes":                b.Ext4SizeBytes,
		"image_config_json":              b.ImageConfigJSON,
		"master_node_ip":                 b.MasterNodeIP,
		"cube_egress_ca_baked":           b.CABaked,
		"cube_egress_ca_fingerprint":     b.CAFingerprint,
		"cube_egress_ca_targets_written": b.CATargets,
	}
	// Sent only for a verified object, as upstream: CubeMaster and the
	// Cubelets then download from the blob store.
	if b.StorageBackend != "" {
		r["storage_backend"], r["object_key"] = b.StorageBackend, b.ObjectKey
	}
	if b.ArtifactURL != "" {
		r["artifact_url"] = b.ArtifactURL
	}
	return r
}
