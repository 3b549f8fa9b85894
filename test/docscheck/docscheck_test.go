package docscheck

import (
	"maps"
	"strings"
	"sync"
	"testing"
)

var (
	factsOnce sync.Once
	shared    struct {
		b *binary
		f *facts
	}
)

// theBinary returns the binary and what it serves, prints and lists,
// gathered once for all tests.
func theBinary(t *testing.T) (*binary, *facts) {
	t.Helper()
	factsOnce.Do(func() {
		shared.b = newBinary(t)
		shared.f = gatherFacts(t, shared.b)
	})
	if shared.f == nil {
		t.Fatal("gathering the binary's facts failed earlier")
	}
	return shared.b, shared.f
}

// TestDocsMatchBinary: everything the documentation names exists in the
// binary, and everything the binary serves, prints and lists is
// documented.
func TestDocsMatchBinary(t *testing.T) {
	b, f := theBinary(t)
	problems, unused := compare(t, readDocs(t), b, f)
	for _, p := range problems {
		t.Error(p)
	}
	for _, name := range unused {
		t.Errorf("allow-list entry %q (%s) is not needed: remove it", name, allowed[name])
	}
}

// TestPlantedDiscrepancies: the comparison finds a discrepancy planted in
// a copy of the documentation, of each kind it checks.
func TestPlantedDiscrepancies(t *testing.T) {
	b, f := theBinary(t)
	base := readDocs(t)
	replace := func(file, old, new string) func(docs) {
		return func(d docs) {
			if !strings.Contains(d[file], old) {
				t.Fatalf("%s lacks %q: the planted discrepancy needs updating", file, old)
			}
			d[file] = strings.Replace(d[file], old, new, 1)
		}
	}
	for _, tc := range []struct {
		name   string
		doctor func(docs)
		want   []string
	}{
		{"RenamedMetric", replace(observabilityFile, "`cube_templatecenter_jobs_running`", "`cube_templatecenter_jobs_runing`"),
			[]string{"metric cube_templatecenter_jobs_runing is not served",
				"metric cube_templatecenter_jobs_running is served but not in the tables of docs/observability.md"}},
		{"WrongType", replace(observabilityFile, "`cube_templatecenter_jobs_running` | gauge", "`cube_templatecenter_jobs_running` | counter"),
			[]string{"metric cube_templatecenter_jobs_running is a gauge, documented as a counter"}},
		{"WrongLabel", replace(observabilityFile, "`cube_templatecenter_build_phase_duration_seconds` | histogram | `phase`",
			"`cube_templatecenter_build_phase_duration_seconds` | histogram | `stage`"),
			[]string{`metric cube_templatecenter_build_phase_duration_seconds has labels ["phase"], documented as ["stage"]`}},
		{"MissingKey", replace(readmeFile, "  queue_size: 64 ", "  # queue_size: 64 "),
			[]string{"key build.queue_size is not in README.md's configuration block"}},
		{"UnknownKey", replace("docs/operations.md", "`build.max_tree_memory`", "`build.max_tree_memory_bytes`"),
			[]string{"build.max_tree_memory_bytes is not a configuration key"}},
		{"UnknownVariable", replace(readmeFile, "`CUBE_TEMPLATE_CENTER_SPOOL_PATH`", "`CUBE_TEMPLATE_CENTER_SPOOL_FILE`"),
			[]string{"variable CUBE_TEMPLATE_CENTER_SPOOL_FILE: check-config does not read it"}},
		{"WrongDefault", replace(confFile, "queue_size: 64 ", "queue_size: 65 "),
			[]string{"build.queue_size shows 65, not the built-in default 64"}},
		{"VariableShorthand", replace("docs/upstream.md", "`CUBE_TC_RECONCILE_INTERVAL`", "`CUBE_TC_...`"),
			[]string{"variable written in part as CUBE_TC_...: write it out, so a grep finds it"}},
		{"WrongTableDefault", replace(readmeFile, "| `build.max_concurrent_builds` | `2` |", "| `build.max_concurrent_builds` | `3` |"),
			[]string{"the documented default of build.max_concurrent_builds is 3; check-config's is 2"}},
		{"MissingCommand", func(d docs) {
			i := strings.Index(d[readmeFile], "| `templatecenter version")
			j := i + strings.Index(d[readmeFile][i:], "\n") + 1
			d[readmeFile] = d[readmeFile][:i] + d[readmeFile][j:]
		}, []string{"command version is not in README.md's command table"}},
		{"UnknownFlag", replace(manFile, ".B templatecenter version\n.RB [ \\-\\-json ]", ".B templatecenter version\n.RB [ \\-\\-yaml ]"),
			[]string{"templatecenter version has no flag --yaml"}},
		{"UndocumentedFlag", replace(manFile, ".BI \\-\\-platform \" OS/ARCH\"", ".BI \\-\\-arch \" OS/ARCH\""),
			[]string{"flag --platform of templatecenter build is not in the man page", "templatecenter build has no flag --arch"}},
		{"RenamedRoute", replace(readmeFile, "`POST /tc/api/v1/jobs/{id}/cancel`", "`POST /tc/api/v1/jobs/{job_id}/cancel`"),
			[]string{"route POST /tc/api/v1/jobs/{job_id}/cancel: the agent counts a request of it under another route"}},
		{"UnknownRoute", replace("docs/api.md", "## GET /livez", "## GET /livenessz"),
			[]string{"route GET /livenessz: the agent counts a request of it under another route (or unmatched)"}},
		{"UnknownCommand", replace("docs/operations.md", "`templatecenter check-config`", "`templatecenter config-check`"),
			[]string{"templatecenter config-check is not a command"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := maps.Clone(base)
			tc.doctor(d)
			problems, _ := compare(t, d, b, f)
			var texts []string
			for _, p := range problems {
				texts = append(texts, p.String())
			}
			all := strings.Join(texts, "\n")
			for _, want := range tc.want {
				if !strings.Contains(all, want) {
					t.Errorf("the comparison missed %q; it found:\n%s", want, all)
				}
			}
		})
	}
}
