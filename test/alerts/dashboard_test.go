package alerts

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const dashboardPath = repoRoot + "/packaging/grafana/cube-templatecenter.json"

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	ID         any     `json:"id"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []templateVar `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr       string         `json:"expr"`
		RefID      string         `json:"refId"`
		Datasource map[string]any `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type templateVar struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Query      any            `json:"query"`
	Datasource map[string]any `json:"datasource"`
	AllValue   string         `json:"allValue"`
}

// loadDashboard reads the packaged dashboard.
func loadDashboard(t testing.TB) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// allPanels lists the panels of d, those inside collapsed rows included,
// rows left out.
func (d dashboard) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			out = append(out, p)
		}
	}
	walk(d.Panels)
	return out
}

// panelQuery is one query of a panel, as Prometheus would receive it once
// Grafana has put in its variables.
type panelQuery struct {
	panel, ref string
	// raw is the expression as the dashboard holds it.
	raw string
	// datasource is the query's data source reference.
	datasource map[string]any
}

func (d dashboard) queries() []panelQuery {
	var out []panelQuery
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			out = append(out, panelQuery{panel: p.Title, ref: tg.RefID, raw: tg.Expr, datasource: tg.Datasource})
		}
	}
	return out
}

// datasourceRef is how every panel and query names its data source: the
// dashboard's datasource variable, never a data source of one Grafana.
const datasourceRef = "${datasource}"

// instanceMatcher restricts a selector to the instances the instance
// variable selects.
const instanceMatcher = `instance=~"$instance"`

// labelValuesRE reads Grafana's label_values(METRIC, LABEL) query.
var labelValuesRE = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// labelValuesMetric returns the series selector of a label_values query
// variable.
func labelValuesMetric(t testing.TB, v templateVar) string {
	t.Helper()
	q, ok := v.Query.(string)
	if !ok {
		if m, isMap := v.Query.(map[string]any); isMap {
			q, _ = m["query"].(string)
		}
	}
	m := labelValuesRE.FindStringSubmatch(strings.TrimSpace(q))
	if m == nil {
		t.Fatalf("variable %s: query %v is not label_values(METRIC, LABEL)", v.Name, v.Query)
	}
	return m[1]
}

// dashboardSeries are the series the dashboard must show: builds by
// result, turnaround and phase histograms, the queue, the reporter
// backlog, the layer cache, transfers, every volume's space, replicas and
// locks, readiness per check.
var dashboardSeries = []string{
	"cube_templatecenter_jobs_finished_total",
	"cube_templatecenter_jobs_turnaround_seconds_bucket",
	"cube_templatecenter_build_phase_duration_seconds_bucket",
	"cube_templatecenter_queue_depth",
	"cube_templatecenter_jobs_running",
	"cube_templatecenter_jobs_queue_wait_seconds_bucket",
	"cube_templatecenter_outbox_depth",
	"cube_templatecenter_callback_attempts_total",
	"cube_templatecenter_layer_cache_requests_total",
	"cube_templatecenter_blobstore_upload_bytes_total",
	"cube_templatecenter_volume_free_bytes",
	"cube_templatecenter_volume_reserve_bytes",
	"cube_templatecenter_build_info",
	"cube_templatecenter_replica_lock_waits_total",
	"cube_templatecenter_replica_lock_wait_seconds_bucket",
	"cube_templatecenter_health_check_success",
}

// TestDashboardShape checks the dashboard's structure: the datasource and
// instance variables, every panel and query on the datasource variable,
// every selector filtered by instance, no names of one installation,
// unique panel ids on a 24-column grid without overlaps, and the series
// an operator needs.
func TestDashboardShape(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: want both", d.UID, d.Title)
	}
	if d.ID != nil {
		t.Errorf("id %v, want null: Grafana assigns ids on import", d.ID)
	}

	vars := map[string]templateVar{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if ds, ok := vars["datasource"]; !ok || ds.Type != "datasource" || ds.Query != "prometheus" {
		t.Errorf("variable datasource = %+v, want a datasource variable of type prometheus", ds)
	}
	inst, ok := vars["instance"]
	switch {
	case !ok || inst.Type != "query":
		t.Errorf("variable instance = %+v, want a query variable", inst)
	case inst.Datasource["uid"] != datasourceRef:
		t.Errorf("variable instance reads data source %v, want %s", inst.Datasource, datasourceRef)
	case labelValuesMetric(t, inst) != "cube_templatecenter_build_info":
		t.Errorf("variable instance: %v, want the instances of cube_templatecenter_build_info", inst.Query)
	case inst.AllValue != "":
		// "All" must expand to the instances found, not to a regex that
		// would select every target of the Prometheus (up).
		t.Errorf("variable instance: allValue %q, want none", inst.AllValue)
	}

	// Names of one installation: a data source uid, a job, a host.
	for _, bad := range []string{"job=", `"uid": "P`, "localhost", "127.0.0.1"} {
		if strings.Contains(string(raw), bad) {
			t.Errorf("the dashboard holds %q: no names of one installation", bad)
		}
	}

	ids := map[int]string{}
	type rect struct{ x, y, w, h int }
	var placed []rect
	var series []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			if _, dup := ids[p.ID]; dup {
				t.Errorf("row %q: id %d used twice", p.Title, p.ID)
			}
			ids[p.ID] = p.Title
		}
	}
	for _, p := range d.allPanels() {
		if prev, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if p.Datasource["uid"] != datasourceRef {
			t.Errorf("panel %q: data source %v, want %s", p.Title, p.Datasource, datasourceRef)
		}
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, g)
		}
		r := rect{g.X, g.Y, g.W, g.H}
		for _, o := range placed {
			if r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h {
				t.Errorf("panel %q: gridPos %+v overlaps another panel", p.Title, g)
			}
		}
		placed = append(placed, r)
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
	}
	for _, q := range d.queries() {
		if q.datasource["uid"] != datasourceRef {
			t.Errorf("panel %q query %s: data source %v, want %s", q.panel, q.ref, q.datasource, datasourceRef)
		}
		sels, err := selectors(q.raw)
		if err != nil {
			t.Errorf("panel %q query %s: %v", q.panel, q.ref, err)
			continue
		}
		for _, s := range sels {
			series = append(series, s.name)
			if !strings.Contains(s.matchers, instanceMatcher) {
				t.Errorf("panel %q query %s: %s{%s} is not filtered by %s", q.panel, q.ref, s.name, s.matchers, instanceMatcher)
			}
		}
	}
	for _, s := range dashboardSeries {
		if !slices.Contains(series, s) {
			t.Errorf("no panel shows %s", s)
		}
	}
}
