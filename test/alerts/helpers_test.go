package alerts

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const (
	repoRoot      = "../.."
	rulesPath     = repoRoot + "/packaging/prometheus/cube-templatecenter-rules.yml"
	unitTestsPath = "testdata/rules_test.yml"
	installHint   = "install Debian's prometheus package (apt-get install prometheus, or make deps as root)"
)

// tool finds a program of the prometheus package on PATH; a missing one
// fails the test: the rules would otherwise go unchecked.
func tool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found on PATH: %s", name, installHint)
	}
	return p
}

// runTool runs a program and returns its combined output, failing the test
// when it exits non-zero.
func runTool(t testing.TB, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), tool(t, name), args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// decodeStrict decodes YAML, refusing unknown fields.
func decodeStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	return dec.Decode(v)
}
