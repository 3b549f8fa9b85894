// Package promrules is a Prometheus rules file as the suites read it: the
// packaged alert rules (packaging/prometheus), and the spec of the
// PrometheusRule the Helm chart renders, which has the same shape.
package promrules

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"gopkg.in/yaml.v3"
)

// File is a rules file as Prometheus' rulefmt reads it. The JSON names
// are the PrometheusRule's, for manifests decoded as the API server does.
type File struct {
	Groups []Group `yaml:"groups" json:"groups"`
}

// Group is one rule group.
type Group struct {
	Name     string `yaml:"name" json:"name"`
	Interval string `yaml:"interval,omitempty" json:"interval,omitempty"`
	Rules    []Rule `yaml:"rules" json:"rules"`
}

// Rule is an alerting rule (Alert set) or a recording rule (Record set).
type Rule struct {
	Alert       string            `yaml:"alert,omitempty" json:"alert,omitempty"`
	Record      string            `yaml:"record,omitempty" json:"record,omitempty"`
	Expr        string            `yaml:"expr" json:"expr"`
	For         string            `yaml:"for,omitempty" json:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty" json:"annotations,omitempty"`
}

// Load reads the rules file at path, refusing a field rulefmt does not
// know, and fails tb when it cannot.
func Load(tb testing.TB, path string) File {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	f, err := parse(data)
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	return f
}

// parse decodes a rules file, refusing a field rulefmt does not know.
func parse(data []byte) (File, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return File{}, fmt.Errorf("decode rules: %w", err)
	}
	return f, nil
}

// Alerts lists the alerting rules in file order.
func (f File) Alerts() []Rule {
	var out []Rule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// Alert returns the alerting rule named name, failing tb when there is
// none.
func (f File) Alert(tb testing.TB, name string) Rule {
	tb.Helper()
	for _, r := range f.Alerts() {
		if r.Alert == name {
			return r
		}
	}
	tb.Fatalf("no alert %s", name)
	return Rule{}
}

// Count is how many rules, alerting and recording, the file holds.
func (f File) Count() int {
	n := 0
	for _, g := range f.Groups {
		n += len(g.Rules)
	}
	return n
}
