package alerts

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
	"github.com/cubesandbox/cubetemplatecenter/test/promrules"
	"github.com/cubesandbox/cubetemplatecenter/test/wait"
)

// prometheusSeries are series Prometheus makes itself for every target.
var prometheusSeries = []string{"up"}

// exportedSeries runs two agents and returns the union of the series
// their /metrics serve: one with every optional part configured (blob
// store, CubeMaster's database, Redis; the last two unreachable) and one
// with a final report it cannot deliver (CubeMaster unreachable), so that
// the series that appear only with a part or after an event are there.
func exportedSeries(t *testing.T) map[string]string {
	t.Helper()
	master := "http://127.0.0.1:" + strconv.Itoa(childproc.FreePort(t))
	blobs := filepath.Join(t.TempDir(), "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	full := startAgent(t, "agent with every optional part", master, map[string]map[string]any{
		"artifact_store": {"backend": "fs", "fs_root": blobs},
		"instance_db_config": {"driver": "mysql", "addr": "127.0.0.1:" + strconv.Itoa(childproc.FreePort(t)),
			"user": "cube", "db_name": "cube", "conn_timeout": 1},
		"redis": {"nodes": []string{"127.0.0.1:" + strconv.Itoa(childproc.FreePort(t))}},
	})
	plain := startAgent(t, "agent with a pending report", master, nil)
	plain.submit(t, "alerts-metrics-1", unreachableImage)

	got := map[string]string{}
	wait.For(t, "a failed delivery counted in callback_attempts_total", func() bool {
		fams := plain.metricFamilies(t)
		maps.Copy(got, fams)
		_, ok := fams["cube_templatecenter_callback_attempts_total"]
		return ok
	})
	wait.For(t, "the readiness checks of the optional parts exported", func() bool {
		fams := full.metricFamilies(t)
		maps.Copy(got, fams)
		_, ok := fams["cube_templatecenter_health_check_success"]
		return ok
	})
	return got
}

// TestRulesAndPanelsReadExportedSeries: every series an alert or a panel
// reads is one a real agent exports (or up, which Prometheus adds), so a
// renamed metric cannot leave an alert silently empty.
func TestRulesAndPanelsReadExportedSeries(t *testing.T) {
	exported := exportedSeries(t)
	check := func(what, expr string) {
		names, err := metricNames(expr)
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		if len(names) == 0 {
			t.Errorf("%s reads no series: %q", what, expr)
		}
		for _, n := range names {
			if _, ok := exported[n]; !ok && !slices.Contains(prometheusSeries, n) {
				t.Errorf("%s reads %s, which no agent exports", what, n)
			}
		}
	}
	for _, a := range promrules.Load(t, rulesPath).Alerts() {
		check("alert "+a.Alert, a.Expr)
	}
	d := loadDashboard(t)
	for _, q := range d.queries() {
		check("panel "+q.panel+" query "+q.ref, q.raw)
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			check("variable "+v.Name, labelValuesMetric(t, v))
		}
	}
	if t.Failed() {
		var names []string
		for n := range exported {
			names = append(names, n)
		}
		slices.Sort(names)
		t.Logf("exported: %q", names)
	}
}

// metricNames returns the distinct metric names of an expression.
func metricNames(expr string) ([]string, error) {
	sels, err := selectors(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range sels {
		if !slices.Contains(names, s.name) {
			names = append(names, s.name)
		}
	}
	return names, nil
}
