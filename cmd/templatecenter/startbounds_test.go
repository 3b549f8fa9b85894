package main

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// maxStartCheckRSS bounds the agent's peak memory over builds of images
// whose configs fill the 8 MiB config limit with the PATH bomb.
const maxStartCheckRSS = 256 << 20

// bombPath is a PATH of n entries that each loop (/l -> /l in bombLayer).
func bombPath(n int) string {
	return "PATH=" + strings.TrimSuffix(strings.Repeat("/l:", n), ":")
}

// bombLayer is the tree the hostile configs point into: /l, a symlink to
// itself, and /c/0, a chain of 40 symlinks ending at the root.
func bombLayer(t testing.TB) images.Layer {
	t.Helper()
	entries := []tarFile{{name: "l", typ: tar.TypeSymlink, mode: 0o777, link: "/l"}, {name: "c/", typ: tar.TypeDir, mode: 0o755}}
	for i := range 39 {
		entries = append(entries, tarFile{name: "c/" + strconv.Itoa(i), typ: tar.TypeSymlink, mode: 0o777, link: strconv.Itoa(i + 1)})
	}
	entries = append(entries, tarFile{name: "c/39", typ: tar.TypeSymlink, mode: 0o777, link: "/"})
	return images.Layer{Tar: layerTar(t, entries...)}
}

// watchRSS kills the process pid when its peak resident set passes
// limit, so that a build whose memory is not bounded ends the test
// instead of taking the machine; stop ends the watch.
func watchRSS(pid int, limit int64, kill func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				return
			}
			for line := range strings.SplitSeq(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
					kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
					if kb<<10 > limit {
						kill()
						return
					}
				}
			}
		}
	}()
	return func() { close(done) }
}

// TestHostileStartSpecBounded builds, through the agent binary and the
// CubeMaster stand-in, images whose configs carry the PATH bomb and its
// cousins: 20,000 looping PATH entries, a 4,000-byte command name, a
// working directory 3,000 levels deep, thousands of arguments and
// variables and a 1 MiB value, a chain of symlinks on every PATH entry,
// and the 8 MiB config limit filled by the bomb or by variables. Every
// terminal report's error_message stays within 4 KiB and its
// template_check within 16 KiB, the spool's job row and the agent's log
// lines are as bounded, and the agent's peak memory stays under
// maxStartCheckRSS. Configs over CubeMaster's image_config_json column
// are refused before the check.
// configRefused is what a report says of a config too large to store.
const configRefused = "over the 65535 bytes CubeMaster can store"

func TestHostileStartSpecBounded(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	reg := images.StartRegistry(t, nil)
	h := newHarness(t, cm.URL(), testToken)
	h.set("registry.insecure", []string{reg.Host})
	h.set("build.max_concurrent_builds", 1)
	agent := h.startAgent("agent (hostile start specs)")
	stopWatch := watchRSS(agent.cmd.Process.Pid, 4*maxStartCheckRSS, func() { agent.cmd.Process.Kill() })
	defer stopWatch()

	longName := strings.Repeat("n", 4000)
	args := []string{"app"}
	for range 5000 {
		args = append(args, strings.Repeat("<\x01", 50))
	}
	env := []string{"BIG=" + strings.Repeat("x", 1<<20)}
	for i := range 3000 {
		env = append(env, fmt.Sprintf("VAR%d=%s", i, strings.Repeat("v", 100)))
	}
	// The bomb filling the config up to the limit, with room for the
	// rest of the config; and the limit filled with variables.
	fill := bombPath((oci.MaxConfigBytes - 32<<10) / 3)
	var manyVars []string
	for size := 0; size < oci.MaxConfigBytes-64<<10; size += len(manyVars[len(manyVars)-1]) + 3 {
		manyVars = append(manyVars, "V"+strconv.Itoa(len(manyVars))+"=")
	}
	cases := []struct {
		name   string
		config v1.Config
		status string
		want   string // in error_message (FAILED) or template_check (BUILT)
	}{
		{"PathBomb", v1.Config{Cmd: []string{"app"}, Env: []string{bombPath(20000)}}, "BUILT", "the search stopped at"},
		{"PathBombLongName", v1.Config{Cmd: []string{longName}, Env: []string{bombPath(20000)}}, "FAILED", "longer than the 255"},
		// A config larger than CubeMaster's image_config_json column
		// is refused before the start check (or any layer) runs; the
		// check's own bounds on such specs are rootfs/startcheck's
		// TestCheckBounds. The agent's memory is measured over them too.
		{"ArgsAndEnv", v1.Config{Entrypoint: args, Env: env}, "FAILED", configRefused},
		{"DeepWorkingDir", v1.Config{Cmd: []string{"./x"}, WorkingDir: strings.Repeat("/d", 3000)}, "FAILED", "longer than the 4095"},
		{"SymlinkChains", v1.Config{Cmd: []string{"app"}, Env: []string{"PATH=" + strings.TrimSuffix(strings.Repeat("/c/0:", 100), ":")}},
			"BUILT", "more than 512 symlinks followed in one PATH search"},
		{"FilledConfigVariables", v1.Config{Cmd: []string{"app"}, Env: manyVars}, "FAILED", configRefused},
		{"FilledConfigLongName", v1.Config{Cmd: []string{longName}, Env: []string{fill}}, "FAILED", configRefused},
		{"FilledConfigWalk", v1.Config{Cmd: []string{"app"}, Env: []string{fill}, User: "ghost"}, "FAILED", configRefused},
	}
	for _, c := range cases {
		ref := reg.Push(t, "startbounds/"+strings.ToLower(c.name)+":v1", images.New(t, images.Config{Config: c.config}, bombLayer(t)))
		jobID := "startbounds-" + strings.ToLower(c.name)
		submit(t, h.baseURL(), testToken, jobID, ref)
		// The spool first: unbounded, the report may be too large for
		// the stand-in to accept.
		show := h.waitShow(jobID, "a terminal state", func(s jobShow) bool { return terminalState(s.Job.State) })
		if n := len(show.Job.Error); n > safetext.MessageMax {
			t.Errorf("%s: the spool's job row holds an error_message of %d bytes", c.name, n)
		}
		cb := waitTerminal(t, cm, jobID)
		msg := cb.Field("error_message")
		tc, err := json.Marshal(cb.Body["template_check"])
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s, error_message %d bytes, template_check %d bytes: %.300s %.300s", c.name, cb.Field("status"), len(msg), len(tc), msg, tc)
		if cb.Field("status") != c.status {
			t.Errorf("%s: terminal report %s, want %s", c.name, cb.Field("status"), c.status)
		}
		if !strings.Contains(msg+string(tc), c.want) {
			t.Errorf("%s: the report does not say %q", c.name, c.want)
		}
		if len(msg) > safetext.MessageMax {
			t.Errorf("%s: error_message is %d bytes, over %d", c.name, len(msg), safetext.MessageMax)
		}
		if len(tc) > safetext.TemplateCheckMax {
			t.Errorf("%s: template_check is %d bytes, over %d", c.name, len(tc), safetext.TemplateCheckMax)
		}
	}
	agent.stop(t)

	for _, line := range strings.Split(agent.out.String(), "\n") {
		if len(line) > safetext.MessageMax+1024 {
			t.Errorf("the agent logged a line of %d bytes: %.200s…", len(line), line)
		}
	}
	peak := agent.cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10 // KiB on Linux
	t.Logf("agent peak RSS %d MiB", peak>>20)
	if peak > maxStartCheckRSS {
		t.Errorf("the agent's peak RSS reached %d MiB, over %d MiB", peak>>20, maxStartCheckRSS>>20)
	}
}
