package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestFingerprintMatchesCubeMasterEncoding checks the exact bytes hashed:
// fields in CubeMaster's order, zero values omitted where its tags say so,
// unknown request fields ignored, map keys sorted, HTML characters escaped
// as Go's encoder does.
func TestFingerprintMatchesCubeMasterEncoding(t *testing.T) {
	request := `{
		"requestID": "r-1", "source_image_ref": "docker.io/library/nginx:1.25",
		"registry_password": "pw", "template_id": "tpl-abc", "alias": "web",
		"instance_type": "cubebox", "network_type": "tap", "writable_layer_size": "20Gi",
		"exposed_ports": [8080, 80], "distribution_scope": ["n1"], "future_field": {"x": 1},
		"container_overrides": {
			"annotations": {"z": "1", "a": "<b>&"}, "command": ["/bin/sh", "-c"], "args": [],
			"working_dir": "", "envs": [{"key": "A", "value": "1"}, {"key": "EMPTY"}],
			"resources": {"cpu": "2", "mem": "4Gi", "limit": {"cpu": "4"}},
			"probe": {"probe_handler": {"http_get": {"path": "/healthz", "port": 8080}}, "period_ms": 500, "timeout_ms": 0},
			"security_context": {"run_as_user": {"value": 1000}, "capabilities": {"add_capabilities": ["NET_ADMIN"]}},
			"volume_mounts": [{"name": "data", "container_path": "/data", "readonly": true, "propagation": 1}],
			"dns_config": {"servers": ["1.1.1.1"]}, "r_limit": {"no_file": 65536}, "unknown_override": true
		}
	}`
	var tr TemplateRequest
	if err := json.Unmarshal([]byte(request), &tr); err != nil {
		t.Fatal(err)
	}
	const canonical = `{"source_image_digest":"docker.io/library/nginx@sha256:abc","writable_layer_size":"20Gi",` +
		`"exposed_ports":[8080,80],"instance_type":"cubebox","network_type":"tap","container_overrides":{` +
		`"command":["/bin/sh","-c"],"envs":[{"key":"A","value":"1"},{"key":"EMPTY"}],"dns_config":{"servers":["1.1.1.1"]},` +
		`"resources":{"cpu":"2","mem":"4Gi","limit":{"cpu":"4"}},"security_context":{"capabilities":{"add_capabilities":["NET_ADMIN"]},` +
		`"run_as_user":{"value":1000}},"probe":{"probe_handler":{"http_get":{"path":"/healthz","port":8080}},"period_ms":500},` +
		`"annotations":{"a":"\u003cb\u003e\u0026","z":"1"},"volume_mounts":[{"name":"data","container_path":"/data","readonly":true,"propagation":1}],` +
		`"r_limit":{"no_file":65536}},"cube_egress_ca_fingerprint":"cafp","envd_binary_sha256":"envdsha"}`
	if got, want := fingerprint(t, &tr, "docker.io/library/nginx@sha256:abc", "cafp", "envdsha"), sha(canonical); got != want {
		t.Errorf("Fingerprint = %s, want sha256 of\n%s\n= %s", got, canonical, want)
	}

	var minimal TemplateRequest
	json.Unmarshal([]byte(`{"source_image_ref":"x","writable_layer_size":"1Gi"}`), &minimal)
	const minimalCanonical = `{"source_image_digest":"d","writable_layer_size":"1Gi","instance_type":"","network_type":""}`
	if got := fingerprint(t, &minimal, "d", "", ""); got != sha(minimalCanonical) {
		t.Errorf("minimal Fingerprint = %s, want sha256(%s)", got, minimalCanonical)
	}
	var emptyOverrides TemplateRequest
	json.Unmarshal([]byte(`{"writable_layer_size":"1Gi","container_overrides":{}}`), &emptyOverrides)
	if got, want := fingerprint(t, &emptyOverrides, "d", "", ""), sha(`{"source_image_digest":"d","writable_layer_size":"1Gi","instance_type":"","network_type":"","container_overrides":{}}`); got != want {
		t.Errorf("empty overrides object must stay in the payload: got %s want %s", got, want)
	}
	if id := ArtifactID(sha(canonical)); id != "rfs-"+sha(canonical)[:24] {
		t.Errorf("ArtifactID = %s", id)
	}
}

// fingerprint is Fingerprint failing t on an error.
func fingerprint(t *testing.T, tr *TemplateRequest, digest, caFP, envdSHA string) string {
	t.Helper()
	fp, err := Fingerprint(tr, digest, caFP, envdSHA)
	if err != nil {
		t.Fatalf("Fingerprint: %v", err)
	}
	return fp
}

// encode is Report.Encode failing t on an error.
func encode(t *testing.T, r Report) []byte {
	t.Helper()
	data, err := r.Encode()
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	return data
}

func TestParseBuild(t *testing.T) {
	elf := "f0VMRgIBAQAAAAAAAAAAAA==" // base64 of an ELF header start
	elfSHA := func() string {
		b := []byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		sum := sha256.Sum256(b)
		return hex.EncodeToString(sum[:])
	}()
	req := `"request":{"source_image_ref":" img ","writable_layer_size":"1Gi"}`
	cases := []struct {
		name, body, field string
	}{
		{"Valid", `{"job_id":"j",` + req + `}`, ""},
		{"ValidEnvdWithMatchingSHA", `{"job_id":"j","envd_data":"` + elf + `","envd_sha256":"` + strings.ToUpper(elfSHA) + `",` + req + `}`, ""},
		{"ShaWithoutDataIgnored", `{"job_id":"j","envd_sha256":"abc",` + req + `}`, ""},
		{"NullEnvd", `{"job_id":"j","envd_data":null,` + req + `}`, ""},
		{"Garbage", `nope`, ""},
		{"BlankJobID", `{"job_id":"  ",` + req + `}`, "job_id"},
		{"SlashJobID", `{"job_id":"a/b",` + req + `}`, "job_id"},
		{"LongJobID", `{"job_id":"` + strings.Repeat("a", 129) + `",` + req + `}`, "job_id"},
		{"NullRequest", `{"job_id":"j","request":null}`, "request"},
		{"BadRequestField", `{"job_id":"j","request":{"exposed_ports":"80"}}`, "request"},
		{"EnvdEmpty", `{"job_id":"j","envd_data":"",` + req + `}`, "envd_data"},
		{"EnvdWrongSHA", `{"job_id":"j","envd_data":"` + elf + `","envd_sha256":"00",` + req + `}`, "envd_sha256"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := ParseBuild([]byte(c.body))
			valid := c.field == "" && c.name != "Garbage"
			if valid {
				if err != nil {
					t.Fatalf("ParseBuild = %v", err)
				}
				if b.Template.SourceImageRef != "img" {
					t.Errorf("source_image_ref = %q, want trimmed", b.Template.SourceImageRef)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ParseBuild = %v, want a validation error", err)
			}
			if ve.Field != c.field {
				t.Errorf("field = %q, want %q (%v)", ve.Field, c.field, err)
			}
		})
	}
	b, _ := ParseBuild([]byte(`{"job_id":"j","envd_data":"` + elf + `",` + req + `}`))
	if b.EnvdSHA != elfSHA {
		t.Errorf("EnvdSHA = %s, want %s", b.EnvdSHA, elfSHA)
	}
	b, _ = ParseBuild([]byte(`{"job_id":"j","envd_sha256":"abc",` + req + `}`))
	if b.EnvdSHA != "" {
		t.Error("a claimed envd_sha256 without envd_data must not feed the fingerprint")
	}
}

func TestTokenPolicy(t *testing.T) {
	for _, c := range []struct {
		policy TokenPolicy
		header string
		want   int
	}{
		{TokenPolicy{Token: "t"}, "t", 0},
		{TokenPolicy{Token: " t\n"}, " t ", 0},
		{TokenPolicy{Token: "t"}, "T", 401},
		{TokenPolicy{Token: "t"}, "", 401},
		{TokenPolicy{}, "anything", 503},
		{TokenPolicy{Insecure: true}, "", 0},
		{TokenPolicy{Token: "t", Insecure: true}, "", 401},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		if c.header != "" {
			r.Header.Set(TokenHeader, c.header)
		}
		if got, _ := c.policy.Check(r); got != c.want {
			t.Errorf("%+v with %q = %d, want %d", c.policy, c.header, got, c.want)
		}
	}
}

func TestValidArtifactIDAndBaseURL(t *testing.T) {
	for id, want := range map[string]bool{"rfs-0123456789abcdef01234567": true, "rfs-fp123-uuid1": true,
		"..": false, ".": false, "a/b": false, "../x": false, "": false, "-x": false, "rfs x": false} {
		if ValidArtifactID(id) != want {
			t.Errorf("ValidArtifactID(%q) = %v", id, !want)
		}
	}
	for in, want := range map[string]string{"10.0.0.1:8089": "http://10.0.0.1:8089", "https://m:1": "https://m:1", "": ""} {
		if got := NormalizeBaseURL(in); got != want {
			t.Errorf("NormalizeBaseURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReportBodies(t *testing.T) {
	var got map[string]any
	json.Unmarshal(encode(t, FailedReport("PULLING", "boom")), &got)
	if got["status"] != "FAILED" || got["phase"] != "PULLING" || got["progress"] != float64(100) || got["error_message"] != "boom" || len(got) != 4 {
		t.Errorf("FailedReport = %v", got)
	}
	json.Unmarshal(encode(t, BuiltReport(Built{ArtifactID: "a", Ext4SizeBytes: 7})), &got)
	for _, k := range []string{"status", "phase", "progress", "artifact_id", "artifact_status", "template_spec_fingerprint",
		"source_image_digest", "ext4_path", "ext4_sha256", "ext4_size_bytes", "image_config_json", "master_node_ip",
		"cube_egress_ca_baked", "cube_egress_ca_fingerprint", "cube_egress_ca_targets_written"} {
		if _, ok := got[k]; !ok {
			t.Errorf("BUILT report lacks %s", k)
		}
	}
	json.Unmarshal(encode(t, PullReport(Pull{TotalBytes: 10, DownloadedBytes: 5, TotalLayers: 2, CompletedLayers: 1, SpeedBPS: 3})), &got)
	if got["pull_total_bytes"] != float64(10) || got["pull_speed_bps"] != float64(3) {
		t.Errorf("PullReport = %v", got)
	}
}

// TestReportWireBytes pins every report's bytes on the wire: keys sorted,
// every field present but the blob store's, as CubeMaster has always
// received them.
func TestReportWireBytes(t *testing.T) {
	for _, c := range []struct {
		report Report
		want   string
	}{
		{RunningReport(PhasePulling, 5), `{"phase":"PULLING","progress":5,"status":"RUNNING"}`},
		{FingerprintReport("rfs-a", "fp", "sha256:d"), `{"artifact_id":"rfs-a","source_image_digest":"sha256:d","template_spec_fingerprint":"fp"}`},
		{PullReport(Pull{TotalBytes: 10, DownloadedBytes: 0, TotalLayers: 2, CompletedLayers: 0, SpeedBPS: 3}), `{"pull_completed_layers":0,"pull_downloaded_bytes":0,"pull_speed_bps":3,"pull_total_bytes":10,"pull_total_layers":2}`},
		{FailedReport(PhaseUnpacking, "boom \"x\" <y>"), `{"error_message":"boom \"x\" \u003cy\u003e","phase":"UNPACKING","progress":100,"status":"FAILED"}`},
		{BuiltReport(Built{ArtifactID: "a", Fingerprint: "f", Ext4SizeBytes: 7, CABaked: true}), `{"artifact_id":"a","artifact_status":"READY","cube_egress_ca_baked":true,"cube_egress_ca_fingerprint":"","cube_egress_ca_targets_written":0,"ext4_path":"","ext4_sha256":"","ext4_size_bytes":7,"image_config_json":"","master_node_ip":"","phase":"READY","progress":100,"source_image_digest":"","status":"BUILT","template_spec_fingerprint":"f"}`},
		{BuiltReport(Built{ArtifactID: "a", StorageBackend: "s3", ObjectKey: "k", ArtifactURL: "https://x/y?a=b&c=d"}), `{"artifact_id":"a","artifact_status":"READY","artifact_url":"https://x/y?a=b\u0026c=d","cube_egress_ca_baked":false,"cube_egress_ca_fingerprint":"","cube_egress_ca_targets_written":0,"ext4_path":"","ext4_sha256":"","ext4_size_bytes":0,"image_config_json":"","master_node_ip":"","object_key":"k","phase":"READY","progress":100,"source_image_digest":"","status":"BUILT","storage_backend":"s3","template_spec_fingerprint":""}`},
		{BuiltReport(Built{ArtifactID: "a", TemplateCheck: &TemplateCheck{Result: "ok", Command: []string{"python3", "app.py"}, Resolved: "/usr/bin/python3.11", Interpreter: "/lib64/ld-linux-x86-64.so.2"}}), `{"artifact_id":"a","artifact_status":"READY","cube_egress_ca_baked":false,"cube_egress_ca_fingerprint":"","cube_egress_ca_targets_written":0,"ext4_path":"","ext4_sha256":"","ext4_size_bytes":0,"image_config_json":"","master_node_ip":"","phase":"READY","progress":100,"source_image_digest":"","status":"BUILT","template_check":{"result":"ok","command":["python3","app.py"],"resolved":"/usr/bin/python3.11","interpreter":"/lib64/ld-linux-x86-64.so.2"},"template_spec_fingerprint":""}`},
		{BuiltReport(Built{ArtifactID: "a", TemplateCheck: &TemplateCheck{Result: "failed", Command: []string{"python3"}, Problems: []string{`command "python3" not found on PATH=/usr/bin:/bin`}}}), `{"artifact_id":"a","artifact_status":"READY","cube_egress_ca_baked":false,"cube_egress_ca_fingerprint":"","cube_egress_ca_targets_written":0,"ext4_path":"","ext4_sha256":"","ext4_size_bytes":0,"image_config_json":"","master_node_ip":"","phase":"READY","progress":100,"source_image_digest":"","status":"BUILT","template_check":{"result":"failed","command":["python3"],"problems":["command \"python3\" not found on PATH=/usr/bin:/bin"]},"template_spec_fingerprint":""}`},
		{BuiltReport(Built{ArtifactID: "a", StorageBackend: "fs", ObjectKey: "k"}), `{"artifact_id":"a","artifact_status":"READY","cube_egress_ca_baked":false,"cube_egress_ca_fingerprint":"","cube_egress_ca_targets_written":0,"ext4_path":"","ext4_sha256":"","ext4_size_bytes":0,"image_config_json":"","master_node_ip":"","object_key":"k","phase":"READY","progress":100,"source_image_digest":"","status":"BUILT","storage_backend":"fs","template_spec_fingerprint":""}`},
	} {
		if got := string(encode(t, c.report)); got != c.want {
			t.Errorf("report = %s\nwant       %s", got, c.want)
		}
	}
}
