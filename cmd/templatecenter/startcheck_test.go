package main

import (
	"archive/tar"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// noPythonImage runs python3, which it does not hold: a template that
// builds and then cannot start.
func noPythonImage(t testing.TB) v1.Image {
	t.Helper()
	return images.New(t, images.Config{Config: v1.Config{Cmd: []string{"python3", "app.py"}, Env: []string{"PATH=/usr/bin:/bin"}}},
		images.Layer{Tar: layerTar(t,
			tarFile{name: "usr/", typ: tar.TypeDir, mode: 0o755},
			tarFile{name: "usr/bin/", typ: tar.TypeDir, mode: 0o755},
			tarFile{name: "usr/bin/env", typ: tar.TypeReg, mode: 0o755, body: string(images.StaticELF(runtime.GOARCH, 4096))},
			tarFile{name: "bin", typ: tar.TypeSymlink, mode: 0o777, link: "usr/bin"},
			tarFile{name: "app.py", typ: tar.TypeReg, mode: 0o644, body: "print('hi')\n"},
		)})
}

// templateCheck is the template_check of a report or of build's output.
type templateCheck struct {
	Result      string   `json:"result"`
	Command     []string `json:"command"`
	Resolved    string   `json:"resolved"`
	Interpreter string   `json:"interpreter"`
	Problems    []string `json:"problems"`
}

// checkOf decodes the template_check of a report body; ok is false when
// it has none.
func checkOf(t testing.TB, body map[string]any) (templateCheck, bool) {
	t.Helper()
	raw, ok := body["template_check"]
	if !ok {
		return templateCheck{}, false
	}
	data, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	var c templateCheck
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("template_check %s: %v", data, err)
	}
	return c, true
}

// submitWith posts a build of image with extra template fields.
func submitWith(t *testing.T, base, jobID, image string, template map[string]any) {
	t.Helper()
	template["with_cube_ca"] = false
	body, err := json.Marshal(cubemaster.BuildRequest(jobID, image, template))
	if err != nil {
		t.Fatal(err)
	}
	if code, resp := call(t, "POST", base+"/tc/api/v1/build", testToken, body); code != 200 {
		t.Fatalf("submit %s = %d %v", jobID, code, resp)
	}
}

// TestStartCheckAgent builds through the agent: a template whose command
// runs reports template_check ok with what it resolved to; one whose
// command is missing, from the image or from container_overrides, ends
// FAILED in BUILDING_EXT4 naming the problem, and nothing is published;
// with CUBE_TEMPLATE_CENTER_START_CHECK=warn it builds and the problem
// rides in the report.
func TestStartCheckAgent(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	reg := images.StartRegistry(t, nil)
	good := reg.Push(t, "check/good:v1", cliImage(t))
	noPython := reg.Push(t, "check/nopython:v1", noPythonImage(t))
	h := newHarness(t, cm.URL(), testToken)
	h.set("registry.insecure", []string{reg.Host})
	agent := h.startAgent("agent (start check fail)")

	submitPlain(t, h.baseURL(), "check-good", good)
	cb := waitTerminal(t, cm, "check-good")
	c, ok := checkOf(t, cb.Body)
	if cb.Field("status") != "BUILT" || !ok || c.Result != "ok" || c.Resolved != "/bin/app" || c.Interpreter != "/bin/sh" ||
		!slices.Equal(c.Command, []string{"/bin/app", "--serve"}) {
		t.Errorf("good image: terminal report %v, want BUILT with template_check ok resolving /bin/app through /bin/sh", cb.Body)
	}

	submitPlain(t, h.baseURL(), "check-missing", noPython)
	cb = waitTerminal(t, cm, "check-missing")
	msg := cb.Field("error_message")
	if cb.Field("status") != "FAILED" || cb.Field("phase") != "BUILDING_EXT4" ||
		!strings.HasPrefix(msg, `template start check: command "python3" not found on PATH=/usr/bin:/bin`) {
		t.Errorf("image without its command: terminal report %v, want FAILED in BUILDING_EXT4 naming python3 and the PATH", cb.Body)
	}

	submitWith(t, h.baseURL(), "check-override", good, map[string]any{
		"container_overrides": map[string]any{"command": []string{"/opt/missing"}}})
	cb = waitTerminal(t, cm, "check-override")
	if msg := cb.Field("error_message"); cb.Field("status") != "FAILED" || !strings.HasPrefix(msg, "template start check: ") ||
		!strings.Contains(msg, "/opt/missing") {
		t.Errorf("override naming a missing command: terminal report %v, want FAILED naming /opt/missing", cb.Body)
	}
	for _, r := range []struct {
		result string
		want   float64
	}{{"ok", 1}, {"failed", 2}, {"warnings", 0}, {"no_command", 0}} {
		name := `cube_templatecenter_build_start_checks_total{result="` + r.result + `"}`
		if v, err := scrapeMetric(h.baseURL(), name); err != nil || v != r.want {
			t.Errorf("%s = %v (%v), want %v", name, v, err, r.want)
		}
	}
	// A reuse reports the check recorded with the artifact.
	submitPlain(t, h.baseURL(), "check-good-again", good)
	cb = waitTerminal(t, cm, "check-good-again")
	if c, ok := checkOf(t, cb.Body); cb.Field("status") != "BUILT" || !ok || c.Result != "ok" || c.Resolved != "/bin/app" {
		t.Errorf("reuse: terminal report %v, want BUILT with the recorded template_check", cb.Body)
	}
	entries, _ := os.ReadDir(filepath.Join(h.dir, "store"))
	if len(entries) != 1 {
		t.Errorf("store holds %d artifacts, want only the good image's", len(entries))
	}
	agent.stop(t)

	// warn, from the environment over the file's default.
	agent = h.startAgent("agent (start check warn)", "CUBE_TEMPLATE_CENTER_START_CHECK=warn")
	submitPlain(t, h.baseURL(), "check-warn", noPython)
	cb = waitTerminal(t, cm, "check-warn")
	c, ok = checkOf(t, cb.Body)
	if cb.Field("status") != "BUILT" || !ok || c.Result != "failed" || len(c.Problems) == 0 ||
		!strings.Contains(c.Problems[0], `"python3" not found`) {
		t.Errorf("warn: terminal report %v, want BUILT with the problem in template_check", cb.Body)
	}
	agent.stop(t)

	// Back to fail: the artifact built under warn is not reported BUILT.
	agent = h.startAgent("agent (start check fail again)")
	submitPlain(t, h.baseURL(), "check-reuse-failed", noPython)
	cb = waitTerminal(t, cm, "check-reuse-failed")
	if cb.Field("status") != "FAILED" || !strings.HasPrefix(cb.Field("error_message"), "template start check: ") {
		t.Errorf("reuse of an artifact whose check failed, under fail: terminal report %v, want FAILED", cb.Body)
	}
	// Reused, not rebuilt: this agent ran no check.
	if v, err := scrapeMetric(h.baseURL(), `cube_templatecenter_build_start_checks_total{result="failed"}`); err != nil || v != 0 {
		t.Errorf("start checks failed = %v (%v), want 0: the recorded result decides", v, err)
	}
	agent.stop(t)
}

// TestStartCheckCLI: build prints the check and fails (exit 1, nothing
// written) on an image whose command cannot run, unless --start-check
// warn; inspect --check checks a built image with the flags' overrides.
func TestStartCheckCLI(t *testing.T) {
	t.Parallel()
	env := cliEnv(t)
	out, cache := filepath.Join(t.TempDir(), "out"), filepath.Join(t.TempDir(), "cache")
	good := "oci-layout:" + writeLayout(t, cliImage(t), "v1") + ":v1"
	bad := "oci-layout:" + writeLayout(t, noPythonImage(t), "v1") + ":v1"

	res := runCLI(t, env, "build", "--image", good, "--no-ca", "--out", out, "--cache", cache)
	got := decodeBuild(t, res, out)
	var printed struct {
		TemplateCheck templateCheck `json:"template_check"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &printed); err != nil || printed.TemplateCheck.Result != "ok" || printed.TemplateCheck.Resolved != "/bin/app" {
		t.Errorf("build printed template_check %+v (%v), want ok resolving /bin/app", printed.TemplateCheck, err)
	}

	badOut := filepath.Join(t.TempDir(), "out")
	res = runCLI(t, env, "build", "--image", bad, "--no-ca", "--out", badOut, "--cache", cache)
	if res.code != 1 || !strings.Contains(res.stderr, `template start check: command "python3" not found`) {
		t.Errorf("build of an image without its command = exit %d, stderr %q; want exit 1 naming the problem", res.code, res.stderr)
	}
	if err := json.Unmarshal([]byte(res.stdout), &printed); err != nil || printed.TemplateCheck.Result != "failed" {
		t.Errorf("failed build printed %q (%v), want its template_check", res.stdout, err)
	}
	if entries, _ := os.ReadDir(badOut); len(entries) != 0 {
		t.Errorf("the output directory holds %v after a failed check", entries)
	}
	res = runCLI(t, env, "build", "--image", bad, "--no-ca", "--out", badOut, "--cache", cache, "--start-check", "warn")
	warned := decodeBuild(t, res, badOut)
	if err := json.Unmarshal([]byte(res.stdout), &printed); err != nil || printed.TemplateCheck.Result != "failed" || len(printed.TemplateCheck.Problems) == 0 {
		t.Errorf("--start-check warn printed template_check %+v (%v), want the problem", printed.TemplateCheck, err)
	}
	res = runCLI(t, env, "build", "--image", bad, "--no-ca", "--out", badOut, "--cache", cache, "--start-check", "off")
	if res.code != 0 || strings.Contains(res.stdout, "template_check") {
		t.Errorf("--start-check off = exit %d, %q; want a build without template_check", res.code, res.stdout)
	}

	cfgFile := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfgFile, []byte(`{"Entrypoint":["/bin/app"],"Cmd":["--serve"],"User":"1000"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		args  []string
		code  int
		want  string
		image string
	}{
		{"NoCommand", nil, 0, `"result": "no_command"`, got.Ext4Path},
		{"ImageConfig", []string{"--image-config", cfgFile}, 0, `"resolved": "/bin/app"`, got.Ext4Path},
		{"Command", []string{"--command", "app --serve", "--env", "PATH=/bin"}, 0, `"resolved": "/bin/app"`, got.Ext4Path},
		{"CommandJSON", []string{"--command", `["/bin/sh","-c","x y"]`}, 0, `"result": "ok"`, got.Ext4Path},
		{"NotOnPath", []string{"--command", "app", "--env", "PATH=/usr/bin"}, 1, `not found on PATH=/usr/bin`, got.Ext4Path},
		{"Workdir", []string{"--command", "./app", "--workdir", "/bin"}, 0, `"resolved": "/bin/app"`, got.Ext4Path},
		{"UnknownUser", []string{"--command", "/bin/app", "--user", "nobody"}, 1, `nobody`, got.Ext4Path},
		{"OtherArch", []string{"--command", "/bin/sh", "--arch", otherArch()}, 1, `"result": "failed"`, got.Ext4Path},
		{"WarnedImage", []string{"--command", "python3", "--env", "PATH=/usr/bin:/bin"}, 1, `"python3" not found`, warned.Ext4Path},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := runCLI(t, env, append(append([]string{"inspect", "--check"}, c.args...), c.image)...)
			if res.code != c.code || !strings.Contains(res.stdout+res.stderr, c.want) {
				t.Errorf("inspect --check %v = exit %d, %s%s; want exit %d and %q", c.args, res.code, res.stdout, res.stderr, c.code, c.want)
			}
		})
	}
	for _, args := range [][]string{
		{"inspect", "--command", "x", got.Ext4Path},
		{"inspect", "--check", got.Ext4Path, "/etc"},
		{"inspect", "--check", "--env", "NOEQUALS", got.Ext4Path},
		{"build", "--image", good, "--start-check", "maybe"},
	} {
		if res := runCLI(t, env, args...); res.code != 2 {
			t.Errorf("templatecenter %s = exit %d, stderr %q; want 2", strings.Join(args, " "), res.code, res.stderr)
		}
	}
}

// otherArch is an architecture the test images are not built for.
func otherArch() string {
	if runtime.GOARCH == "arm64" {
		return "amd64"
	}
	return "arm64"
}
