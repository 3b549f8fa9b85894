package helmchart

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/cubesandbox/cubetemplatecenter/test/promrules"
)

// The alert rules and the dashboard exist once, under packaging/; the
// chart carries identical copies in files/, because a chart can read only
// its own files (a symlink would work, but helm warns about it on every
// command).
var chartCopies = map[string]string{
	"../../packaging/prometheus/cube-templatecenter-rules.yml": chartDir + "/files/prometheus-rules.yml",
	"../../packaging/grafana/cube-templatecenter.json":         chartDir + "/files/grafana-dashboard.json",
}

const (
	rulesSource     = "../../packaging/prometheus/cube-templatecenter-rules.yml"
	dashboardSource = "../../packaging/grafana/cube-templatecenter.json"
	// sourceJob is the scrape job the packaged rules select TC's targets by.
	sourceJob = `job="cube-templatecenter"`
)

// prometheusRule is the part of the Prometheus Operator's
// monitoring.coreos.com/v1 PrometheusRule the chart renders, with the
// operator's field names (k8s.io/api does not have the type).
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              promrules.File `json:"spec"`
}

// promtoolCheck runs promtool check rules on f, as Prometheus would load
// the PrometheusRule the operator turns into a rules file.
func promtoolCheck(t testing.TB, f promrules.File) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found: install Debian's prometheus package (make deps)")
	}
	data, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the rendered rules: %v\n%s", err, out)
	}
}

func diffJSON(t testing.TB, got, want any) string {
	t.Helper()
	g, _ := json.MarshalIndent(got, "", " ")
	w, _ := json.MarshalIndent(want, "", " ")
	return "got:\n" + string(g) + "\nwant:\n" + string(w)
}

// TestChartCopiesMatch: the chart's copies of the rules and the dashboard
// are the packaged files, byte for byte.
func TestChartCopiesMatch(t *testing.T) {
	for src, dst := range chartCopies {
		a, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: the chart renders its copy; run cp %s %s", dst, src,
				strings.TrimPrefix(src, "../../"), strings.TrimPrefix(dst, "../../"))
		}
	}
}

// TestPrometheusRule: with prometheusRule.enabled the chart renders the
// packaged rules, unchanged but for the scrape job, which defaults to the
// Service's name (the ServiceMonitor's job label); the overrides change
// exactly what they name, and the result is still valid for Prometheus.
func TestPrometheusRule(t *testing.T) {
	src := promrules.Load(t, rulesSource)
	if m := render(t); len(m.prometheusRules) != 0 {
		t.Errorf("a PrometheusRule rendered by default: it needs the operator's CRDs")
	}

	t.Run("SameRules", func(t *testing.T) {
		m := render(t, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.job=cube-templatecenter",
			"--set", "prometheusRule.labels.release=prometheus")
		pr := one(t, "PrometheusRules", m.prometheusRules)
		if pr.Name != fullname || pr.Labels["release"] != "prometheus" || pr.Labels["app.kubernetes.io/name"] != "cube-templatecenter" {
			t.Errorf("PrometheusRule %s labels %v, want %s with release=prometheus and the chart's labels", pr.Name, pr.Labels, fullname)
		}
		if !reflect.DeepEqual(pr.Spec, src) {
			t.Errorf("rendered rules differ from %s\n%s", rulesSource, diffJSON(t, pr.Spec, src))
		}
	})

	t.Run("JobOfTheServiceMonitor", func(t *testing.T) {
		m := render(t, "--set", "prometheusRule.enabled=true", "--set", "serviceMonitor.enabled=true")
		pr := one(t, "PrometheusRules", m.prometheusRules)
		// The ServiceMonitor's targets get the Service's name as job.
		if sm := one(t, "ServiceMonitors", m.serviceMonitors); sm.Spec.Selector.MatchLabels["cube-templatecenter/service"] != "http" {
			t.Fatalf("ServiceMonitor selector %v", sm.Spec.Selector)
		}
		want := promrules.Load(t, rulesSource)
		n := 0
		for gi := range want.Groups {
			for ri := range want.Groups[gi].Rules {
				r := &want.Groups[gi].Rules[ri]
				if strings.Contains(r.Expr, sourceJob) {
					r.Expr = strings.ReplaceAll(r.Expr, sourceJob, `job="`+fullname+`"`)
					n++
				}
			}
		}
		if n != 2 {
			t.Errorf("%d rules select %s, want 2 (TemplateCenterDown, TemplateCenterAbsent)", n, sourceJob)
		}
		if !reflect.DeepEqual(pr.Spec, want) {
			t.Errorf("rendered rules differ from %s with job %s\n%s", rulesSource, fullname, diffJSON(t, pr.Spec, want))
		}
		promtoolCheck(t, pr.Spec)
	})

	t.Run("Overrides", func(t *testing.T) {
		m := render(t, "--set", "prometheusRule.enabled=true",
			"--set", "prometheusRule.alerts.TemplateCenterBuildsSlow.threshold=3600",
			"--set", "prometheusRule.alerts.TemplateCenterBuildsSlow.for=30m",
			"--set", "prometheusRule.alerts.TemplateCenterBuildFailuresHigh.threshold=0.5",
			"--set", "prometheusRule.alerts.TemplateCenterVolumeFillingUp.threshold=86400",
			"--set", "prometheusRule.alerts.TemplateCenterQueueStalled.severity=warning",
			"--set", "prometheusRule.alerts.TemplateCenterRedisUnreachable.disabled=true",
			"--set", "prometheusRule.alertLabels.team=cube",
			"--set", "prometheusRule.alertLabels.severity=page",
			"--set", "prometheusRule.runbookBaseURL=https://wiki.example/tc/runbooks")
		got := one(t, "PrometheusRules", m.prometheusRules).Spec
		if got.Count() != src.Count()-1 {
			t.Errorf("%d rules rendered, want %d (one disabled)", got.Count(), src.Count()-1)
		}
		for _, g := range got.Groups {
			for _, r := range g.Rules {
				if r.Alert == "TemplateCenterRedisUnreachable" {
					t.Error("TemplateCenterRedisUnreachable rendered, though disabled")
				}
				if r.Labels["team"] != "cube" {
					t.Errorf("%s labels %v, want team=cube", r.Alert, r.Labels)
				}
				if r.Labels["severity"] == "page" {
					t.Errorf("%s: alertLabels' severity won over the alert's own", r.Alert)
				}
				if want := "https://wiki.example/tc/runbooks#" + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
					t.Errorf("%s runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
				}
			}
		}
		for name, want := range map[string]string{
			"TemplateCenterBuildsSlow":        strings.Replace(strings.TrimSpace(src.Alert(t, "TemplateCenterBuildsSlow").Expr), "> 1800", "> 3600", 1),
			"TemplateCenterBuildFailuresHigh": strings.Replace(strings.TrimSpace(src.Alert(t, "TemplateCenterBuildFailuresHigh").Expr), "> 0.25", "> 0.5", 1),
			"TemplateCenterVolumeFillingUp":   strings.Replace(strings.TrimSpace(src.Alert(t, "TemplateCenterVolumeFillingUp").Expr), "< 14400", "< 86400", 1),
			"TemplateCenterSpoolUnhealthy":    src.Alert(t, "TemplateCenterSpoolUnhealthy").Expr,
		} {
			if e := got.Alert(t, name).Expr; e != want {
				t.Errorf("%s expr:\n%s\nwant:\n%s", name, e, want)
			}
		}
		if f := got.Alert(t, "TemplateCenterBuildsSlow").For; f != "30m" {
			t.Errorf("TemplateCenterBuildsSlow for %q, want 30m", f)
		}
		if s := got.Alert(t, "TemplateCenterQueueStalled").Labels["severity"]; s != "warning" {
			t.Errorf("TemplateCenterQueueStalled severity %q, want warning", s)
		}
		promtoolCheck(t, got)
	})

	t.Run("Refused", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			want string
		}{
			{"UnknownAlert", []string{"--set", "prometheusRule.alerts.TemplateCenterBuildSlow.for=1m"},
				"prometheusRule.alerts.TemplateCenterBuildSlow: no such alert"},
			{"ThresholdWithoutComparison", []string{"--set", "prometheusRule.alerts.TemplateCenterAbsent.threshold=1"},
				"prometheusRule.alerts.TemplateCenterAbsent.threshold: the alert's expression ends with no comparison"},
			{"ThresholdNotANumber", []string{"--set", "prometheusRule.alerts.TemplateCenterBuildsSlow.threshold=1h"},
				"/prometheusRule/alerts/TemplateCenterBuildsSlow/threshold"},
			{"BadFor", []string{"--set", "prometheusRule.alerts.TemplateCenterDown.for=soon"}, "/prometheusRule/alerts/TemplateCenterDown/for"},
			{"UnknownOverride", []string{"--set", "prometheusRule.alerts.TemplateCenterDown.treshold=1"}, "treshold"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				args := append([]string{"template", release, chartDir, "--kube-version", kubeVersion, "--set", "prometheusRule.enabled=true"}, tc.args...)
				_, stderr, err := helm(t, args...)
				if err == nil || !strings.Contains(stderr, tc.want) {
					t.Errorf("helm template %v: %v, stderr %q; want an error containing %q", tc.args, err, stderr, tc.want)
				}
			})
		}
	})

	t.Run("StrictDecoding", func(t *testing.T) {
		out, stderr, err := helm(t, "template", release, chartDir, "--kube-version", kubeVersion,
			"--set", "prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml")
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, stderr)
		}
		if _, err := decodeAll(out); err != nil {
			t.Fatalf("the rendered PrometheusRule does not decode: %v", err)
		}
		bad := strings.Replace(out, "annotations:", "anotations:", 1)
		if _, err := decodeAll(bad); err == nil || !strings.Contains(err.Error(), "anotations") {
			t.Errorf("a misspelt rule field decoded: %v", err)
		}
	})
}

// TestGrafanaDashboard: with grafanaDashboard.enabled the chart renders a
// ConfigMap carrying the sidecar's label and the packaged dashboard as is.
func TestGrafanaDashboard(t *testing.T) {
	if m := render(t); len(m.configMaps) != 1 {
		t.Errorf("%d ConfigMaps rendered by default, want only conf.yaml's", len(m.configMaps))
	}
	m := render(t, "--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.annotations.grafana_folder=Cube")
	var dash *corev1.ConfigMap
	for _, cm := range m.configMaps {
		if _, ok := cm.Data["conf.yaml"]; ok {
			continue
		}
		if dash != nil {
			t.Fatalf("ConfigMaps %s and %s rendered for the dashboard, want one", dash.Name, cm.Name)
		}
		dash = cm
	}
	if dash == nil {
		t.Fatal("no dashboard ConfigMap rendered")
	}
	if dash.Name != fullname+"-dashboard" {
		t.Errorf("dashboard ConfigMap %q, want %s-dashboard", dash.Name, fullname)
	}
	if dash.Labels["grafana_dashboard"] != "1" || dash.Labels["app.kubernetes.io/instance"] != release {
		t.Errorf("dashboard ConfigMap labels %v, want grafana_dashboard=1 and the chart's", dash.Labels)
	}
	if dash.Annotations["grafana_folder"] != "Cube" {
		t.Errorf("dashboard ConfigMap annotations %v, want grafana_folder=Cube", dash.Annotations)
	}
	got, ok := dash.Data["cube-templatecenter.json"]
	if !ok || len(dash.Data) != 1 {
		t.Errorf("dashboard ConfigMap keys %d, want cube-templatecenter.json alone", len(dash.Data))
	}
	want, err := os.ReadFile(dashboardSource)
	if err != nil {
		t.Fatal(err)
	}
	if got != strings.TrimSpace(string(want)) {
		t.Errorf("the ConfigMap's cube-templatecenter.json differs from %s", dashboardSource)
	}
	if !json.Valid([]byte(got)) {
		t.Error("the ConfigMap's dashboard is not valid JSON")
	}
}
