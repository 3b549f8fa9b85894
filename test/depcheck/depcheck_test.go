package depcheck

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/cubesandbox/cubetemplatecenter"

// rule says which project packages a package may import directly (its
// non-test files). Patterns are module-relative; "x/..." matches x and
// everything below it. The most specific rule for a package applies.
type rule struct {
	pkg   string
	allow []string
}

// rules is the architecture. A package with no rule fails the test, so a
// new package is placed in the graph on purpose.
var rules = []rule{
	{"cmd/templatecenter", []string{"agent", "agent/api", "agent/config", "agent/blobstore", "agent/masterdb", "agent/liveprogress", "agent/tracing",
		"spool", "rootfs", "rootfs/inspect", "rootfs/layercodec"}},
	{"cmd/tcdemo", []string{"test/..."}},
	// The image builder packs a built binary: it imports nothing of the
	// module.
	{"cmd/tcimage", nil},
	// The daemon shell wires the packages below it.
	{"agent", []string{"agent/...", "spool", "rootfs"}},
	{"agent/api", nil},
	// The build jobs use the artifacts; the artifacts know no job.
	{"agent/jobs", []string{"agent/api", "agent/artifacts", "agent/config", "agent/tracing", "spool", "rootfs"}},
	{"agent/artifacts", []string{"agent/api", "agent/blobstore", "agent/config", "agent/masterdb", "agent/tracing", "spool", "rootfs"}},
	// Test helpers opening the test S3 server as a blob store.
	{"agent/blobstore/blobstoretest", []string{"agent/blobstore", "test/..."}},
	// Configuration and the blob store name backends as the wire
	// contract does.
	{"agent/config", []string{"agent/api"}},
	// The artifact blob store takes plain options: no config, no agent.
	{"agent/blobstore", []string{"agent/api"}},
	// CubeMaster's database takes plain options too.
	{"agent/masterdb", nil},
	// So does the publisher of live pull progress to CubeMaster's Redis,
	// which shares the wire contract's progress type.
	{"agent/liveprogress", []string{"agent/api"}},
	// The reporter continues each job's stored trace context.
	{"agent/report", []string{"agent/api", "agent/tracing", "spool"}},
	// The readiness checks take their checks as functions.
	{"agent/health", nil},
	// The HTTP observation knows no route but those it is told are probes.
	{"agent/httpobs", nil},
	// The volumes' room is read from the configuration, measured as the
	// image builder measures its store.
	{"agent/space", []string{"agent/config", "rootfs"}},
	// The scrape-time collectors read the spool and the layer cache
	// through small interfaces.
	{"agent/collect", []string{"rootfs"}},
	// Tracing knows only OpenTelemetry and the W3C headers.
	{"agent/tracing", nil},
	{"spool", nil},
	{"rootfs", []string{"rootfs/..."}},
	{"rootfs/...", []string{"rootfs/..."}},
	// The leaves of rootfs: the layer cache knows no image source, the
	// codecs and the ext4 writer know no other package of the module.
	{"rootfs/blobcache", []string{"rootfs/layercodec", "rootfs/internal/fsutil"}},
	{"rootfs/layercodec", nil},
	{"rootfs/ext4", nil},
	{"rootfs/inspect", nil},
	// The start check reads a tree through its own FS interface, so the
	// builder and the inspect command can both feed it.
	{"rootfs/startcheck", nil},
	// The text bounds (see leaves).
	{"rootfs/safetext", nil},
	// Test fixtures of rootfs may use the project's test images.
	{"rootfs/internal/...", []string{"rootfs/...", "test/..."}},
	// imagetest knows no ext4, so that rootfs/ext4's own tests can use it.
	{"rootfs/internal/imagetest", []string{"test/..."}},
	{"bench/...", []string{"bench", "test/...", "rootfs/..."}},
	// The chart's tests import only the Kubernetes API types, in test files.
	{"test/helmchart", nil},
	// The alert rules' and dashboard's tests run the agent binary and
	// Prometheus; only their test files import the module's test helpers.
	{"test/alerts", nil},
	// The link model stands in front of any HTTP server: it knows no other
	// package of the module.
	{"test/linkproxy", nil},
	// The documentation check runs the built binary: outside its tests it
	// imports nothing of the module.
	{"test/docscheck", nil},
	// The suites' builds of the module's commands run go build on the
	// commands' import paths: the package imports none of them.
	{"test/cmdbin", nil},
	// The rules file's shape knows no other package of the module.
	{"test/promrules", nil},
	{"test/...", []string{"test/..."}},
}

// leaves are packages every package of the module may import: they import
// nothing of the module and no third-party module, so they add no edge to
// the architecture. The text bounds must be reachable wherever untrusted
// text leaves TC, the wire contract included.
var leaves = []string{"rootfs/safetext"}

// isLeaf reports whether pkg is one of leaves.
func isLeaf(pkg string) bool { return slices.Contains(leaves, pkg) }

// never lists what may not appear anywhere among a package's transitive
// project imports, whatever the direct rules say.
var never = map[string][]string{
	"agent/api": {"rootfs/...", "spool/..."},
	"spool":     {"agent/...", "rootfs/...", "cmd/..."},
	"rootfs":    {"agent/...", "spool/...", "cmd/..."},
	"agent":     {"cmd/..."},
	// Below the shell nothing reaches back up into it.
	"agent/jobs":      {"agent", "cmd/..."},
	"agent/artifacts": {"agent", "agent/jobs", "agent/report", "cmd/..."},
}

func match(pattern, pkg string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

// ruleFor returns the most specific rule matching pkg.
func ruleFor(pkg string) (rule, bool) {
	best, found := rule{}, false
	for _, r := range rules {
		if !match(r.pkg, pkg) {
			continue
		}
		exact := !strings.HasSuffix(r.pkg, "/...")
		bestExact := !strings.HasSuffix(best.pkg, "/...")
		if !found || (exact && !bestExact) || (exact == bestExact && len(r.pkg) > len(best.pkg)) {
			best, found = r, true
		}
	}
	return best, found
}

// violations checks a graph of module-relative package paths to their
// direct project imports against the rules.
func violations(graph map[string][]string) []string {
	var bad []string
	for pkg, imports := range graph {
		r, ok := ruleFor(pkg)
		if !ok {
			bad = append(bad, pkg+": no rule places this package in the architecture")
			continue
		}
		if isLeaf(pkg) && len(imports) > 0 {
			bad = append(bad, pkg+" is a leaf every package may import, yet imports "+strings.Join(imports, ", "))
		}
		for _, imp := range imports {
			if isLeaf(imp) {
				continue
			}
			if !slices.ContainsFunc(r.allow, func(p string) bool { return match(p, imp) }) {
				bad = append(bad, pkg+" imports "+imp)
			}
		}
	}
	for root, forbidden := range never {
		for pkg := range graph {
			if !match(root+"/...", pkg) {
				continue
			}
			for _, dep := range closure(graph, pkg) {
				if !isLeaf(dep) && slices.ContainsFunc(forbidden, func(p string) bool { return match(p, dep) }) {
					bad = append(bad, pkg+" depends on "+dep+" (never allowed below "+root+")")
				}
			}
		}
	}
	sort.Strings(bad)
	return slices.Compact(bad)
}

func closure(graph map[string][]string, pkg string) []string {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(p string) {
		for _, imp := range graph[p] {
			if !seen[imp] {
				seen[imp] = true
				walk(imp)
			}
		}
	}
	walk(pkg)
	return slices.Sorted(func(yield func(string) bool) {
		for p := range seen {
			if !yield(p) {
				return
			}
		}
	})
}

// stdlibOnly lists the packages that may import nothing but the standard
// library: the wire contract must not change because a dependency did.
var stdlibOnly = append([]string{"agent/api"}, leaves...)

// testOnlyModules are import path prefixes no package's non-test files may
// import: the Kubernetes API types check the Helm chart's manifests
// (test/helmchart) and must never reach the binary.
var testOnlyModules = []string{"k8s.io/", "sigs.k8s.io/"}

// testOnlyViolations lists non-test imports of the test-only modules.
func testOnlyViolations(external map[string][]string) []string {
	var bad []string
	for pkg, imports := range external {
		for _, imp := range imports {
			if slices.ContainsFunc(testOnlyModules, func(p string) bool { return strings.HasPrefix(imp, p) }) {
				bad = append(bad, pkg+" imports "+imp+" outside its tests")
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// projectGraph reads the non-test imports of every package in the module:
// the module's own packages (module-relative) in graph, the others (third
// party, outside the standard library) in external.
func projectGraph(t *testing.T) (graph, external map[string][]string) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	graph, external = map[string][]string{}, map[string][]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "bin" || name == "dist") {
			return filepath.SkipDir
		}
		p, err := build.ImportDir(path, 0)
		if err != nil {
			if _, ok := err.(*build.NoGoError); ok {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		var own []string
		for _, imp := range p.Imports {
			if r, ok := strings.CutPrefix(imp, module+"/"); ok {
				own = append(own, r)
			} else if first, _, _ := strings.Cut(imp, "/"); strings.Contains(first, ".") {
				external[rel] = append(external[rel], imp)
			}
		}
		graph[rel] = own
		return nil
	})
	if err != nil {
		t.Fatalf("read packages: %v", err)
	}
	if len(graph) < 10 {
		t.Fatalf("found only %d packages below %s: is the walk broken?", len(graph), root)
	}
	return graph, external
}

func TestImports(t *testing.T) {
	graph, external := projectGraph(t)
	for _, v := range violations(graph) {
		t.Error(v)
	}
	for _, v := range testOnlyViolations(external) {
		t.Error(v)
	}
	for _, pkg := range stdlibOnly {
		if _, ok := graph[pkg]; !ok {
			t.Errorf("%s not found", pkg)
		}
		for _, imp := range external[pkg] {
			t.Errorf("%s imports %s; it may use the standard library only", pkg, imp)
		}
	}
}

// TestRulesCatch proves the checker rejects each kind of forbidden import.
func TestRulesCatch(t *testing.T) {
	cases := []struct {
		name  string
		graph map[string][]string
		want  string
	}{
		{"APIImportsRootfs", map[string][]string{"agent/api": {"rootfs"}, "rootfs": nil}, "agent/api imports rootfs"},
		{"SpoolImportsRootfs", map[string][]string{"spool": {"rootfs"}, "rootfs": nil}, "spool imports rootfs"},
		{"RootfsImportsSpool", map[string][]string{"rootfs/flatten": {"spool"}, "spool": nil}, "rootfs/flatten imports spool"},
		{"RootfsImportsAgent", map[string][]string{"rootfs": {"agent"}, "agent": nil}, "rootfs imports agent"},
		{"AgentPastFacade", map[string][]string{"agent": {"rootfs/oci"}, "rootfs/oci": nil}, "agent imports rootfs/oci"},
		{"CacheKnowsSources", map[string][]string{"rootfs/blobcache": {"rootfs/oci"}, "rootfs/oci": nil}, "rootfs/blobcache imports rootfs/oci"},
		{"AgentImportsCmd", map[string][]string{"agent": {"cmd/templatecenter"}, "cmd/templatecenter": nil}, "agent imports cmd/templatecenter"},
		{"Transitive", map[string][]string{"agent/api": {"agent/config"}, "agent/config": {"spool"}, "spool": nil}, "agent/api depends on spool (never allowed below agent/api)"},
		{"LeafImports", map[string][]string{"rootfs/safetext": {"rootfs/ext4"}, "rootfs/ext4": nil}, "rootfs/safetext is a leaf every package may import, yet imports rootfs/ext4"},
		{"UnknownPackage", map[string][]string{"newpkg": nil}, "newpkg: no rule places this package in the architecture"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := violations(c.graph)
			if !slices.Contains(got, c.want) {
				t.Errorf("violations(%v) = %q, want it to contain %q", c.graph, got, c.want)
			}
		})
	}
	if got := violations(map[string][]string{"cmd/templatecenter": {"agent", "rootfs"}, "agent": {"spool", "rootfs", "agent/api"}, "agent/api": {"rootfs/safetext"}, "rootfs/safetext": nil, "spool": nil, "rootfs": {"rootfs/ext4"}, "rootfs/ext4": nil}); len(got) != 0 {
		t.Errorf("violations of the allowed graph: %q", got)
	}
}

// TestTestOnlyCatch proves a non-test import of the Kubernetes modules is
// reported, and that other third-party imports are not.
func TestTestOnlyCatch(t *testing.T) {
	got := testOnlyViolations(map[string][]string{
		"agent":              {"k8s.io/api/core/v1"},
		"cmd/templatecenter": {"sigs.k8s.io/yaml", "github.com/prometheus/client_golang/prometheus"},
	})
	want := []string{"agent imports k8s.io/api/core/v1 outside its tests", "cmd/templatecenter imports sigs.k8s.io/yaml outside its tests"}
	if !slices.Equal(got, want) {
		t.Errorf("testOnlyViolations = %q, want %q", got, want)
	}
}

// packageMap reads the packages docs/packages.md names: the backticked
// names in the first column of its tables, "x/*" and "x/..." meaning x's
// subpackages.
func packageMap(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/packages.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for line := range strings.Lines(string(raw)) {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		for _, part := range strings.Split(cells[1], ",") {
			names = append(names, strings.Trim(strings.TrimSpace(part), "`"))
		}
	}
	return names
}

// mapCovers reports whether a package map entry names pkg.
func mapCovers(entry, pkg string) bool {
	if base, ok := strings.CutSuffix(entry, "/*"); ok {
		return strings.HasPrefix(pkg, base+"/")
	}
	return match(entry, pkg)
}

// TestPackageMapMatchesTree: docs/packages.md names every package of the
// module, names none that does not exist, and names every package the
// rules above place one by one: the map and the rules describe one tree.
func TestPackageMapMatchesTree(t *testing.T) {
	graph, _ := projectGraph(t)
	entries := packageMap(t)
	if len(entries) < 10 {
		t.Fatalf("read only %d packages from docs/packages.md: is its table format changed?", len(entries))
	}
	for pkg := range graph {
		if !slices.ContainsFunc(entries, func(e string) bool { return mapCovers(e, pkg) }) {
			t.Errorf("docs/packages.md does not name package %s", pkg)
		}
	}
	for _, e := range entries {
		found := false
		for pkg := range graph {
			if mapCovers(e, pkg) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("docs/packages.md names %s, which is no package of the module", e)
		}
	}
	for _, r := range rules {
		if strings.HasSuffix(r.pkg, "/...") {
			continue
		}
		if !slices.ContainsFunc(entries, func(e string) bool { return mapCovers(e, r.pkg) }) {
			t.Errorf("the rules place %s, but docs/packages.md does not name it", r.pkg)
		}
	}
}
