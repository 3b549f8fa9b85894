package cubemaster

import (
	"encoding/json"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
)

// TestBuildRequestParses checks that the agent's own parser accepts the
// request and reads back its fields, extra template fields included.
func TestBuildRequestParses(t *testing.T) {
	body, err := json.Marshal(BuildRequest("job-1", "registry.test/app:v1", map[string]any{"template_id": "tpl-x", "registry_username": "u"}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := api.ParseBuild(body)
	if err != nil {
		t.Fatalf("ParseBuild: %v\n%s", err, body)
	}
	tr := b.Template
	if b.JobID != "job-1" || b.DownloadBaseURL != DownloadBaseURL || tr.RequestID != "req-job-1" ||
		tr.SourceImageRef != "registry.test/app:v1" || tr.TemplateID != "tpl-x" || tr.RegistryUsername != "u" ||
		tr.WritableLayerSize != "1Gi" || tr.InstanceType != "cubebox" || tr.NetworkType != "tap" {
		t.Errorf("ParseBuild = %+v, template %+v", b.BuildRequest, tr)
	}
}
