package alerts

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/promrules"
)

const (
	// runbookBase is where every runbook_url points, with the alert's
	// anchor after it.
	runbookBase       = "https://github.com/cubesandbox/cubetemplatecenter/blob/main/docs/operations.md"
	observabilityPath = repoRoot + "/docs/observability.md"
	operationsPath    = repoRoot + "/docs/operations.md"
)

// severities are the values of the severity label, as the
// Prometheus Operator's and kube-prometheus' mixins use them.
var severities = []string{"critical", "warning"}

// thresholdRE finds the threshold of an alert: the number its expression
// ends comparing with. The chart's prometheusRule.alerts.*.threshold
// replaces the same number.
var thresholdRE = regexp.MustCompile(`(==|!=|>=|<=|>|<)\s*([-+]?[0-9][0-9.]*(?:[eE][-+]?[0-9]+)?)\s*$`)

// threshold returns the final comparison of expr ("> 1800"), or "" when
// it ends with none.
func threshold(expr string) string {
	m := thresholdRE.FindStringSubmatch(expr)
	if m == nil {
		return ""
	}
	return m[1] + " " + m[2]
}

// unitTests is the promtool test rules file.
type unitTests struct {
	RuleFiles          []string `yaml:"rule_files"`
	EvaluationInterval string   `yaml:"evaluation_interval"`
	Tests              []struct {
		Interval    string `yaml:"interval"`
		InputSeries []struct {
			Series string `yaml:"series"`
			Values string `yaml:"values"`
		} `yaml:"input_series"`
		AlertRuleTests []struct {
			EvalTime  string `yaml:"eval_time"`
			Alertname string `yaml:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `yaml:"exp_labels"`
				ExpAnnotations map[string]string `yaml:"exp_annotations"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func loadUnitTests(t testing.TB) unitTests {
	t.Helper()
	data, err := os.ReadFile(unitTestsPath)
	if err != nil {
		t.Fatal(err)
	}
	var u unitTests
	if err := decodeStrict(data, &u); err != nil {
		t.Fatalf("%s: %v", unitTestsPath, err)
	}
	return u
}

// TestPromtoolCheckRules: the file is valid for Prometheus (syntax, every
// expression parses, templates compile) and promtool's linter finds
// nothing.
func TestPromtoolCheckRules(t *testing.T) {
	out := runTool(t, "", "promtool", "check", "rules", rulesPath)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules: %s", out)
	}
	if len(promrules.Load(t, rulesPath).Alerts()) == 0 {
		t.Fatal("no alerts in the rules file")
	}
}

// TestPromtoolUnitTests runs the alerts' unit tests: each fires, or not, on
// synthetic series with the labels and the expanded annotations expected.
func TestPromtoolUnitTests(t *testing.T) {
	out := runTool(t, "testdata", "promtool", "test", "rules", "rules_test.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: %s", out)
	}
}

// TestEveryAlertUnitTested: the unit tests read the packaged file, and each
// alert has a case where it fires and one where it does not.
func TestEveryAlertUnitTested(t *testing.T) {
	u := loadUnitTests(t)
	if !slices.Equal(u.RuleFiles, []string{"../../../packaging/prometheus/cube-templatecenter-rules.yml"}) {
		t.Errorf("unit tests read %q, want the packaged rules file", u.RuleFiles)
	}
	firing, quiet := map[string]int{}, map[string]int{}
	for _, tc := range u.Tests {
		for _, art := range tc.AlertRuleTests {
			if len(art.ExpAlerts) > 0 {
				firing[art.Alertname]++
			} else {
				quiet[art.Alertname]++
			}
		}
	}
	var names []string
	for _, a := range promrules.Load(t, rulesPath).Alerts() {
		names = append(names, a.Alert)
		if firing[a.Alert] == 0 {
			t.Errorf("%s: no unit test where it fires", a.Alert)
		}
		if quiet[a.Alert] == 0 {
			t.Errorf("%s: no unit test where it does not fire", a.Alert)
		}
	}
	for name := range firing {
		if !slices.Contains(names, name) {
			t.Errorf("unit tests name an alert the rules do not have: %s", name)
		}
	}
}

// TestAlertAnnotations: every alert has a severity, a summary, a
// description naming the labels that tell its alerts apart, and a
// runbook_url into docs/operations.md.
func TestAlertAnnotations(t *testing.T) {
	// The labels each alert fires with, from its unit tests.
	labels := map[string][]string{}
	for _, tc := range loadUnitTests(t).Tests {
		for _, art := range tc.AlertRuleTests {
			for _, e := range art.ExpAlerts {
				for k := range e.ExpLabels {
					if !slices.Contains(labels[art.Alertname], k) {
						labels[art.Alertname] = append(labels[art.Alertname], k)
					}
				}
			}
		}
	}
	seen := map[string]bool{}
	for _, a := range promrules.Load(t, rulesPath).Alerts() {
		if seen[a.Alert] {
			t.Errorf("%s: defined twice", a.Alert)
		}
		seen[a.Alert] = true
		if !regexp.MustCompile(`^TemplateCenter[A-Z][A-Za-z]+$`).MatchString(a.Alert) {
			t.Errorf("%s: alert names start with TemplateCenter, in CamelCase", a.Alert)
		}
		if !slices.Contains(severities, a.Labels["severity"]) {
			t.Errorf("%s: severity %q, want one of %q", a.Alert, a.Labels["severity"], severities)
		}
		for _, k := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(a.Annotations[k]) == "" {
				t.Errorf("%s: no %s annotation", a.Alert, k)
			}
		}
		for k := range a.Annotations {
			if !slices.Contains([]string{"summary", "description", "runbook_url"}, k) {
				t.Errorf("%s: annotation %s, want only summary, description and runbook_url", a.Alert, k)
			}
		}
		if want := runbookBase + "#" + strings.ToLower(a.Alert); a.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", a.Alert, a.Annotations["runbook_url"], want)
		}
		desc := a.Annotations["description"]
		if !strings.Contains(desc, "$labels.") {
			t.Errorf("%s: description names no label: %q", a.Alert, desc)
		}
		for _, l := range labels[a.Alert] {
			if l == "severity" || l == "job" {
				continue
			}
			if !strings.Contains(desc, "$labels."+l) {
				t.Errorf("%s fires with label %s, which its description does not name: %q", a.Alert, l, desc)
			}
		}
	}
}

// section returns the lines of the markdown section headed by heading (its
// level's "#"s included), up to the next heading of the same or a higher
// level.
func section(t testing.TB, doc, heading string) []string {
	t.Helper()
	level := strings.Index(heading, " ")
	var out []string
	in := false
	for line := range strings.Lines(doc) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "#") {
			l := strings.Index(line, " ")
			if in && l > 0 && l <= level && strings.Trim(line[:l], "#") == "" {
				break
			}
			if line == heading {
				in = true
				continue
			}
		}
		if in {
			out = append(out, line)
		}
	}
	if !in {
		t.Fatalf("no section %q", heading)
	}
	return out
}

// TestAlertsDocumented: docs/observability.md lists every alert with its
// severity, threshold and delay, and docs/operations.md has a runbook for
// each (what it means, how to confirm, how to fix) under the anchor its
// runbook_url names; neither lists an alert the rules lack.
func TestAlertsDocumented(t *testing.T) {
	obs, err := os.ReadFile(observabilityPath)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile(operationsPath)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range section(t, string(obs), "## Alerts") {
		m := regexp.MustCompile("^\\| \\[`(TemplateCenter[A-Za-z]+)`\\]\\(operations\\.md#([a-z]+)\\) \\|").FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if m[2] != strings.ToLower(m[1]) {
			t.Errorf("observability.md: %s links to #%s", m[1], m[2])
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows[m[1]] = cells
	}
	runbooks := section(t, string(ops), "## Runbooks")
	headings := map[string]string{}
	var current string
	for _, line := range runbooks {
		if name, ok := strings.CutPrefix(line, "### "); ok {
			current = name
			headings[current] = ""
			continue
		}
		if current != "" {
			headings[current] += line + "\n"
		}
	}

	alerts := promrules.Load(t, rulesPath).Alerts()
	var names []string
	for _, a := range alerts {
		names = append(names, a.Alert)
		cells, ok := rows[a.Alert]
		if !ok {
			t.Errorf("observability.md (Alerts): no row for %s", a.Alert)
		} else if len(cells) != 5 {
			t.Errorf("observability.md (Alerts): row of %s has %d cells, want 5 (alert, severity, fires when, threshold, for)", a.Alert, len(cells))
		} else {
			if cells[1] != a.Labels["severity"] {
				t.Errorf("observability.md: %s severity %q, the rule's is %q", a.Alert, cells[1], a.Labels["severity"])
			}
			wantFor := a.For
			if wantFor == "" {
				wantFor = "—"
			}
			if cells[4] != wantFor {
				t.Errorf("observability.md: %s for %q, the rule's is %q", a.Alert, cells[4], wantFor)
			}
			if th := threshold(a.Expr); th != "" && !strings.HasPrefix(cells[3], "`"+th+"`") {
				t.Errorf("observability.md: %s threshold %q, want it to start with `%s`", a.Alert, cells[3], th)
			} else if th == "" && cells[3] != "—" {
				t.Errorf("observability.md: %s threshold %q, want — (its expression ends with no comparison)", a.Alert, cells[3])
			}
		}
		body, ok := headings[a.Alert]
		if !ok {
			t.Errorf("operations.md (Runbooks): no \"### %s\"", a.Alert)
			continue
		}
		for _, part := range []string{"**Meaning.**", "**Confirm.**", "**Fix.**"} {
			if !strings.Contains(body, part) {
				t.Errorf("operations.md: the runbook of %s has no %s", a.Alert, part)
			}
		}
	}
	for name := range rows {
		if !slices.Contains(names, name) {
			t.Errorf("observability.md lists %s, which the rules lack", name)
		}
	}
	for name := range headings {
		if !slices.Contains(names, name) {
			t.Errorf("operations.md has a runbook %q for no alert of the rules", name)
		}
	}
}

func TestThreshold(t *testing.T) {
	for expr, want := range map[string]string{
		"up == 0":                    "== 0",
		"x > 0.25\n":                 "> 0.25",
		"(a) > 0 < 14400":            "< 14400",
		"a >= 1e+06":                 ">= 1e+06",
		`absent(up{job="x"})`:        "",
		"histogram_quantile(0.5, a)": "",
	} {
		if got := threshold(expr); got != want {
			t.Errorf("threshold(%q) = %q, want %q", expr, got, want)
		}
	}
}
