package docscheck

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// The extraction rules on strings, without the binary.

var testSections = map[string]bool{"build": true, "store": true, "artifact_store": true, "redis": true, "config": true}

func TestNamesIn(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string // kind name, with a * for a pattern
	}{
		{"cube_templatecenter_jobs_running", []string{"metric cube_templatecenter_jobs_running"}},
		{`rate(cube_templatecenter_http_requests_total{code="401"}[5m])`, []string{"metric cube_templatecenter_http_requests_total"}},
		{"cube_templatecenter_volume_{size,free}_bytes{volume}",
			[]string{"metric cube_templatecenter_volume_size_bytes", "metric cube_templatecenter_volume_free_bytes"}},
		{"cube_templatecenter_layer_cache_*", []string{"metric cube_templatecenter_layer_cache_*"}},
		{"CUBE_TEMPLATE_CENTER_INFLATE=go", []string{"variable CUBE_TEMPLATE_CENTER_INFLATE"}},
		{"CUBE_X_{A,B}_STALE", []string{"variable CUBE_X_A_STALE", "variable CUBE_X_B_STALE"}},
		{"CUBE_TC_*", nil},
		{"CUBE_TC_...", nil},
		{"AWS_REGION", nil},
		{"build.max_entries", []string{"key build.max_entries"}},
		{"config.strict: true", []string{"key config.strict"}},
		{"redis.{nodes, password}", []string{"key redis.nodes", "key redis.password"}},
		{"artifact_store.s3.*", []string{"key artifact_store.s3.*"}},
		{"build.headroom_*", []string{"key build.headroom_*"}},
		{"/var/lib/cube-templatecenter/spool.db", nil},
		{"persistence.store.type: pvc", nil},
		{"service.name", nil},
		{"store.dir.", []string{"key store.dir"}},
		{"{docker.io: [mirror.example:5000]}", nil},
		{"GET /tc/api/v1/jobs[/{id}]", []string{"route GET /tc/api/v1/jobs/{id}", "route GET /tc/api/v1/jobs"}},
		{"(POST /tc/api/v1/build), GET /health", []string{"route POST /tc/api/v1/build", "route GET /health"}},
		{"POST $CUBE_MASTER_ADDR/internal/x", []string{"variable CUBE_MASTER_ADDR"}},
	} {
		var got []string
		for _, r := range namesIn(tc.text, "f:1", testSections) {
			s := string(r.kind) + " " + r.name
			if r.pattern {
				s += "*"
			}
			got = append(got, s)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("namesIn(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
}

func TestMdSpansSkipFences(t *testing.T) {
	text := "a `x`\n```sh\n`not`\n```\nb `y\nz` c\n"
	got := fmt.Sprint(mdSpans(text))
	if want := "[{x 1} {y z 5}]"; got != want {
		t.Errorf("mdSpans = %s, want %s", got, want)
	}
	blocks := fencedBlocks(text)
	if len(blocks) != 1 || blocks[0].lang != "sh" || blocks[0].body != "`not`\n" || blocks[0].line != 3 {
		t.Errorf("fencedBlocks = %+v", blocks)
	}
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		line         string
		paths, flags []string
	}{
		{"jobs [list] [--state S] [--spool PATH \\| --config FILE]", []string{"jobs", "jobs list"}, []string{"--state", "--spool", "--config"}},
		{"[serve] [--strict-config]", []string{"", "serve"}, []string{"--strict-config"}},
		{"jobs show JOB_ID [--json]", []string{"jobs show"}, []string{"--json"}},
		{"build --image REF [--ca FILE|--no-ca]", []string{"build"}, []string{"--image", "--ca", "--no-ca"}},
		{"check-config -q", []string{"check-config"}, []string{"-q"}},
		{"inspect IMG.ext4 oci-layout:DIR", []string{"inspect"}, nil},
		{"<command> -h", []string{""}, []string{"-h"}},
	} {
		paths, flags := commandLine(tc.line)
		if !slices.Equal(paths, tc.paths) || !slices.Equal(flags, tc.flags) {
			t.Errorf("commandLine(%q) = %q, %q; want %q, %q", tc.line, paths, flags, tc.paths, tc.flags)
		}
	}
}

func TestHelp(t *testing.T) {
	usage := "Usage: x\n\nCommands:\n  serve              run the agent;\n                     --strict-config more\n" +
		"  jobs [list]        list jobs\n  jobs cancel JOB_ID cancel a job\n  version            print it\n\nEvery command"
	if got, want := helpCommands(usage), []string{"jobs", "jobs cancel", "jobs list", "serve", "version"}; !slices.Equal(got, want) {
		t.Errorf("helpCommands = %q, want %q", got, want)
	}
	help := "Usage: x\n\nFlags (one or two dashes):\n  -json\n    \tprint JSON\n  -q\tquiet\n  -limit int\n    \tat most\n  -h, --help\n    \tshow this help\n"
	if got, want := helpFlags(help), []string{"json", "q", "limit"}; !slices.Equal(got, want) {
		t.Errorf("helpFlags = %q, want %q", got, want)
	}
}

func TestManCommands(t *testing.T) {
	man := `.SH SYNOPSIS
.B templatecenter jobs
.RB [ list ]
.RB [ \-\-state
.IR STATE ]
.br
.B templatecenter version
.RB [ \-\-json ]
.SH COMMANDS
.TP
.BI "jobs show " JOB_ID
Show one job;
.B \-\-json
prints it.
.RS
.TP
.BI \-\-spool " PATH"
The spool, as in oci\-layout:DIR.
.RE
.TP
.B version
Print it.
.SH SIGNALS
.B \-\-ignored
`
	var got []string
	for _, c := range manCommands("m", man) {
		got = append(got, fmt.Sprintf("%s %s %s", c.where, strings.Join(c.paths, ","), strings.Join(c.flags, ",")))
	}
	want := []string{"m:2 jobs,jobs list --state", "m:7 version --json", "m:11 jobs show --json,--spool", "m:21 version "}
	if !slices.Equal(got, want) {
		t.Errorf("manCommands = %q, want %q", got, want)
	}
	var names []string
	for _, r := range manNames("m", `.BR common.http_bind : common.http_port`+"\n"+`.BR CUBE_MASTER_ADDR " (" CUBE_MASTER_ENDPOINT )`, map[string]bool{"common": true}) {
		names = append(names, r.name)
	}
	if want := []string{"CUBE_MASTER_ADDR", "CUBE_MASTER_ENDPOINT", "common.http_bind", "common.http_port"}; !slices.Equal(slices.Sorted(slices.Values(names)), want) {
		t.Errorf("manNames = %q, want %q", names, want)
	}
}

func TestMetricCatalogAndServed(t *testing.T) {
	md := "| series | type | labels | meaning |\n|---|---|---|---|\n" +
		"| `cube_templatecenter_a_total` | counter | `outcome`: `x`, `y`; `kind`: `p` | a \\| b |\n" +
		"| `cube_templatecenter_b` | gauge | | b |\n"
	got := metricCatalog("o", md)
	if len(got) != 2 || got[0].name != "cube_templatecenter_a_total" || got[0].typ != "counter" ||
		!slices.Equal(got[0].labels, []string{"outcome", "kind"}) || got[1].labels != nil || got[0].where != "o:3" {
		t.Errorf("metricCatalog = %+v", got)
	}
	text := "# HELP h x\n# TYPE h histogram\nh_bucket{route=\"a\",le=\"1\"} 0\nh_sum{route=\"a\"} 0\nh_count{route=\"a\"} 0\n# TYPE g gauge\ng 1\n"
	served := parseMetrics(text)
	if h := served["h"]; h.typ != "histogram" || len(h.labels) != 1 || !h.labels["route"] || served["g"].typ != "gauge" {
		t.Errorf("parseMetrics = %+v", served)
	}
}

func TestYAML(t *testing.T) {
	doc := "common:\n  http_bind: 0.0.0.0   # a # b\nregistry:\n  mirrors: {docker.io: [m]}\n  s3: {endpoint: x, bucket: y}\nconfig:\n  log: {level: info}\n"
	leaves, err := yamlLeaves(doc, "", func(k string) bool { return k == "registry.mirrors" })
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(leaves); got != "[{common.http_bind 2} {registry.mirrors 4} {registry.s3.endpoint 5} {registry.s3.bucket 5} {config.log.level 7}]" {
		t.Errorf("yamlLeaves = %s", got)
	}
	if sub, _ := yamlLeaves(doc, "config", func(string) bool { return false }); fmt.Sprint(sub) != "[{log.level 7}]" {
		t.Errorf("yamlLeaves under config = %v", sub)
	}
	if c := yamlComments(doc); c[2] != " a # b" || len(c) != 1 {
		t.Errorf("yamlComments = %v", c)
	}
	if got := nestedYAML([]string{"b.x.y", "a.k", "b.x.z", "b.w"}, "1"); got != "a:\n  k: 1\nb:\n  w: 1\n  x:\n    y: 1\n    z: 1\n" {
		t.Errorf("nestedYAML = %q", got)
	}
}

func TestDefaultCell(t *testing.T) {
	for cell, want := range map[string]string{
		"1,000,000": "1000000", "192 MiB": "192 MiB", "`http://127.0.0.1:8089`": "http://127.0.0.1:8089",
		"unset: builds refused with 503": "unset", "`store.dir` (the store)": "store.dir", "5%; a size": "5%",
	} {
		if got := defaultCell(cell); got != want {
			t.Errorf("defaultCell(%q) = %q, want %q", cell, got, want)
		}
	}
	tables := mdTables("x\n| a | default |\n|---|---|\n| `k` | `a\\|b` |\ny\n")
	if len(tables) != 1 || !slices.Equal(tables[0].rows[0], []string{"`k`", "`a|b`"}) || tables[0].lines[0] != 4 {
		t.Errorf("mdTables = %+v", tables)
	}
}
