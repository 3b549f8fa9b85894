package alerts

import (
	"bytes"
	"os"
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

// ruleFile is a Prometheus rules file as rulefmt reads it.
type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval,omitempty"`
	Rules    []rule `yaml:"rules"`
}

type rule struct {
	Alert       string            `yaml:"alert,omitempty"`
	Record      string            `yaml:"record,omitempty"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// decodeStrict decodes YAML, refusing unknown fields.
func decodeStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// loadRules reads the packaged rules file.
func loadRules(t testing.TB) ruleFile {
	t.Helper()
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := decodeStrict(data, &f); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	return f
}

// alerts lists the alerting rules of f in file order.
func (f ruleFile) alerts() []rule {
	var out []rule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}
