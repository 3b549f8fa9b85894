package startcheck

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// countingFS counts the calls the check makes of the FS it wraps, and
// the bytes it asks of ReadAt.
type countingFS struct {
	FS
	lstats, reads, readAtBytes int
}

func (c *countingFS) ReadAt(p string, b []byte, off int64) (int, error) {
	c.readAtBytes += len(b)
	return c.FS.ReadAt(p, b, off)
}

func (c *countingFS) Lstat(p string) (Entry, error) {
	c.lstats++
	return c.FS.Lstat(p)
}

func (c *countingFS) ReadHead(p string, n int) ([]byte, error) {
	c.reads++
	return c.FS.ReadHead(p, n)
}

// maxReads bounds the FS.ReadHead calls of one check: the command, its
// interpreter and the command env runs, their loaders, the envd, passwd
// and group, each read at most twice.
const maxReads = 32

// chainDepth is the longest symlink chain one resolution follows.
const chainDepth = maxLinks - 1

// hostileTree is a merged-/usr tree with the traps hostile specs point
// into: a symlink to itself, a dangling one, a chain of symlinks as long
// as one resolution follows, and a directory 1,500 levels deep holding
// an executable.
func hostileTree() *memFS {
	m := debianAmd64()
	m.link("/l", "/l")
	m.link("/dangle", "/nowhere")
	for i := range chainDepth {
		m.link("/c/"+strconv.Itoa(i), "/c/"+strconv.Itoa(i+1))
	}
	m.link("/c/"+strconv.Itoa(chainDepth), "/usr/local/bin")
	m.file(deepDir+"/x", 0o755, amd64Static)
	// Libraries: a program needing 600 libraries of long names that
	// need each other in a ring, one needing a library through a search
	// path of 2,500 directories, and one whose dynamic section lies 16
	// MiB in.
	const lib = "/usr/lib/x86_64-linux-gnu/"
	var ring []string
	for i := range 600 {
		ring = append(ring, fmt.Sprintf("lib%03d%s.so", i, strings.Repeat("r", 200)))
	}
	for i, name := range ring {
		m.lib(lib+name, dynOpts{soname: name, needed: []string{ring[(i+1)%len(ring)], ring[(i+7)%len(ring)], "libnone.so"}})
	}
	var bombDirs []string
	for i := range 2500 {
		bombDirs = append(bombDirs, "/"+strconv.Itoa(i))
	}
	m.file("/usr/bin/needy", 0o755, mkDynELF(dynOpts{interp: amd64Loader, needed: ring}))
	m.file("/usr/bin/rpathbomb", 0o755, mkDynELF(dynOpts{interp: amd64Loader, needed: []string{"libnone.so", "libother.so"},
		rpath: ptr(strings.Join(bombDirs, ":"))}))
	m.file("/usr/bin/far", 0o755, mkDynELF(dynOpts{interp: amd64Loader, needed: []string{ring[0]}, far: 16 << 20}))
	return m
}

// deepDir is 1,500 directories deep, 3,000 bytes long: within PATH_MAX.
var deepDir = strings.Repeat("/d", 1500)

// repeatList joins n copies of s with sep.
func repeatList(s string, n int, sep string) string {
	return strings.TrimSuffix(strings.Repeat(s+sep, n), sep)
}

// hostileSpecs are image configs built to make the check work hard or
// write much: the PATH bomb and its cousins.
func hostileSpecs() []struct {
	name  string
	spec  Spec
	want  string // Result.Result
	first string // a substring of Problems[0]
} {
	many := make([]string, 5000)
	for i := range many {
		many[i] = "VAR" + strconv.Itoa(i) + "=" + strings.Repeat("v", 100)
	}
	manyEnv := append(many, "BIG="+strings.Repeat("x", 1<<20), "PATH=/"+strings.Repeat("a", 1<<20))
	args := make([]string, 10000)
	for i := range args {
		args[i] = strings.Repeat("<\x01", 50)
	}
	longName := strings.Repeat("n", 4000)
	return []struct {
		name  string
		spec  Spec
		want  string
		first string
	}{
		// The finding: 20,000 PATH entries, each a symlink loop.
		{"PathBomb", Spec{Argv: []string{"app"}, Env: []string{"PATH=" + repeatList("/l", 20000, ":")}},
			ResultWarnings, "the search stopped at"},
		{"PathBombLongName", Spec{Argv: []string{longName}, Env: []string{"PATH=" + repeatList("/l", 20000, ":")}},
			ResultFailed, "longer than the 255"},
		// The 8 MiB config limit filled by the PATH.
		{"PathFillsConfig", Spec{Argv: []string{"app"}, Env: []string{"PATH=" + repeatList("/l", 8<<20/3, ":")}},
			ResultWarnings, "of the 2796202 entries of PATH"},
		// The search's bound leaves the rest of the check its share.
		{"PathBombThenUser", Spec{Argv: []string{"app"}, Env: []string{"PATH=" + repeatList("/l", 20000, ":")}, User: "ghost"},
			ResultFailed, `user "ghost" not found in /etc/passwd`},
		{"LongPathName", Spec{Argv: []string{"/" + longName}}, ResultFailed, "longer than the 255"},
		{"LongAbsoluteCommand", Spec{Argv: []string{strings.Repeat("/a", 4000)}}, ResultFailed, "longer than the 4095"},
		{"WorkingDirTooDeep", Spec{Argv: []string{"./x"}, WorkingDir: strings.Repeat("/d", 3000)},
			ResultFailed, "working directory"},
		// Deep but legal: found, within the bounds.
		{"WorkingDirDeep", Spec{Argv: []string{"./x"}, WorkingDir: deepDir}, ResultOK, ""},
		// Three paths 1,500 levels deep: the third passes the bound.
		{"WorkingDirDeepEnvd", Spec{Argv: []string{"./x"}, WorkingDir: deepDir, Envd: deepDir + "/x"},
			ResultWarnings, "check cut short at"},
		{"WorkingDirDeepRelativePath", Spec{Argv: []string{"app"}, WorkingDir: deepDir, Env: []string{"PATH=" + repeatList(".", 20000, ":")}},
			ResultWarnings, "more than 2048 lookups in one PATH search"},
		{"HugeEnv", Spec{Argv: []string{"app"}, Env: manyEnv}, ResultFailed, "longer than the 4095"},
		{"ManyArgs", Spec{Argv: append([]string{"python3"}, args...)}, ResultOK, ""},
		{"SymlinkChains", Spec{Argv: []string{"python3"}, Env: []string{"PATH=" + repeatList("/c/0", 100, ":")}},
			ResultWarnings, "more than 512 symlinks followed in one PATH search"},
		// Found after 200 dangling entries: 200 warnings, eight shown.
		{"ManyWarnings", Spec{Argv: []string{"python3"}, Env: []string{"PATH=" + repeatList("/dangle", 200, ":") + ":/usr/bin"}},
			ResultWarnings, "skipped on PATH"},
		{"LongUser", Spec{Argv: []string{"python3"}, User: strings.Repeat("u", 1<<20) + ":" + strings.Repeat("<", 1<<20)},
			ResultFailed, "not found in /etc/passwd"},
		{"LongEnvd", Spec{Argv: []string{"python3"}, Envd: strings.Repeat("/e", 3000)}, ResultFailed, "envd"},
		// Libraries: more than a check loads, a ring of them; a search
		// path of loops; a library path bomb; a far dynamic section.
		{"ManyLibraries", Spec{Argv: []string{"needy"}}, ResultWarnings, "more than 256 libraries in one check"},
		{"RpathBomb", Spec{Argv: []string{"rpathbomb"}}, ResultWarnings, "but only the first 256 of the 2500 entries of a search path"},
		{"LibraryPathBomb", Spec{Argv: []string{"needy"}, Env: []string{"LD_LIBRARY_PATH=" + repeatList("/c/0", 20000, ":")}}, ResultWarnings, "symlinks followed for libraries"},
		// The libraries' share of the bounds leaves the envd its own.
		{"LibraryPathBombThenEnvd", Spec{Argv: []string{"needy"}, Env: []string{"LD_LIBRARY_PATH=" + repeatList("/c/0", 20000, ":")}, Envd: "/no/envd"}, ResultFailed, "envd"},
		{"FarDynamic", Spec{Argv: []string{"far"}}, ResultFailed, `library "libnone.so"`},
	}
}

// checkBounds fails unless r stays within what leaves the check: its
// JSON, each problem, and the error_message made of the first.
func checkBounds(t testing.TB, r Result) {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > safetext.TemplateCheckMax {
		t.Errorf("Check result is %d bytes of JSON, over %d", len(b), safetext.TemplateCheckMax)
	}
	if len(r.Command) > maxArgs || len(r.Problems) > safetext.ListMax || len(r.Libraries) > maxLibrariesShown {
		t.Errorf("Check result lists %d words, %d problems and %d libraries", len(r.Command), len(r.Problems), len(r.Libraries))
	}
	for name, p := range r.Libraries {
		if len(name) > maxLibraryNameJSON || len(p) > maxLibraryPathJSON {
			t.Errorf("a library of %d bytes at a path of %d bytes: %.200q", len(name), len(p), name)
			break
		}
	}
	for _, p := range r.Problems {
		if len(p) > maxProblemJSON {
			t.Errorf("a problem is %d bytes: %.200q…", len(p), p)
			break
		}
	}
	if len(r.Problems) > 0 {
		// rootfs.StartCheckError's message, the FAILED report's.
		if msg := "template start check: " + r.Problems[0]; len(msg) > safetext.MessageMax {
			t.Errorf("error_message would be %d bytes", len(msg))
		}
	}
}

// TestCheckBounds runs the check on hostile specs: whatever the spec, the
// check makes a bounded number of FS calls and its result, its JSON and
// the error message it makes stay within their limits.
func TestCheckBounds(t *testing.T) {
	for _, tc := range hostileSpecs() {
		t.Run(tc.name, func(t *testing.T) {
			fsys := &countingFS{FS: hostileTree()}
			tc.spec.Arch = "amd64"
			r := Check(fsys, tc.spec)
			t.Logf("Check made %d Lstat and %d ReadHead calls: %.600s", fsys.lstats, fsys.reads, mustJSON(t, r))
			if r.Result != tc.want {
				t.Errorf("Check: Result = %q, want %q (problems %.600q)", r.Result, tc.want, r.Problems)
			}
			if tc.first != "" && (len(r.Problems) == 0 || !strings.Contains(r.Problems[0], tc.first)) {
				t.Errorf("Check: first problem of %.600q does not say %q", r.Problems, tc.first)
			}
			if fsys.lstats > maxLookups || fsys.reads > maxReads || fsys.readAtBytes > maxCheckRead {
				t.Errorf("Check made %d Lstat calls (bound %d), %d ReadHead calls (bound %d) and read %d bytes with ReadAt (bound %d)",
					fsys.lstats, maxLookups, fsys.reads, maxReads, fsys.readAtBytes, maxCheckRead)
			}
			checkBounds(t, r)
		})
	}
	t.Run("ManyWarningsCounted", func(t *testing.T) {
		spec := Spec{Argv: []string{"python3"}, Env: []string{"PATH=" + repeatList("/dangle", 200, ":") + ":/usr/bin"}, Arch: "amd64"}
		r := Check(hostileTree(), spec)
		if last := r.Problems[len(r.Problems)-1]; last != "and 193 more" {
			t.Errorf("Check: last problem %q, want a count of the 193 left out", last)
		}
	})
}

// TestBounded bounds a result recorded by an earlier release, unbounded:
// the JSON fits and bounding again changes nothing.
func TestBounded(t *testing.T) {
	// Some hundred KiB of JSON, unbounded: far over the bound, small
	// enough to marshal.
	huge := strings.Repeat("<\x00\"é", 1000)
	r := Result{Result: huge, Command: make([]string, 200), Resolved: huge, Interpreter: huge, Problems: make([]string, 200)}
	for i := range r.Command {
		r.Command[i], r.Problems[i] = huge[:1000], huge
	}
	b := r.Bounded()
	checkBounds(t, b)
	if again := b.Bounded(); !reflect.DeepEqual(again, b) {
		t.Errorf("Bounded is not idempotent: %.300s, then %.300s", mustJSON(t, b), mustJSON(t, again))
	}
	w := worstResult()
	if !reflect.DeepEqual(w.Bounded(), w) {
		t.Fatalf("the worst case is not within the bounds")
	}
	if n := len(mustJSON(t, w)); n > resultJSONMax || n > safetext.TemplateCheckMax {
		t.Errorf("the worst bounded result is %d bytes of JSON, over %d", n, resultJSONMax)
	}
}

// worstResult is the worst a bounded result can be without libraries:
// every field at its bound, in characters JSON writes as six bytes.
func worstResult() Result {
	worst := func(n int) string { return strings.Repeat("<", n/6) }
	w := Result{Result: worst(maxResultJSON), Resolved: worst(maxPathJSON), Interpreter: worst(maxPathJSON)}
	for range maxArgs {
		w.Command = append(w.Command, worst(maxArgJSON))
	}
	for range safetext.ListMax {
		w.Problems = append(w.Problems, worst(maxProblemJSON))
	}
	return w
}

// FuzzCheck runs the check on specs shaped by the fuzzer over the hostile
// tree: a PATH of many copies of an entry, a command, a working
// directory, arguments, environment variables and a user. Whatever they
// are, the check's FS calls and its result stay bounded.
func FuzzCheck(f *testing.F) {
	f.Add("/l", uint16(20000), "app", "", uint16(0), uint16(0), "")
	f.Add("/l", uint16(20000), strings.Repeat("n", 4000), "", uint16(0), uint16(0), "")
	f.Add(".", uint16(20000), "app", deepDir, uint16(0), uint16(0), "")
	f.Add("/c/0", uint16(100), "python3", "/", uint16(10000), uint16(5000), "root")
	f.Add("/dangle", uint16(300), "python3", strings.Repeat("/d", 3000), uint16(1), uint16(1), strings.Repeat("u", 5000))
	f.Add("/usr/bin", uint16(1), "sh", "/srv", uint16(3), uint16(2), "www-data:www-data")
	f.Add("/bin", uint16(2), "./x", deepDir, uint16(0), uint16(0), "1000:1000")
	f.Add("/c/0", uint16(3000), "needy", "/", uint16(0), uint16(0), "")
	f.Add("/usr/lib/x86_64-linux-gnu", uint16(1), "rpathbomb", "/", uint16(1), uint16(1), "www-data")
	tree := hostileTree()
	f.Fuzz(func(t *testing.T, entry string, copies uint16, argv0, wd string, nArgs, nEnv uint16, user string) {
		// A few MiB of spec at most, as an 8 MiB config gives, so that
		// the fuzzer spends its time on shapes rather than on sizes.
		if len(entry) > 64 {
			entry = entry[:64]
		}
		n := min(int(copies), 1<<20/(len(entry)+1))
		env := make([]string, 0, int(nEnv)+1)
		for i := range int(nEnv) {
			env = append(env, "V"+strconv.Itoa(i)+"="+entry)
		}
		env = append(env, "PATH="+repeatList(entry, n, ":"), "LD_LIBRARY_PATH="+repeatList(entry, n, ":"))
		argv := []string{argv0}
		for range int(nArgs) {
			argv = append(argv, entry)
		}
		fsys := &countingFS{FS: tree}
		r := Check(fsys, Spec{Argv: argv, Env: env, WorkingDir: wd, User: user, Arch: "amd64", Envd: wd})
		if fsys.lstats > maxLookups || fsys.reads > maxReads || fsys.readAtBytes > maxCheckRead {
			t.Fatalf("Check made %d Lstat and %d ReadHead calls, and read %d bytes with ReadAt", fsys.lstats, fsys.reads, fsys.readAtBytes)
		}
		checkBounds(t, r)
	})
}
