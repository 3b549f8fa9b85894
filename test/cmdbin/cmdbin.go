// Package cmdbin builds the module's commands (templatecenter, tcimage)
// for the suites that run them as child processes: each variant once per
// test process, with cgo on as make build requires unless the variant
// asks for a static binary.
package cmdbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// module is the import path the commands live under, so that a build runs
// from any package directory of the module.
const module = "github.com/cubesandbox/cubetemplatecenter"

// Build is one variant of one of the module's commands.
type Build struct {
	// Command is the command's directory below cmd/; templatecenter when
	// empty.
	Command string
	// Version and Revision, when set, are linked in as main.Version and
	// main.Revision, as make build does.
	Version, Revision string
	// NoCgo builds with CGO_ENABLED=0: the daemon's spool then refuses to
	// open. Without it cgo is on, whatever the environment says.
	NoCgo bool
}

// built is one variant's outcome, reached through its own Once so that
// two variants build side by side.
type built struct {
	once sync.Once
	dir  string // the variant's own directory, so its binary keeps the command's name
	path string
	err  error
}

// cache holds the binaries of this test process. It is package state on
// purpose: several tests, and a TestMain, ask for the same binary, and
// linking it again for each would cost seconds apiece.
var cache = struct {
	mu     sync.Mutex
	dir    string
	builds map[Build]*built
}{builds: map[Build]*built{}}

// Path returns b's binary, building it on the first call of the test
// process; it fails tb when the build fails.
func (b Build) Path(tb testing.TB) string {
	tb.Helper()
	path, err := b.Binary()
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// Binary returns b's binary, building it on the first call of the test
// process, for callers with no test at hand (a TestMain, a fixture shared
// by the package's tests). A failed build is remembered: every later call
// returns its error.
func (b Build) Binary() (string, error) {
	if b.Command == "" {
		b.Command = "templatecenter"
	}
	v, err := entry(b)
	if err != nil {
		return "", err
	}
	v.once.Do(func() {
		v.path = filepath.Join(v.dir, b.Command)
		v.err = b.run(v.path)
	})
	return v.path, v.err
}

// entry returns b's place in the cache, making the process's build
// directory on first use.
func entry(b Build) (*built, error) {
	cache.mu.Lock()
	defer cache.mu.Unlock()
	if cache.dir == "" {
		dir, err := os.MkdirTemp("", "cmdbin-")
		if err != nil {
			return nil, fmt.Errorf("create build directory: %w", err)
		}
		cache.dir = dir
	}
	v, ok := cache.builds[b]
	if !ok {
		v = &built{dir: filepath.Join(cache.dir, strconv.Itoa(len(cache.builds)))}
		cache.builds[b] = v
	}
	return v, nil
}

// run compiles b into out.
func (b Build) run(out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("create build directory: %w", err)
	}
	pkg := module + "/cmd/" + b.Command
	args := []string{"build", "-o", out}
	var ldflags []string
	if b.Version != "" {
		ldflags = append(ldflags, "-X main.Version="+b.Version)
	}
	if b.Revision != "" {
		ldflags = append(ldflags, "-X main.Revision="+b.Revision)
	}
	if len(ldflags) > 0 {
		args = append(args, "-ldflags", strings.Join(ldflags, " "))
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cgo := "1"
	if b.NoCgo {
		cgo = "0"
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("CGO_ENABLED=%s go %s: %w\n%s", cgo, strings.Join(cmd.Args[1:], " "), err, out)
	}
	return nil
}

// Cleanup removes every binary built so far; a TestMain calls it after
// m.Run. A later call builds again.
func Cleanup() {
	cache.mu.Lock()
	defer cache.mu.Unlock()
	if cache.dir != "" {
		os.RemoveAll(cache.dir)
	}
	cache.dir, cache.builds = "", map[Build]*built{}
}
