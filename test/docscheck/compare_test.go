package docscheck

// The comparison, of the names extract_test.go reads with the binary:
//
//   - Metrics: every one named is served (a pattern matches one); every
//     series served is a row of docs/observability.md's tables, with its
//     type and label names.
//   - Keys: every one named is a setting check-config lists, a section of
//     them, or a key the binary knows otherwise (upstream's, reported as
//     deprecated or ignored rather than unknown); every setting is in
//     README.md's configuration block.
//   - Variables: check-config names each one set (as a source, a warning
//     or an error) or reads the file it names; those read outside the
//     configuration (outsideConfig, and OTEL_*) are in the binary.
//   - Routes: a request of each is counted under that very route.
//   - Commands and flags: each one named is in -h, each flag in its
//     command's -h; every command -h lists is in the man page and in
//     README.md's command table, and every flag it takes in the man page.
//   - Defaults: README.md's configuration block and the packaged conf.yaml
//     show each key at its built-in default unless the line's comment says
//     "default" (a placeholder "..." excepted); a Markdown table with a
//     "default" column gives the default of the key that its first cell
//     holding exactly one backticked key names ("unset" and "none": empty).
//
// Values are compared as the binary reads them: the documented text is
// handed to check-config, never parsed here.

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The files the check reads, from the repository root; docs/*.md besides.
const (
	readmeFile        = "README.md"
	observabilityFile = "docs/observability.md"
	manFile           = "packaging/templatecenter.8"
	confFile          = "packaging/etc/conf.yaml"
	valuesFile        = "packaging/helm/cube-templatecenter/values.yaml"
)

// allowed are the deliberate exceptions, by the name a problem is about,
// each with the reason. An entry no problem uses fails the check, so the
// list cannot go stale.
var allowed = map[string]string{
	// Renamed series, named as the old name of the new one.
	"cube_templatecenter_builds_running": "the old name of cube_templatecenter_jobs_running (api.md, operations.md)",
	// Misspelt on purpose: the example of the warning an unknown key earns
	// (operations.md).
	"build.max_concurent_builds": "the misspelt key of a warning's example",
	// Read by the test suites, not the binary.
	"CUBE_TC_SYSTEM_TEST_CACHE": "the system test suite's cache (test/system)",
	// The OTLP exporter builds these names from a prefix and a suffix, so
	// they are not in the binary as a whole.
	"OTEL_EXPORTER_OTLP_HEADERS":            "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_ + HEADERS)",
	"OTEL_EXPORTER_OTLP_TIMEOUT":            "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_ + TIMEOUT)",
	"OTEL_EXPORTER_OTLP_COMPRESSION":        "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_ + COMPRESSION)",
	"OTEL_EXPORTER_OTLP_CERTIFICATE":        "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_ + CERTIFICATE)",
	"OTEL_EXPORTER_OTLP_INSECURE":           "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_ + INSECURE)",
	"OTEL_EXPORTER_OTLP_TRACES_HEADERS":     "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_TRACES_ + HEADERS)",
	"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT":     "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_TRACES_ + TIMEOUT)",
	"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_TRACES_ + COMPRESSION)",
	"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_TRACES_ + CERTIFICATE)",
	"OTEL_EXPORTER_OTLP_TRACES_INSECURE":    "read by the OTLP exporter itself (OTEL_EXPORTER_OTLP_TRACES_ + INSECURE)",
	// Names that only docs/upstream.md gets wrong, while another change
	// rewrites that page, go here marked "pending docs/upstream.md
	// update": none now.
}

// outsideConfig are variables the binary reads outside its configuration,
// which check-config therefore never names; each must be in the binary.
// Every OTEL_ variable is one too: the tracer provider reads them at start.
var outsideConfig = map[string]string{
	"CUBE_TEMPLATE_CENTER_INFLATE":     "the gzip inflater, chosen at start",
	"CUBE_TEMPLATE_CENTER_SYSCONF_DIR": "where the jobs commands find the installed configuration",
}

// docs is the documentation, by path from the repository root.
type docs map[string]string

// readDocs reads the documentation the check compares.
func readDocs(t testing.TB) docs {
	t.Helper()
	root := filepath.Join("..", "..")
	md, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(md) < 5 {
		t.Fatalf("docs/*.md: %v %v", md, err)
	}
	d := docs{}
	for _, p := range append(md, filepath.Join(root, readmeFile), filepath.Join(root, manFile),
		filepath.Join(root, confFile), filepath.Join(root, valuesFile)) {
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		d[filepath.ToSlash(rel)] = string(text)
	}
	return d
}

// problem is one disagreement: what it is about, where, and how.
type problem struct {
	name, where, text string
}

func (p problem) String() string { return p.where + ": " + p.text }

// checker compares one documentation set with the binary.
type checker struct {
	t        testing.TB
	d        docs
	b        *binary
	f        *facts
	sections map[string]bool
	problems []problem
}

func (c *checker) report(name, where, format string, args ...any) {
	c.problems = append(c.problems, problem{name, where, fmt.Sprintf(format, args...)})
}

// compare returns every disagreement between d and the binary, the
// allowed ones apart, and the allow-list entries no problem used.
func compare(t testing.TB, d docs, b *binary, f *facts) (problems []problem, unused []string) {
	t.Helper()
	c := &checker{t: t, d: d, b: b, f: f, sections: f.sections()}
	refs := c.refs()
	c.metrics(refs)
	c.keys(refs)
	c.variables(refs)
	c.routes(refs)
	c.shorthands()
	c.commands()
	c.defaults()
	used := map[string]bool{}
	for _, p := range c.problems {
		if _, ok := allowed[p.name]; ok {
			used[p.name] = true
			continue
		}
		problems = append(problems, p)
	}
	for name := range allowed {
		if !used[name] {
			unused = append(unused, name)
		}
	}
	slices.SortFunc(problems, func(a, b problem) int { return strings.Compare(a.String(), b.String()) })
	return slices.CompactFunc(problems, func(a, b problem) bool { return a == b }), unused
}

// shorthandRe matches a variable name written in part: an elided head
// ("…_TIMEOUT", "..._DISABLED") or tail ("CUBE_TC_...").
var shorthandRe = regexp.MustCompile(`(?:^|[^A-Za-z0-9_])(?:(?:\.\.\.|…)_[A-Z][A-Z0-9_]*|(?:CUBE|CUBEMASTER|OTEL)_[A-Z0-9_]*(?:\.\.\.|…))`)

// shorthands reports variables the Markdown docs write only in part: an
// operator's grep for the whole name would not find them.
func (c *checker) shorthands() {
	for _, file := range slices.Sorted(maps.Keys(c.d)) {
		if !strings.HasSuffix(file, ".md") {
			continue
		}
		for _, sp := range mdSpans(c.d[file]) {
			if m := shorthandRe.FindString(sp.text); m != "" {
				m = strings.TrimLeft(m, " (,")
				c.report(m, fmt.Sprintf("%s:%d", file, sp.line), "variable written in part as %s: write it out, so a grep finds it", m)
			}
		}
	}
}

// isSetting reports whether check-config lists key.
func (c *checker) isSetting(key string) bool { _, ok := c.f.setting(key); return ok }

// refs collects every name the documentation uses.
func (c *checker) refs() []ref {
	var out []ref
	for _, file := range slices.Sorted(maps.Keys(c.d)) {
		text := c.d[file]
		switch {
		case strings.HasSuffix(file, ".md"):
			out = append(out, mdNames(file, text, c.sections)...)
			for _, b := range fencedBlocks(text) {
				if b.lang == "yaml" {
					out = append(out, c.yamlKeyRefs(file, b.body, "", b.line, true)...)
				}
			}
		case file == manFile:
			out = append(out, manNames(file, text, c.sections)...)
		case file == confFile:
			out = append(out, yamlCommentNames(file, text, c.sections)...)
			out = append(out, c.yamlKeyRefs(file, text, "", 1, false)...)
		case file == valuesFile:
			out = append(out, yamlCommentNames(file, text, c.sections)...)
			out = append(out, c.yamlKeyRefs(file, text, "config", 1, false)...)
		}
	}
	return out
}

// yamlKeyRefs returns the keys a YAML document sets, as references; with
// onlyConfig, a document whose top-level keys are not all sections is not
// a configuration example (a Kubernetes manifest) and has none.
func (c *checker) yamlKeyRefs(file, text, prefix string, firstLine int, onlyConfig bool) []ref {
	leaves, err := yamlLeaves(text, prefix, c.isSetting)
	if err != nil {
		c.report(file, file+":"+strconv.Itoa(firstLine), "YAML does not parse: %v", err)
		return nil
	}
	var out []ref
	for _, l := range leaves {
		section, _, _ := strings.Cut(l.key, ".")
		if onlyConfig && !c.sections[section] {
			return nil
		}
		out = append(out, ref{keyName, l.key, false, file + ":" + strconv.Itoa(firstLine+l.line-1)})
	}
	return out
}

// metrics checks the metrics named against those served, and the catalog
// (docs/observability.md's tables) both ways, with types and labels.
func (c *checker) metrics(refs []ref) {
	served := c.f.metrics
	has := func(name string) bool {
		if _, ok := served[name]; ok {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && served[base].typ == "histogram" {
				return true
			}
		}
		return false
	}
	for _, r := range refs {
		switch {
		case r.kind != metricName:
		case r.pattern && !slices.ContainsFunc(slices.Collect(maps.Keys(served)), func(s string) bool { return strings.HasPrefix(s, r.name) }):
			c.report(r.name, r.where, "no metric served matches %s*", r.name)
		case !r.pattern && !has(r.name):
			c.report(r.name, r.where, "metric %s is not served", r.name)
		}
	}
	listed := map[string]bool{}
	for _, row := range metricCatalog(observabilityFile, c.d[observabilityFile]) {
		listed[row.name] = true
		s, ok := served[row.name]
		if !ok {
			continue // reported above
		}
		if row.typ != s.typ {
			c.report(row.name, row.where, "metric %s is a %s, documented as a %s", row.name, s.typ, row.typ)
		}
		if got, want := slices.Sorted(maps.Keys(s.labels)), slices.Sorted(slices.Values(row.labels)); !slices.Equal(got, want) {
			c.report(row.name, row.where, "metric %s has labels %q, documented as %q", row.name, got, want)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(served)) {
		if strings.HasPrefix(name, "cube_templatecenter_") && !listed[name] {
			c.report(name, observabilityFile, "metric %s is served but not in the tables of %s", name, observabilityFile)
		}
	}
}

// keys checks the keys named: each is a setting, a section of settings,
// or a key the binary knows otherwise (upstream's, reported as deprecated
// or ignored), which check-config shows by not calling it unknown.
func (c *checker) keys(refs []ref) {
	var probe []ref
	for _, r := range refs {
		if r.kind != keyName {
			continue
		}
		prefixOf := slices.ContainsFunc(c.f.defaults, func(s setting) bool {
			return strings.HasPrefix(s.Key, r.name) && (r.pattern || strings.HasPrefix(s.Key, r.name+"."))
		})
		switch {
		case r.pattern && !prefixOf:
			c.report(r.name, r.where, "no configuration key matches %s*", r.name)
		case r.pattern, prefixOf, c.isSetting(r.name):
		default:
			probe = append(probe, r)
		}
	}
	if len(probe) == 0 {
		return
	}
	var names []string
	for _, r := range probe {
		names = append(names, r.name)
	}
	res := c.b.checkConfig(c.t, nestedYAML(names, "1"))
	for _, r := range probe {
		if slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.HasPrefix(w, fmt.Sprintf("unknown key %q ", r.name)) }) {
			c.report(r.name, r.where, "%s is not a configuration key (check-config: unknown key)", r.name)
		}
	}
}

// nestedYAML writes the dotted keys as one YAML document, each set to
// value; a key below another is left out.
func nestedYAML(keys []string, value string) string {
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var b strings.Builder
	var open []string
	for i, k := range keys {
		if i+1 < len(keys) && strings.HasPrefix(keys[i+1], k+".") {
			continue
		}
		path := strings.Split(k, ".")
		common := 0
		for common < len(open) && common < len(path)-1 && open[common] == path[common] {
			common++
		}
		for j := common; j < len(path)-1; j++ {
			b.WriteString(strings.Repeat("  ", j) + path[j] + ":\n")
		}
		b.WriteString(strings.Repeat("  ", len(path)-1) + path[len(path)-1] + ": " + value + "\n")
		open = path[:len(path)-1]
	}
	return b.String()
}

// names returns whether text names name as a whole word.
func names(text, name string) bool {
	return regexp.MustCompile(`(^|[^A-Za-z0-9_])` + regexp.QuoteMeta(name) + `($|[^A-Za-z0-9_])`).MatchString(text)
}

// variables checks the variables named: check-config names each one set
// (as a source, a warning or an error), or reads the file it names; those
// read outside the configuration are in the binary.
func (c *checker) variables(refs []ref) {
	seen := map[string]bool{}
	for _, r := range refs {
		if r.kind != varName || seen[r.name] {
			continue
		}
		seen[r.name] = true
		if _, ok := outsideConfig[r.name]; ok || strings.HasPrefix(r.name, "OTEL_") {
			if !bytes.Contains(c.f.image, []byte(r.name)) {
				c.report(r.name, r.where, "variable %s is not in the binary", r.name)
			}
			continue
		}
		if !c.readsVariable(r.name) {
			c.report(r.name, r.where, "variable %s: check-config does not read it", r.name)
		}
	}
}

// readsVariable reports whether check-config shows that it read name.
func (c *checker) readsVariable(name string) bool {
	for _, v := range []string{c.b.probeFile, "1", "http://127.0.0.1:1", "warn", "10m"} {
		res := c.b.checkConfig(c.t, "", name+"="+v)
		if names(res.raw, name) || res.Path == v {
			return true
		}
	}
	return false
}

// routes checks the routes named: a request of each (wildcards filled
// in) is counted under that very route, so the agent's pattern is the one
// documented.
func (c *checker) routes(refs []ref) {
	for _, r := range refs {
		if r.kind != routeName {
			continue
		}
		ok, err := c.f.agent.matches(r.name)
		if err != nil {
			c.t.Fatalf("ask the agent about %s: %v", r.name, err)
		}
		if !ok {
			c.report(r.name, r.where, "route %s: the agent counts a request of it under another route (or unmatched)", r.name)
		}
	}
}

// commands checks the commands and flags of the man page and of command
// lines in Markdown against -h, and that -h's are all documented: every
// command in the man page and the README's command table, every flag in
// the man page.
func (c *checker) commands() {
	known := c.f.commands
	check := func(paths, flags []string, where string) {
		for _, p := range paths {
			if p == "" {
				continue
			}
			have, ok := known[p]
			if !ok {
				c.report(p, where, "templatecenter %s is not a command (templatecenter -h)", p)
				continue
			}
			for _, fl := range flags {
				if n := flagName(fl); n != "h" && n != "help" && !slices.Contains(have, n) {
					c.report(p+" "+fl, where, "templatecenter %s has no flag %s (templatecenter %s -h)", p, fl, p)
				}
			}
		}
	}
	manFlags := map[string][]string{}
	for _, mc := range manCommands(manFile, c.d[manFile]) {
		check(mc.paths, mc.flags, mc.where)
		for _, p := range mc.paths {
			for _, fl := range mc.flags {
				manFlags[p] = append(manFlags[p], flagName(fl))
			}
			if _, ok := manFlags[p]; !ok {
				manFlags[p] = nil
			}
		}
	}
	for file, text := range c.d {
		if strings.HasSuffix(file, ".md") {
			for _, s := range commandSpans(text) {
				paths, flags := commandLine(s.text)
				check(paths, flags, file+":"+strconv.Itoa(s.line))
			}
		}
	}
	inReadme := map[string]bool{}
	for _, s := range readmeCommands(c.d[readmeFile]) {
		paths, _ := commandLine(s.text)
		for _, p := range paths {
			inReadme[p] = true
		}
	}
	for _, p := range slices.Sorted(maps.Keys(known)) {
		if !inReadme[p] {
			c.report(p, readmeFile, "command %s is not in %s's command table", p, readmeFile)
		}
		documented, ok := manFlags[p]
		if !ok {
			c.report(p, manFile, "command %s is not in the man page", p)
			continue
		}
		for _, fl := range known[p] {
			if !slices.Contains(documented, fl) {
				c.report(p+" --"+fl, manFile, "flag --%s of templatecenter %s is not in the man page", fl, p)
			}
		}
	}
}

// defaults checks the documented defaults: README's configuration block
// (which must also hold every key) and the packaged conf.yaml line by line,
// and the tables with a default column.
func (c *checker) defaults() {
	var readmeBlock *block
	for _, b := range fencedBlocks(c.d[readmeFile]) {
		if b.lang == "yaml" && strings.HasPrefix(b.body, "common:") {
			readmeBlock = &b
			break
		}
	}
	if readmeBlock == nil {
		c.report(readmeFile, readmeFile, "no configuration block (```yaml starting with common:)")
	} else {
		keys := c.fileDefaults(readmeFile, readmeBlock.body, readmeBlock.line)
		for _, s := range c.f.defaults {
			if strings.Contains(s.Key, ".") && !keys[s.Key] {
				c.report(s.Key, readmeFile+":"+strconv.Itoa(readmeBlock.line), "key %s is not in %s's configuration block", s.Key, readmeFile)
			}
		}
	}
	c.fileDefaults(confFile, c.d[confFile], 1)
	for _, file := range slices.Sorted(maps.Keys(c.d)) {
		if strings.HasSuffix(file, ".md") {
			c.tableDefaults(file, c.d[file])
		}
	}
}

// placeholder stands in for "..." (a secret's place) when a documented
// configuration is handed to check-config.
const placeholder = "docscheck-placeholder-0123456789"

// fileDefaults checks a configuration file that shows the defaults: a line
// whose value is not the default must say "default" in its comment. It
// returns the keys the file sets.
func (c *checker) fileDefaults(file, text string, firstLine int) map[string]bool {
	where := func(line int) string { return file + ":" + strconv.Itoa(firstLine+line-1) }
	leaves, err := yamlLeaves(text, "", c.isSetting)
	if err != nil {
		c.report(file, where(1), "YAML does not parse: %v", err)
		return nil
	}
	placeholders := regexp.MustCompile(`(:\s*)\.\.\.(\s*[,}#]|\s*$)`)
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		lines = append(lines, placeholders.ReplaceAllString(l, "${1}"+placeholder+"${2}"))
	}
	res := c.b.checkConfig(c.t, strings.Join(lines, "\n"))
	if !res.Valid {
		c.report(file, where(1), "check-config refuses it: %q", res.Errors)
		return nil
	}
	comments := yamlComments(text)
	keys := map[string]bool{}
	for _, l := range leaves {
		keys[l.key] = true
	}
	for _, s := range res.Settings {
		_, after, ok := strings.Cut(s.Source, ".yaml:")
		if !ok || !keys[s.Key] {
			continue
		}
		n, _ := strconv.Atoi(strings.FieldsFunc(after, func(r rune) bool { return r < '0' || r > '9' })[0])
		def, _ := c.f.setting(s.Key)
		if s.Value == def.Value || strings.Contains(s.Value, placeholder) || s.Value == "REDACTED" ||
			strings.Contains(comments[n], "default") {
			continue
		}
		c.report(s.Key, where(n), "%s shows %s, not the built-in default %s, and its comment does not say so (\"default\")", s.Key, s.Value, def.Value)
	}
	return keys
}

// defaultCell turns a default column's cell into a value: backticks and
// thousands' commas removed, cut before an explanation.
func defaultCell(cell string) string {
	cell = strings.ReplaceAll(strings.ReplaceAll(cell, "`", ""), ",", "")
	for _, sep := range []string{": ", " (", ";"} {
		cell, _, _ = strings.Cut(cell, sep)
	}
	return strings.TrimSpace(cell)
}

// tableDefaults checks the tables of a Markdown file with a default
// column.
func (c *checker) tableDefaults(file, text string) {
	keyCell := regexp.MustCompile("^`([a-z_]+(?:\\.[a-z0-9_]+)+)`$")
	for _, t := range mdTables(text) {
		col := slices.IndexFunc(t.header, func(h string) bool { return strings.EqualFold(h, "default") })
		if col < 0 {
			continue
		}
		for i, row := range t.rows {
			key := ""
			for j, cell := range row {
				if m := keyCell.FindStringSubmatch(cell); j != col && m != nil {
					key = m[1]
					break
				}
			}
			if key == "" || col >= len(row) {
				continue
			}
			where := file + ":" + strconv.Itoa(t.lines[i])
			def, ok := c.f.setting(key)
			if !ok {
				continue // reported as an unknown key
			}
			value := defaultCell(row[col])
			if value == "unset" || value == "none" {
				if def.Value != `""` && def.Value != "[]" && def.Value != "{}" {
					c.report(key, where, "%s is documented as unset by default; its default is %s", key, def.Value)
				}
				continue
			}
			res := c.b.checkConfig(c.t, nestedYAML([]string{key}, value))
			i := slices.IndexFunc(res.Settings, func(s setting) bool { return s.Key == key })
			switch {
			case i < 0:
				c.report(key, where, "the documented default of %s, %q, is not a value check-config takes: %q", key, value, res.Errors)
			case res.Settings[i].Value != def.Value:
				c.report(key, where, "the documented default of %s is %s; check-config's is %s", key, res.Settings[i].Value, def.Value)
			}
		}
	}
}
