package api

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestBuiltRecordFormat reads an artifact record as the agent stores it in
// the spool (spool.Artifact.Result), in the format releases before the json
// tags wrote: the Go field names as keys. The fixture has no update switch
// on purpose: it is what is already on disk on deployed nodes, so a change
// that breaks this test breaks artifact reuse after an upgrade.
func TestBuiltRecordFormat(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "spool", "built-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	raw = bytes.TrimSpace(raw)
	want := Built{
		ArtifactID:      "rfs-0123456789abcdef01234567",
		Fingerprint:     "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		SourceDigest:    "registry.test/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		Ext4Path:        "/var/lib/cube-template-center/store/rfs-0123456789abcdef01234567.ext4",
		Ext4SHA256:      "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
		Ext4SizeBytes:   209715200,
		ImageConfigJSON: `{"Entrypoint":["/docker-entrypoint.sh"],"Cmd":["nginx","-g","daemon off;"],"Env":["PATH=/usr/bin"],"WorkingDir":"","User":""}`,
		MasterNodeIP:    "http://10.0.0.1:8089",
		CABaked:         true,
		CAFingerprint:   "0123456789abcdef",
		CATargets:       3,
	}

	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var got Built
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decode stored record: %v", err)
	}
	if got != want {
		t.Errorf("decode stored record:\n got %+v\nwant %+v", got, want)
	}

	enc, err := json.Marshal(want)
	if err != nil {
		t.Fatalf("json.Marshal(Built): %v", err)
	}
	if !bytes.Equal(enc, raw) {
		t.Errorf("json.Marshal(Built) changed the stored format:\n got %s\nwant %s", enc, raw)
	}
}
