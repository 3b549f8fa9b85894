package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// maxErrorLen bounds a validation message: it is the body of a 400 answer
// and a log line, and must never echo a hostile body back whole.
const maxErrorLen = 1024

// FuzzParseBuild checks that ParseBuild never panics, that every error is
// a short *ValidationError, and that a parsed request, encoded again,
// parses to the same build: the same job, the same template (compared by
// its JSON encoding, which is what the fingerprint hashes) and the same
// envd digest.
func FuzzParseBuild(f *testing.F) {
	elf := "f0VMRgIBAQAAAAAAAAAAAA==" // base64 of an ELF header start
	req := `"request":{"source_image_ref":" img ","writable_layer_size":"1Gi"}`
	for _, s := range []string{
		`{"job_id":"j",` + req + `}`,
		`{"job_id":"j","envd_data":"` + elf + `",` + req + `}`,
		`{"job_id":"j","envd_data":"` + elf + `","envd_sha256":"00",` + req + `}`,
		`{"job_id":"j","envd_data":"",` + req + `}`,
		`{"JOB_ID":" j ","Request":{"SOURCE_IMAGE_REF":"x","writable_layer_size":"1Gi","exposed_ports":[],"container_overrides":{"annotations":{}}}}`,
		`{"job_id":"j","request":{"source_image_ref":"x","writable_layer_size":"1Gi","container_overrides":{"envs":[null,{"key":"A"}],"probe":{"probe_handler":{"http_get":{"path":"/"}}}}}}`,
		`{"job_id":"j","request":[1]}`,
		`{"job_id":"j","request":null}`,
		`{"job_id":"a/b",` + req + `}`,
		`{"job_id":"j","request":{"exposed_ports":"80"}}`,
		`{"job_id":"j","request":{"container_overrides":{"annotations":{"k":1}}}}`,
		`nope`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := ParseBuild(body)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ParseBuild error %v (%T) is not a *ValidationError", err, err)
			}
			if msg := err.Error(); len(msg) > maxErrorLen || !utf8.ValidString(msg) {
				t.Fatalf("ParseBuild error of %d bytes (valid UTF-8: %v): %.200q", len(msg), utf8.ValidString(msg), msg)
			}
			return
		}
		if !jobIDPattern.MatchString(b.JobID) || b.Template.SourceImageRef == "" {
			t.Fatalf("ParseBuild accepted job %q, source %q", b.JobID, b.Template.SourceImageRef)
		}
		if (b.EnvdData == nil) != (b.EnvdSHA == "") {
			t.Fatalf("ParseBuild: %d envd bytes but EnvdSHA %q", len(b.EnvdData), b.EnvdSHA)
		}
		again, err := json.Marshal(b.BuildRequest)
		if err != nil {
			t.Fatalf("encode parsed request: %v", err)
		}
		b2, err := ParseBuild(again)
		if err != nil {
			t.Fatalf("ParseBuild of the re-encoded request %s: %v", again, err)
		}
		if b2.JobID != b.JobID || b2.DownloadBaseURL != b.DownloadBaseURL || b2.EnvdSHA != b.EnvdSHA || !bytes.Equal(b2.EnvdData, b.EnvdData) {
			t.Fatalf("round trip changed the build: %+v then %+v", b.BuildRequest, b2.BuildRequest)
		}
		t1, err1 := json.Marshal(b.Template)
		t2, err2 := json.Marshal(b2.Template)
		if err1 != nil || err2 != nil || !bytes.Equal(t1, t2) {
			t.Fatalf("round trip changed the template: %s (%v) then %s (%v)", t1, err1, t2, err2)
		}
		f1, err1 := Fingerprint(&b.Template, "d", "", b.EnvdSHA)
		f2, err2 := Fingerprint(&b2.Template, "d", "", b2.EnvdSHA)
		if err1 != nil || err2 != nil || f1 != f2 {
			t.Fatalf("round trip changed the fingerprint: %s (%v) then %s (%v)", f1, err1, f2, err2)
		}
	})
}
