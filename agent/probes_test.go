package agent

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
)

// probeBody is what /livez and /readyz answer.
type probeBody struct {
	Status string             `json:"status"`
	Checks map[string]bool    `json:"checks"`
	Errors map[string]string  `json:"errors"`
	Loops  map[string]float64 `json:"loops_seconds_since_round"`
}

// getProbe fetches path with the token (so a failing check's reason
// shows) and decodes its body.
func getProbe(t *testing.T, client *http.Client, h *harness, path string) (int, probeBody) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.url+path, nil)
	req.Header.Set(api.TokenHeader, testToken)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var b probeBody
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("GET %s: body %q: %v", path, raw, err)
	}
	return resp.StatusCode, b
}

// waitProbe polls path until cond holds on its answer.
func waitProbe(t *testing.T, h *harness, path, what string, cond func(int, probeBody) bool) probeBody {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, b := getProbe(t, http.DefaultClient, h, path)
		if cond(code, b) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s never happened; last answer %d %+v", path, what, code, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hangingServer accepts TCP connections and never writes a byte: a
// database that hangs. accepted receives each connection as it comes.
func hangingServer(t *testing.T) (addr string, accepted <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan net.Conn, 1024)
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case ch <- c:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String(), ch
}

// TestProbesWithHungDatabase: with CubeMaster's database accepting
// connections and never answering, /livez answers 200 and /readyz 503
// naming the database, and both answer many callers while the database
// check is blocked on that connection: the handlers never wait on it.
func TestProbesWithHungDatabase(t *testing.T) {
	addr, accepted := hangingServer(t)
	openCtx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	// The driver's own bounds are far beyond the test: only the checker's
	// timeout ends a ping.
	db, err := masterdb.Open(openCtx, masterdb.Options{Driver: masterdb.DriverMySQL, Addr: addr, User: "tc", Password: "pw",
		DBName: "cube", ConnTimeout: time.Hour, ReadTimeout: time.Hour, WriteTimeout: time.Hour, MaxOpenConns: 4, MaxIdleConns: 2})
	cancel()
	if err != nil {
		t.Fatalf("open database on a hanging server: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	h := newHarness(t, nil)
	h.database = db
	h.waitPath = "/livez" // /health waits on the database
	h.start()

	// The checker's ping holds a connection the server never answers.
	select {
	case <-accepted:
	case <-time.After(30 * time.Second):
		t.Fatal("the readiness checker never connected to the database")
	}
	// That the handlers never wait on a check is health's own test
	// (TestReadersNeverWait); here the agent's probes answer many callers
	// while the database hangs.
	client := &http.Client{Timeout: 20 * time.Second}
	// Under load: many callers at once, all answered, /livez always 200.
	var wg sync.WaitGroup
	codes := make(chan [2]int, 600)
	for range 20 {
		wg.Go(func() {
			for range 10 {
				for _, path := range []string{"/livez", "/readyz", "/health"} {
					resp, err := client.Get(h.url + path)
					if err != nil {
						t.Errorf("GET %s: %v", path, err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					p := 0
					if path != "/livez" {
						p = 1
					}
					codes <- [2]int{p, resp.StatusCode}
				}
			}
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c[0] == 0 && c[1] != http.StatusOK {
			t.Errorf("/livez = %d with the database hanging, want 200", c[1])
		}
	}

	b := waitProbe(t, h, "/readyz", "503 naming the database", func(code int, b probeBody) bool {
		return code == http.StatusServiceUnavailable && b.Errors["database"] != ""
	})
	if b.Status != "not_ready" || b.Checks["database"] || !b.Checks["spool"] || !b.Checks["store"] {
		t.Errorf("/readyz with the database hanging = %+v, want not_ready with only the database failing", b)
	}
	if code, b := getProbe(t, http.DefaultClient, h, "/livez"); code != http.StatusOK || b.Status != "ok" {
		t.Errorf("/livez with the database hanging = %d %+v, want 200", code, b)
	}
}

// TestReadyzBelowReserve: the store below its reserve takes the replica
// out of service (/readyz 503 naming store.min_free) but is no reason to
// restart it (/livez 200).
func TestReadyzBelowReserve(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	waitProbe(t, h, "/readyz", "200", func(code int, _ probeBody) bool { return code == http.StatusOK })
	reserved := *h.agent.config()
	reserved.Store.MinFree = config.Reserve{Percent: 100}
	h.agent.cfg.Store(&reserved)
	b := waitProbe(t, h, "/readyz", "503 naming store.min_free", func(code int, b probeBody) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(b.Errors["store_space"], "store.min_free")
	})
	if !b.Checks["spool"] || !b.Checks["store"] {
		t.Errorf("other readiness checks failed too: %+v", b)
	}
	if code, b := getProbe(t, http.DefaultClient, h, "/livez"); code != http.StatusOK {
		t.Errorf("/livez with the store below its reserve = %d %+v, want 200", code, b)
	}
	// A probe's 503 is an answer, not a refused request: no WARN line
	// every few seconds.
	if line, ok := findLogLine(h.logs.String(), "path=/readyz"); ok {
		t.Errorf("a /readyz 503 was logged as a rejection: %s", line)
	}
}

// TestLivezStuckReporter: a reporter stuck on a callback CubeMaster never
// answers makes /livez fail once its bound (shortened here) passes, and
// pass again once it goes round; /readyz is not affected.
func TestLivezStuckReporter(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Master.CallbackTimeout = time.Hour })
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	// Registered after the harness: runs before the agent stops.
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	h.master.Respond(func(string, map[string]any) int {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return 0
	})
	h.loopBounds = map[string]time.Duration{loopReporter: time.Second}
	h.start()
	waitProbe(t, h, "/livez", "200", func(code int, _ probeBody) bool { return code == http.StatusOK })
	h.submit("stuck-report", "img")
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no callback reached CubeMaster")
	}
	b := waitProbe(t, h, "/livez", "503 naming the reporter", func(code int, b probeBody) bool {
		return code == http.StatusServiceUnavailable && b.Errors[loopReporter] != ""
	})
	if b.Status != "stalled" || b.Errors[loopDispatcher] != "" || b.Errors[loopStatus] != "" {
		t.Errorf("/livez with the reporter stuck = %+v, want stalled naming the reporter only", b)
	}
	if code, b := getProbe(t, http.DefaultClient, h, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz with the reporter stuck = %d %+v, want 200", code, b)
	}
	// The stand-in holds its lock while the callback waits: release first.
	once.Do(func() { close(release) })
	h.master.Respond(nil)
	waitProbe(t, h, "/livez", "200 once the reporter goes round", func(code int, _ probeBody) bool { return code == http.StatusOK })
}

// TestLivezWhileStopping: a stopping agent is alive (its loops have
// ended, and a restart would cut the drain short) and not ready.
func TestLivezWhileStopping(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.agent.stopping.Store(true)
	defer h.agent.stopping.Store(false)
	if code, b := getProbe(t, http.DefaultClient, h, "/livez"); code != http.StatusOK || b.Status != "stopping" {
		t.Errorf("/livez while stopping = %d %+v, want 200 stopping", code, b)
	}
	if code, b := getProbe(t, http.DefaultClient, h, "/readyz"); code != http.StatusServiceUnavailable || b.Errors["accepting"] == "" {
		t.Errorf("/readyz while stopping = %d %+v, want 503 naming accepting", code, b)
	}
}

// TestProbeDetailNeedsToken: without the token /health answers upstream's
// shape and /readyz its status and checks, neither a path, a size nor a
// raw error; ?verbose without the token is refused; with the token both
// carry the reasons.
func TestProbeDetailNeedsToken(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	if err := os.RemoveAll(h.cfg.Store.Dir); err != nil {
		t.Fatal(err)
	}
	h.waitHealth("the store missing", func(code int, _ healthBody) bool { return code != http.StatusOK })
	for _, path := range []string{"/health", "/readyz"} {
		resp, err := http.Get(h.url + path)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body map[string]any
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatalf("GET %s: %q: %v", path, raw, err)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || body["status"] != "not_ready" || body["checks"].(map[string]any)["store"] != false {
			t.Errorf("GET %s without the token = %d %s, want 503 not_ready with the store check false", path, resp.StatusCode, raw)
		}
		for _, leak := range []string{h.cfg.Store.Dir, h.cfg.Spool.Path, `"errors"`, `"space"`, `"warnings"`} {
			if strings.Contains(string(raw), leak) {
				t.Errorf("GET %s without the token shows %q: %s", path, leak, raw)
			}
		}
		if path == "/health" && len(body) != 2 {
			t.Errorf("/health without the token = %s, want only status and checks (upstream's shape)", raw)
		}

		resp, err = http.Get(h.url + path + "?verbose")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(raw), h.cfg.Store.Dir) {
			t.Errorf("GET %s?verbose without the token = %d %s, want 401", path, resp.StatusCode, raw)
		}
		code, b := getProbe(t, http.DefaultClient, h, path)
		if code != http.StatusServiceUnavailable || !strings.Contains(b.Errors["store"], h.cfg.Store.Dir) {
			t.Errorf("GET %s with the token = %d %+v, want the store's error", path, code, b)
		}
	}
	if _, b := h.health(true); b.Space["store"].Dir != h.cfg.Store.Dir {
		t.Errorf("/health with the token lacks the store's space: %+v", b.Space)
	}
	wait.For(t, "the status line naming the store", func() bool {
		return slices.ContainsFunc(h.notifications(), func(n string) bool {
			return strings.HasPrefix(n, "STATUS=") && strings.HasSuffix(n, "; not ready: store")
		})
	})
	if got := h.metric("health_check_success", "check", "store"); got != 0 {
		t.Errorf("health_check_success{check=store} = %v with the store missing, want 0", got)
	}
	if got := h.metric("health_check_success", "check", "spool"); got != 1 {
		t.Errorf("health_check_success{check=spool} = %v, want 1", got)
	}
}
