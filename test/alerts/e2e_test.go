package alerts

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
	"github.com/cubesandbox/cubetemplatecenter/test/promrules"
	"github.com/cubesandbox/cubetemplatecenter/test/wait"
)

// testFor replaces every "for:" of the rules in the end-to-end test, and
// evalInterval is Prometheus' scrape and evaluation interval there.
const (
	testFor      = "5s"
	evalInterval = "1s"
	// scrapeJob is the job name the rules expect TC's targets under.
	scrapeJob = "cube-templatecenter"
)

// grafanaVars replaces the dashboard's variables as Grafana would: an
// instance regex and the rate interval.
func grafanaVars(expr, instanceRegex string) string {
	return strings.NewReplacer(`$instance`, instanceRegex, `$__rate_interval`, "1m", `$__interval`, "15s").Replace(expr)
}

// grafanaRegex escapes a variable's value as Grafana's Prometheus data
// source does for a regex matcher: regex metacharacters get a backslash,
// itself escaped for PromQL's double-quoted string.
func grafanaRegex(v string) string {
	return strings.ReplaceAll(regexp.QuoteMeta(v), `\`, `\\`)
}

// fastRules returns the rules file with every non-empty "for:" set to
// testFor, for a Prometheus that evaluates every second.
func fastRules(t testing.TB) []byte {
	t.Helper()
	f := promrules.Load(t, rulesPath)
	for gi := range f.Groups {
		for ri := range f.Groups[gi].Rules {
			if r := &f.Groups[gi].Rules[ri]; r.For != "" {
				r.For = testFor
			}
		}
	}
	out, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// prometheus is a running Prometheus server.
type prometheus struct {
	*child
	base string
}

// startPrometheus runs Prometheus with the rules, scraping the targets as
// job cube-templatecenter every second.
func startPrometheus(t testing.TB, rules []byte, targets ...string) *prometheus {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, dir, "rules.yml", rules)
	cfg := map[string]any{
		"global":     map[string]any{"scrape_interval": evalInterval, "scrape_timeout": evalInterval, "evaluation_interval": evalInterval},
		"rule_files": []string{"rules.yml"},
		"scrape_configs": []any{map[string]any{
			"job_name":       scrapeJob,
			"static_configs": []any{map[string]any{"targets": targets}},
		}},
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	confPath := writeFile(t, dir, "prometheus.yml", data)
	runTool(t, dir, "promtool", "check", "config", confPath)
	port := childproc.FreePort(t)
	p := &prometheus{base: "http://127.0.0.1:" + strconv.Itoa(port)}
	p.child = startChild(t, "prometheus", []string{"PATH=/usr/bin:/bin", "HOME=" + dir}, tool(t, "prometheus"),
		"--config.file="+confPath, "--storage.tsdb.path="+dir+"/data",
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port))
	p.waitHTTP(t, p.base+"/-/ready")
	return p
}

// api calls Prometheus' HTTP API and decodes data into out; it returns
// the error Prometheus answered, if any.
func (p *prometheus) api(t testing.TB, path string, params url.Values, out any) error {
	t.Helper()
	u := p.base + path
	if params != nil {
		u += "?" + params.Encode()
	}
	resp, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	var env struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("GET %s: %d %q: %v", path, resp.StatusCode, body, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", env.ErrorType, env.Error)
	}
	if out != nil {
		if err := json.Unmarshal(env.Data, out); err != nil {
			t.Fatalf("GET %s: decode %s: %v", path, env.Data, err)
		}
	}
	return nil
}

// query evaluates expr now.
func (p *prometheus) query(t testing.TB, expr string) ([]struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}, error) {
	t.Helper()
	var data struct {
		ResultType string `json:"resultType"`
		Result     json.RawMessage
	}
	if err := p.api(t, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	var vec []struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	if data.ResultType == "vector" {
		if err := json.Unmarshal(data.Result, &vec); err != nil {
			t.Fatalf("query %q: %v", expr, err)
		}
	}
	return vec, nil
}

// activeAlert is one alert of /api/v1/alerts.
type activeAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	Value       string            `json:"value"`
}

func (p *prometheus) alerts(t testing.TB) []activeAlert {
	t.Helper()
	var data struct {
		Alerts []activeAlert `json:"alerts"`
	}
	if err := p.api(t, "/api/v1/alerts", nil, &data); err != nil {
		t.Fatalf("GET /api/v1/alerts: %v", err)
	}
	return data.Alerts
}

// TestEndToEnd runs a real Prometheus with the rules (their "for:"
// shortened) scraping a real agent whose CubeMaster is unreachable. Every
// rule loads and evaluates without error on the agent's series; the
// report backlog alert is quiet while the outbox is empty, and once a job's
// final report cannot be delivered it goes pending, then firing, with the
// agent's labels and its annotations expanded. Every panel query of the
// dashboard, and its instance variable, is accepted by the same
// Prometheus.
func TestEndToEnd(t *testing.T) {
	const alertName = "TemplateCenterReportsUndelivered"
	master := "http://127.0.0.1:" + strconv.Itoa(childproc.FreePort(t)) // nothing listens
	a := startAgent(t, "agent", master, nil)
	p := startPrometheus(t, fastRules(t), a.target())

	wait.For(t, "Prometheus scraping the agent", func() bool {
		v, err := p.query(t, `up{job="`+scrapeJob+`"} == 1`)
		return err == nil && len(v) == 1 && v[0].Metric["instance"] == a.target()
	})

	// Every rule is loaded and evaluates on real series without error.
	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Name      string `json:"name"`
				Type      string `json:"type"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	want := len(promrules.Load(t, rulesPath).Alerts())
	wait.For(t, "every rule evaluated", func() bool {
		if err := p.api(t, "/api/v1/rules", url.Values{"type": {"alert"}}, &rules); err != nil {
			t.Fatalf("GET /api/v1/rules: %v", err)
		}
		n := 0
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				if r.Health == "ok" {
					n++
				}
			}
		}
		return n == want
	})
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Health != "ok" || r.LastError != "" {
				t.Errorf("rule %s: health %s, %s", r.Name, r.Health, r.LastError)
			}
		}
	}

	// Nothing to deliver yet: a few rounds without the alert.
	time.Sleep(3 * time.Second)
	for _, al := range p.alerts(t) {
		if al.Labels["alertname"] == alertName {
			t.Fatalf("%s is %s before any report waits: %+v", alertName, al.State, al)
		}
	}

	a.submit(t, "alerts-e2e-1", unreachableImage)
	var states []string
	var firing activeAlert
	wait.For(t, alertName+" firing", func() bool {
		for _, al := range p.alerts(t) {
			if al.Labels["alertname"] != alertName {
				continue
			}
			if len(states) == 0 || states[len(states)-1] != al.State {
				states = append(states, al.State)
			}
			if al.State == "firing" {
				firing = al
				return true
			}
		}
		return false
	})
	if strings.Join(states, ",") != "pending,firing" {
		t.Errorf("%s went through states %q, want pending then firing", alertName, states)
	}
	for k, v := range map[string]string{"instance": a.target(), "job": scrapeJob, "severity": "critical"} {
		if firing.Labels[k] != v {
			t.Errorf("firing alert label %s = %q, want %q (labels %v)", k, firing.Labels[k], v, firing.Labels)
		}
	}
	if d := firing.Annotations["description"]; !regexp.MustCompile(`^Status reports wait on ` + regexp.QuoteMeta(a.target()) + ` \([1-9][0-9]* in the outbox\) `).MatchString(d) {
		t.Errorf("description %q, want the waiting reports and the instance", d)
	}
	if u := firing.Annotations["runbook_url"]; u != runbookBase+"#"+strings.ToLower(alertName) {
		t.Errorf("runbook_url %q", u)
	}

	// The dashboard's queries, as Grafana sends them with one instance
	// and with all of them selected.
	d := loadDashboard(t)
	one := grafanaRegex(a.target())
	for _, inst := range []string{one, "(" + one + "|" + grafanaRegex("other:8090") + ")"} {
		for _, q := range d.queries() {
			if _, err := p.query(t, grafanaVars(q.raw, inst)); err != nil {
				t.Errorf("panel %q query %s: Prometheus refuses %q: %v", q.panel, q.ref, grafanaVars(q.raw, inst), err)
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var values []string
		if err := p.api(t, "/api/v1/label/instance/values", url.Values{"match[]": {labelValuesMetric(t, v)}}, &values); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		if len(values) != 1 || values[0] != a.target() {
			t.Errorf("variable %s offers %q, want [%s]", v.Name, values, a.target())
		}
	}
	// The backlog panel shows the waiting reports.
	for _, q := range d.queries() {
		if !strings.Contains(q.raw, "cube_templatecenter_outbox_depth") {
			continue
		}
		v, err := p.query(t, grafanaVars(q.raw, one))
		if err != nil || len(v) != 1 || v[0].Value[1] == "0" {
			t.Errorf("panel %q query %s: %v %v, want the agent's waiting reports", q.panel, q.ref, v, err)
		}
	}
}
