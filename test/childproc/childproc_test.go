package childproc

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"
)

// childEnv makes the test binary act as the child: it says ready, then
// exits 0 on SIGTERM.
const childEnv = "CHILDPROC_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM)
		fmt.Println("ready")
		<-stop
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestStartStopsAtTestEnd: a process started by Start is gone when its
// test ends: asked with SIGTERM when there is a grace (the child exits 0),
// killed at once without one.
func TestStartStopsAtTestEnd(t *testing.T) {
	for _, tc := range []struct {
		name     string
		grace    time.Duration
		wantCode int
	}{{"Grace", 10 * time.Second, 0}, {"NoGrace", 0, -1}} {
		t.Run(tc.name, func(t *testing.T) {
			var cmd *exec.Cmd
			var exited <-chan struct{}
			t.Run("Child", func(t *testing.T) {
				cmd = exec.Command(os.Args[0])
				cmd.Env = append(os.Environ(), childEnv+"=1")
				out := &Output{}
				cmd.Stdout, cmd.Stderr = out, out
				exited = Start(t, "child", cmd, out, tc.grace)
				wait.For(t, "the child ready", func() bool { return strings.Contains(out.String(), "ready") })
			})
			select {
			case <-exited:
			case <-time.After(wait.Limit):
				t.Fatal("the child still runs after its test ended")
			}
			if got := cmd.ProcessState.ExitCode(); got != tc.wantCode {
				t.Errorf("exit code %d, want %d (%s)", got, tc.wantCode, cmd.ProcessState)
			}
		})
	}
}

// TestWaitHTTP: the wait ends at the first 200, and otherwise says what
// the URL answered last, whether the time ran out or the process ended.
func TestWaitHTTP(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ready" && calls.Add(1) > 2 {
			return
		}
		http.Error(w, "not yet", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	if err := WaitHTTP(t.Context(), srv.URL+"/ready", nil, wait.Limit); err != nil || calls.Load() != 3 {
		t.Errorf("WaitHTTP of a URL ready at the third call = %v after %d calls, want nil after 3", err, calls.Load())
	}
	err := WaitHTTP(t.Context(), srv.URL+"/never", nil, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "503 not yet") {
		t.Errorf("WaitHTTP of a URL never ready = %v, want the last answer, 503 not yet", err)
	}
	exited := make(chan struct{})
	close(exited)
	err = WaitHTTP(t.Context(), srv.URL+"/never", exited, wait.Limit)
	if err == nil || !strings.Contains(err.Error(), "exited before answering") || !strings.Contains(err.Error(), "503 not yet") {
		t.Errorf("WaitHTTP after the process exited = %v, want exited before answering, with the last answer", err)
	}
}
