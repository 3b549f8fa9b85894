package docscheck

// What the documentation names, read from its text alone. The rules:
//
//   - Markdown: inline code spans (`...`) outside fenced blocks. In a span,
//     cube_templatecenter_... is a metric; CUBE_..., CUBEMASTER_... or
//     OTEL_... a variable; section.key, whose section is a top-level
//     section of the configuration, a key. A {a,b} group without ":", "="
//     or quotes lists alternatives (cube_templatecenter_volume_{size,free}_bytes,
//     redis.{nodes, password}); a name ending in * is a pattern, which must
//     match something; a variable ending in _*, _... or _… is a family, not
//     checked. A span starting "templatecenter " is a command line.
//   - Routes: METHOD /path in a span, a heading or a YAML comment; an
//     optional part in brackets (/jobs[/{id}]) gives a route with and one
//     without it.
//   - The man page: the same names anywhere in its text, roff removed;
//     commands and flags from SYNOPSIS and from the entries of COMMANDS.
//   - YAML files (conf.yaml, the chart's values): the same names in
//     comments, and their keys: every key of conf.yaml, and those under the
//     chart's config: value, are configuration keys.
//   - The metrics' catalog: the rows of docs/observability.md's tables,
//     with their type and label names.
//   - Defaults: see compare_test.go.

import (
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// kind is what a name names.
type kind string

const (
	metricName kind = "metric"
	keyName    kind = "key"
	varName    kind = "variable"
	routeName  kind = "route"
)

// ref is one name the documentation uses, and where.
type ref struct {
	kind kind
	// name is the name, or a pattern's prefix.
	name    string
	pattern bool
	where   string // file:line
}

// span is an inline code span of Markdown, or a line of other text, with
// the line it starts on.
type span struct {
	text string
	line int
}

var (
	fenceRe  = regexp.MustCompile("(?m)^\\s*```")
	spanRe   = regexp.MustCompile("`([^`]+)`")
	metricRe = regexp.MustCompile(`cube_templatecenter_[a-z0-9_]*\*?`)
	varRe    = regexp.MustCompile(`(?:^|[^A-Za-z0-9_])((?:CUBE|CUBEMASTER|OTEL)_[A-Z0-9_]*)(\*|\.\.\.|…)?`)
	// keyRe takes a section.key not inside a path, a host name or a
	// longer dotted name.
	keyRe = regexp.MustCompile(`(?:^|[^A-Za-z0-9_/.\-$<])([a-z][a-z0-9_]*)((?:\.[a-z0-9_]+)+)(\.?\*)?`)
	// altRe is a {a,b} group of alternatives.
	altRe  = regexp.MustCompile(`\{([^{}:="]*,[^{}:="]*)\}`)
	flagRe = regexp.MustCompile(`(?:^|[\s\[|(])(--?[a-z][a-z0-9-]*)`)
	// routeRe is a method and a path; optRe an optional part of a path.
	routeRe = regexp.MustCompile(`(?:^|[\s,(])(GET|POST|PUT|PATCH|DELETE|HEAD) (/[A-Za-z0-9_./{}\[\]-]*)`)
	optRe   = regexp.MustCompile(`\[([^\[\]]*)\]`)
)

// lineOf returns the 1-based line of offset off in text.
func lineOf(text string, off int) int { return strings.Count(text[:off], "\n") + 1 }

// withoutFences blanks fenced code blocks, keeping the line count.
func withoutFences(text string) string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if fenceRe.MatchString(l) {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// mdSpans returns the inline code spans of Markdown text.
func mdSpans(text string) []span {
	text = withoutFences(text)
	var out []span
	for _, m := range spanRe.FindAllStringSubmatchIndex(text, -1) {
		out = append(out, span{strings.ReplaceAll(text[m[2]:m[3]], "\n", " "), lineOf(text, m[0])})
	}
	return out
}

// block is a fenced code block: its language and body, and the line of
// its first body line.
type block struct {
	lang, body string
	line       int
}

// fencedBlocks returns the fenced code blocks of Markdown text.
func fencedBlocks(text string) []block {
	var out []block
	var cur *block
	var body []string
	for i, l := range strings.Split(text, "\n") {
		if !fenceRe.MatchString(l) {
			if cur != nil {
				body = append(body, l)
			}
			continue
		}
		if cur == nil {
			cur = &block{lang: strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(l), "`")), line: i + 2}
			body = nil
			continue
		}
		cur.body = strings.Join(body, "\n") + "\n"
		out = append(out, *cur)
		cur = nil
	}
	return out
}

// expand returns text with each {a,b} group replaced by each alternative.
func expand(text string) []string {
	m := altRe.FindStringSubmatchIndex(text)
	if m == nil {
		return []string{text}
	}
	var out []string
	for _, alt := range strings.Split(text[m[2]:m[3]], ",") {
		out = append(out, expand(text[:m[0]]+strings.TrimSpace(alt)+text[m[1]:])...)
	}
	return out
}

// namesIn returns the metrics, variables, keys and routes text names;
// sections are the configuration's top-level sections.
func namesIn(text, where string, sections map[string]bool) []ref {
	var out []ref
	for _, m := range routeRe.FindAllStringSubmatch(text, -1) {
		for _, path := range optional(m[2]) {
			out = append(out, ref{routeName, m[1] + " " + path, false, where})
		}
	}
	for _, t := range expand(text) {
		for _, m := range metricRe.FindAllString(t, -1) {
			name, pattern := strings.CutSuffix(m, "*")
			out = append(out, ref{metricName, name, pattern, where})
		}
		for _, m := range varRe.FindAllStringSubmatch(t, -1) {
			if m[2] != "" || strings.HasSuffix(m[1], "_") {
				continue // a family of variables
			}
			out = append(out, ref{varName, m[1], false, where})
		}
		for _, m := range keyRe.FindAllStringSubmatch(t, -1) {
			if !sections[m[1]] {
				continue
			}
			name := m[1] + m[2]
			if m[3] == ".*" {
				name += "."
			}
			out = append(out, ref{keyName, name, m[3] != "", where})
		}
	}
	return out
}

// optional returns path with and without each of its bracketed parts
// ("/jobs[/{id}]": "/jobs/{id}" and "/jobs").
func optional(path string) []string {
	m := optRe.FindStringSubmatchIndex(path)
	if m == nil {
		return []string{path}
	}
	return append(optional(path[:m[0]]+path[m[2]:m[3]]+path[m[1]:]), optional(path[:m[0]]+path[m[1]:])...)
}

// mdNames returns the names the code spans of Markdown text use, and the
// routes its headings name.
func mdNames(file, text string, sections map[string]bool) []ref {
	var out []ref
	for _, s := range mdSpans(text) {
		out = append(out, namesIn(s.text, file+":"+strconv.Itoa(s.line), sections)...)
	}
	for i, l := range strings.Split(withoutFences(text), "\n") {
		if strings.HasPrefix(l, "#") {
			for _, r := range namesIn(l, file+":"+strconv.Itoa(i+1), sections) {
				if r.kind == routeName {
					out = append(out, r)
				}
			}
		}
	}
	return out
}

// yamlComments returns the comment of each line of YAML text, by line.
func yamlComments(text string) map[int]string {
	out := map[int]string{}
	for i, l := range strings.Split(text, "\n") {
		if j := strings.Index(l, "#"); j == 0 || j > 0 && (l[j-1] == ' ' || l[j-1] == '\t') {
			out[i+1] = l[j+1:]
		}
	}
	return out
}

// yamlCommentNames returns the names the comments of YAML text use.
func yamlCommentNames(file, text string, sections map[string]bool) []ref {
	var out []ref
	comments := yamlComments(text)
	for _, line := range slices.Sorted(maps.Keys(comments)) {
		out = append(out, namesIn(comments[line], file+":"+strconv.Itoa(line), sections)...)
	}
	return out
}

// leaf is one key a YAML document sets, with its line.
type leaf struct {
	key  string
	line int
}

// yamlLeaves returns the dotted keys the YAML document text sets, below
// prefix (a dotted path, "" for all). A mapping is walked into unless
// isSetting says its key is one setting (a map-valued one, such as
// registry.mirrors).
func yamlLeaves(text, prefix string, isSetting func(string) bool) ([]leaf, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	n := doc.Content[0]
	for _, p := range strings.Split(prefix, ".") {
		if p == "" {
			continue
		}
		n = mappingValue(n, p)
		if n == nil {
			return nil, nil
		}
	}
	var out []leaf
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := path + k.Value
			if v.Kind == yaml.MappingNode && !isSetting(key) && len(v.Content) > 0 {
				walk(v, key+".")
				continue
			}
			out = append(out, leaf{key, k.Line})
		}
	}
	if n.Kind == yaml.MappingNode {
		walk(n, "")
	}
	return out, nil
}

// mappingValue returns the value of key in the mapping n, nil if none.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// table is a Markdown table: its header cells and rows, with each row's
// line.
type table struct {
	header []string
	rows   [][]string
	lines  []int
}

// mdTables returns the tables of Markdown text. A cell's "\|" is a "|".
func mdTables(text string) []table {
	var out []table
	var cur *table
	for i, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") {
			if cur != nil {
				out = append(out, *cur)
				cur = nil
			}
			continue
		}
		cells := splitRow(l)
		switch {
		case cur == nil:
			cur = &table{header: cells}
		case len(cur.rows) == 0 && len(cur.lines) == 0 && strings.Trim(strings.Join(cells, ""), "-: ") == "":
			cur.lines = []int{} // the separator
		default:
			cur.rows = append(cur.rows, cells)
			cur.lines = append(cur.lines, i+1)
		}
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// splitRow returns the cells of a table row.
func splitRow(l string) []string {
	l = strings.ReplaceAll(l, `\|`, "\x00")
	l = strings.TrimSuffix(strings.TrimPrefix(l, "|"), "|")
	var cells []string
	for _, c := range strings.Split(l, "|") {
		cells = append(cells, strings.TrimSpace(strings.ReplaceAll(c, "\x00", "|")))
	}
	return cells
}

// catalogRow is a metric in docs/observability.md's tables.
type catalogRow struct {
	name, typ string
	labels    []string
	where     string
}

// metricCatalog returns the rows of the tables of text (docs/observability.md)
// whose first cell is a backticked cube_templatecenter_ name. The labels
// cell lists label names, each optionally followed by ": values", parts
// separated by ";".
func metricCatalog(file, text string) []catalogRow {
	var out []catalogRow
	for _, t := range mdTables(text) {
		if len(t.header) < 3 || t.header[0] != "series" {
			continue
		}
		for i, r := range t.rows {
			name := strings.Trim(r[0], "`")
			if !strings.HasPrefix(name, "cube_templatecenter_") || len(r) < 3 {
				continue
			}
			row := catalogRow{name: name, typ: r[1], where: file + ":" + strconv.Itoa(t.lines[i])}
			for _, part := range strings.Split(r[2], ";") {
				if before, _, ok := strings.Cut(part, ":"); ok {
					part = before
				}
				for _, m := range spanRe.FindAllStringSubmatch(part, -1) {
					row.labels = append(row.labels, m[1])
				}
			}
			out = append(out, row)
		}
	}
	return out
}

// commandLine reads a command line after "templatecenter": the command
// paths it names (a bracketed word is optional: "jobs [list]" is jobs and
// jobs list) and the flags it uses.
func commandLine(s string) (paths, flags []string) {
	words := strings.Fields(s)
	paths = []string{""}
	for _, w := range words {
		optional := strings.HasPrefix(w, "[") && strings.HasSuffix(w, "]")
		w = strings.Trim(w, "[]")
		if !isCommandWord(w) {
			break
		}
		var next []string
		for _, p := range paths {
			next = append(next, strings.TrimSpace(p+" "+w))
		}
		if optional {
			paths = append(paths, next...)
		} else {
			paths = next
		}
	}
	for _, m := range flagRe.FindAllStringSubmatch(s, -1) {
		flags = append(flags, m[1])
	}
	return paths, flags
}

// isCommandWord reports whether w can be a command's name.
func isCommandWord(w string) bool {
	if w == "" || w[0] < 'a' || w[0] > 'z' {
		return false
	}
	for _, c := range w {
		if (c < 'a' || c > 'z') && c != '-' {
			return false
		}
	}
	return true
}

// commandSpans returns the command lines (spans starting "templatecenter ")
// of Markdown text, after the program's name.
func commandSpans(text string) []span {
	var out []span
	for _, s := range mdSpans(text) {
		if rest, ok := strings.CutPrefix(s.text, "templatecenter "); ok {
			out = append(out, span{rest, s.line})
		}
	}
	return out
}

// readmeCommands returns the command lines of the README's command table
// (the table whose first header cell is "command").
func readmeCommands(text string) []span {
	var out []span
	for _, t := range mdTables(text) {
		if t.header[0] != "command" {
			continue
		}
		for i, r := range t.rows {
			if m := spanRe.FindStringSubmatch(r[0]); m != nil {
				if rest, ok := strings.CutPrefix(m[1], "templatecenter "); ok {
					out = append(out, span{rest, t.lines[i]})
				}
			}
		}
	}
	return out
}

// manLine is one line of a man page: its macro (".TP", ".B"; "" for text)
// and its text with the roff removed.
type manLine struct {
	macro, text string
	line        int
}

var roffEscapes = strings.NewReplacer(`\-`, "-", `\fR`, "", `\fP`, "", `\fB`, "", `\fI`, "", `\(dq`, `"`, `\&`, "", `\e`, `\`, `\ `, " ")

// deroff returns the lines of a man page with the roff removed: a font
// macro's arguments are joined as printed (.BR a b: "ab"), quotes removed.
func deroff(text string) []manLine {
	var out []manLine
	for i, l := range strings.Split(text, "\n") {
		ml := manLine{line: i + 1}
		if strings.HasPrefix(l, ".") {
			macro, args, _ := strings.Cut(l, " ")
			ml.macro = macro
			switch macro {
			case ".B", ".I", ".SH", ".SS", ".TP":
				ml.text = strings.ReplaceAll(args, `"`, "")
			case ".BR", ".RB", ".BI", ".IB", ".IR", ".RI":
				ml.text = strings.Join(roffArgs(args), "")
			default:
				ml.text = args
			}
		} else {
			ml.text = l
		}
		ml.text = roffEscapes.Replace(ml.text)
		out = append(out, ml)
	}
	return out
}

// roffArgs splits a macro's arguments, honouring double quotes.
func roffArgs(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, any := false, false
	for _, c := range s {
		switch {
		case c == '"':
			quoted, any = !quoted, true
		case c == ' ' && !quoted:
			if any {
				out = append(out, cur.String())
			}
			cur.Reset()
			any = false
		default:
			cur.WriteRune(c)
			any = true
		}
	}
	if any {
		out = append(out, cur.String())
	}
	return out
}

// manNames returns the names a man page's text uses.
func manNames(file, text string, sections map[string]bool) []ref {
	var out []ref
	for _, l := range deroff(text) {
		out = append(out, namesIn(l.text, file+":"+strconv.Itoa(l.line), sections)...)
	}
	return out
}

// manCommand is a command as the man page documents it.
type manCommand struct {
	paths []string
	flags []string
	where string
}

// manCommands returns the commands of a man page: each SYNOPSIS line (up
// to .br) and each entry of COMMANDS (a .TP outside .RS, to the next one),
// with every flag its text names.
func manCommands(file, text string) []manCommand {
	var out []manCommand
	section, depth := "", 0
	var cur *manCommand
	var synopsis strings.Builder
	synStart := 0 // the line a SYNOPSIS entry starts on
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	lines := deroff(text)
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case l.macro == ".SH":
			flush()
			section, depth = l.text, 0
			continue
		case section == "SYNOPSIS" && l.macro != ".br":
			if synopsis.Len() == 0 {
				synStart = l.line
			}
			synopsis.WriteString(" " + l.text)
			if i+1 < len(lines) && lines[i+1].macro != ".SH" {
				continue
			}
			fallthrough
		case section == "SYNOPSIS":
			if rest, ok := strings.CutPrefix(strings.TrimSpace(synopsis.String()), "templatecenter"); ok {
				paths, flags := commandLine(rest)
				out = append(out, manCommand{paths, flags, file + ":" + strconv.Itoa(synStart)})
			}
			synopsis.Reset()
			continue
		case section != "COMMANDS":
			continue
		case l.macro == ".RS":
			depth++
		case l.macro == ".RE":
			depth--
		case l.macro == ".TP" && depth == 0 && i+1 < len(lines):
			flush()
			i++
			paths, flags := commandLine(lines[i].text)
			cur = &manCommand{paths, flags, file + ":" + strconv.Itoa(lines[i].line)}
			continue
		}
		if cur != nil {
			for _, m := range flagRe.FindAllStringSubmatch(l.text, -1) {
				cur.flags = append(cur.flags, m[1])
			}
		}
	}
	flush()
	return out
}

// helpCommands returns the command paths the usage (templatecenter -h)
// lists under "Commands:": lines indented by two spaces, read up to the
// column where the first line's description starts.
func helpCommands(usage string) []string {
	var out []string
	in, col := false, 0
	for _, l := range strings.Split(usage, "\n") {
		switch {
		case l == "Commands:":
			in = true
		case in && l == "":
			in = false
		case in && strings.HasPrefix(l, "  ") && !strings.HasPrefix(l, "   "):
			if col == 0 {
				m := helpColumnRe.FindStringIndex(l)
				if m == nil {
					return nil
				}
				col = m[1] - 1
			}
			paths, _ := commandLine(l[:min(col, len(l))])
			out = append(out, paths...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// helpColumnRe finds where a usage line's description starts.
var helpColumnRe = regexp.MustCompile(`^  \S.*?\s{2,}\S`)

// helpFlags returns the flags a command's -h lists (lines "  -name ..."
// under "Flags"), -h itself left out.
func helpFlags(help string) []string {
	var out []string
	in := false
	for _, l := range strings.Split(help, "\n") {
		switch {
		case strings.HasPrefix(l, "Flags"):
			in = true
		case in && strings.HasPrefix(l, "  -") && !strings.HasPrefix(l, "  -h, --help"):
			name := strings.TrimPrefix(l, "  -")
			if i := strings.IndexAny(name, " \t,"); i >= 0 {
				name = name[:i]
			}
			out = append(out, name)
		}
	}
	return out
}

// flagName returns a flag without its dashes: one or two are the same.
func flagName(f string) string { return strings.TrimLeft(f, "-") }

// served is a metric family /metrics serves: its type and label names.
type served struct {
	typ    string
	labels map[string]bool
}

// parseMetrics reads the Prometheus text format: the families by name,
// with their label names (a histogram's le left out).
func parseMetrics(text string) map[string]served {
	out := map[string]served{}
	for _, l := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			out[name] = served{typ: typ, labels: map[string]bool{}}
			continue
		}
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name, labels, _ := strings.Cut(strings.Fields(l)[0], "{")
		fam, ok := out[name]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, cut := strings.CutSuffix(name, suffix); !ok && cut {
				fam, ok = out[base]
			}
		}
		if !ok {
			continue
		}
		for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if k, _, found := strings.Cut(kv, "="); found && k != "le" && k != "quantile" {
				fam.labels[k] = true
			}
		}
	}
	return out
}
