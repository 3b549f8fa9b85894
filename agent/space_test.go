package agent

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/tmpfs"
)

func TestHealthAndMetricsShowSpace(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	code, body := h.health(true)
	if code != http.StatusOK || !body.Checks["store_space"] || !body.Checks["spool_space"] {
		t.Fatalf("health = %d %+v, want ok with both space checks", code, body)
	}
	store, spool := body.Space["store"], body.Space["spool"]
	if store.SizeBytes <= 0 || store.FreeBytes <= 0 || store.FreeBytes > store.SizeBytes || store.Dir != h.cfg.Store.Dir {
		t.Errorf("store space = %+v", store)
	}
	if want := int64(float64(store.SizeBytes) * h.cfg.Store.MinFree.Percent / 100); store.ReserveBytes != want {
		t.Errorf("store reserve = %d, want %v%% of %d = %d", store.ReserveBytes, h.cfg.Store.MinFree.Percent, store.SizeBytes, want)
	}
	if spool.SizeBytes <= 0 || spool.ReserveBytes != int64(h.cfg.Spool.MinFree.Bytes) || spool.ReserveBytes == 0 {
		t.Errorf("spool space = %+v, want the default spool.min_free %s as its reserve", spool, h.cfg.Spool.MinFree)
	}
	if work := body.Space["work_dir"]; work.SizeBytes <= 0 || work.Dir != h.cfg.Store.WorkDir || work.ReserveBytes == 0 || !body.Checks["work_dir_space"] {
		t.Errorf("work_dir space = %+v (check %v), want the store.work_dir volume with store.min_free as its reserve", work, body.Checks["work_dir_space"])
	}
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`cube_templatecenter_volume_free_bytes{volume="store"}`, `cube_templatecenter_volume_free_bytes{volume="spool"}`,
		`cube_templatecenter_volume_size_bytes{volume="store"}`, `cube_templatecenter_volume_reserve_bytes{volume="store"}`,
		`cube_templatecenter_volume_scrape_success{volume="store"} 1`,
		`cube_templatecenter_volume_reserve_bytes{volume="spool"}`, `cube_templatecenter_volume_free_bytes{volume="work_dir"}`,
	} {
		if !strings.Contains(string(text), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestHealthNotReadyBelowReserve(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	reserved := *h.agent.config()
	reserved.Store.MinFree = config.Reserve{Percent: 100}
	h.agent.cfg.Store(&reserved)
	code, body := h.waitHealth("the store below its reserve", func(code int, _ healthBody) bool { return code != http.StatusOK })
	if code != http.StatusServiceUnavailable || body.Checks["store_space"] || !strings.Contains(body.Errors["store_space"], "store.min_free") {
		t.Errorf("health with the whole store reserved = %d %+v, want 503 naming store.min_free", code, body)
	}
	if !body.Checks["spool"] || !body.Checks["store"] {
		t.Errorf("other checks failed too: %+v", body.Checks)
	}
}

// truncateWAL empties the spool's WAL through a connection of its own, so
// that the next commit must grow the file rather than reuse its frames.
func truncateWAL(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var busy, log, done int
		err := db.QueryRow("PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &log, &done)
		if err == nil && busy == 0 && log == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("truncate the spool's WAL: busy %d, log %d, err %v", busy, log, err)
		}
	}
}

// submitRaw posts a build and returns the answer's status, Retry-After and
// error message.
func submitRaw(t *testing.T, h *harness, id string) (int, string, string) {
	t.Helper()
	data, _ := json.Marshal(buildBody(id, "registry.test/app:v1"))
	req, _ := http.NewRequest(http.MethodPost, h.url+"/tc/api/v1/build", bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(api.TokenHeader, testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]string
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), body["error"]
}

// TestFullSpoolVolume puts the spool on a small tmpfs, accepts a job (held
// mid-build), then fills the filesystem. Submits must answer 503 with a
// Retry-After (CubeMaster retries it; a 500 fails the job for good):
// refused before trying when the volume is below spool.min_free, and when
// the commit itself fails (no reserve set). /health names the spool below
// its reserve. The job accepted before is not lost: it ends BUILT once
// space is back.
func TestFullSpoolVolume(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reserve config.Reserve
	}{
		{"BelowReserve", config.Reserve{Bytes: 1 << 20}},
		{"CommitFails", config.Reserve{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tmpfs.Mount(t, "8m")
			h := newHarness(t, func(c *config.Config) {
				c.Spool.Path = filepath.Join(dir, "spool.db")
				c.Spool.MinFree = tc.reserve
			})
			entered, release := h.pauseAtPublish()
			h.start()
			h.submit("kept", "registry.test/app:v1")
			<-entered
			truncateWAL(t, h.cfg.Spool.Path)
			filler := tmpfs.Fill(t, dir)

			code, retry, msg := submitRaw(t, h, "refused")
			if code != http.StatusServiceUnavailable || retry == "" || !strings.Contains(msg, "spool") {
				t.Errorf("submit with the spool volume full = %d (Retry-After %q) %q; want 503 with a Retry-After naming the spool", code, retry, msg)
			}
			code, body := h.waitHealth("the spool volume full", func(code int, _ healthBody) bool { return code != http.StatusOK })
			if tc.reserve.Bytes > 0 {
				if !strings.Contains(msg, "spool.min_free") {
					t.Errorf("submit refusal %q does not name spool.min_free", msg)
				}
				if code != http.StatusServiceUnavailable || body.Checks["spool_space"] || !strings.Contains(body.Errors["spool_space"], "spool.min_free") {
					t.Errorf("health with the spool volume full = %d %+v; want 503 naming spool.min_free", code, body)
				}
			} else if code != http.StatusServiceUnavailable || body.Checks["spool_writes"] || !strings.Contains(body.Errors["spool_writes"], "spool") {
				t.Errorf("health after the spool refused a commit = %d %+v; want 503 with the spool_writes check failing", code, body)
			}
			if _, err := h.sp.Job(context.Background(), "refused"); err == nil {
				t.Error("the refused job is in the spool")
			}

			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			close(release)
			if cb := h.terminal("kept"); cb.Field("status") != "BUILT" {
				t.Errorf("job accepted before the disk filled ended %v, want BUILT", cb.Body)
			}
			h.submit("retried", "registry.test/app:v1")
			if code, body := h.waitHealth("space back", func(code int, _ healthBody) bool { return code == http.StatusOK }); code != http.StatusOK {
				t.Errorf("health after space came back and a submit committed = %d %+v, want 200", code, body)
			}
			if _, err := h.sp.Job(context.Background(), "kept"); err != nil {
				t.Errorf("job kept: %v", err)
			}
		})
	}
}

// TestStopPromptWithSpoolDiskFull: the terminal report is delivered while
// the spool's disk is full, so it cannot leave the outbox. The reporter
// must not post it again and again, and a stop must end within a few
// seconds, not wait out shutdown.timeout.
func TestStopPromptWithSpoolDiskFull(t *testing.T) {
	dir := tmpfs.Mount(t, "8m")
	h := newHarness(t, func(c *config.Config) {
		c.Spool.Path = filepath.Join(dir, "spool.db")
		c.Spool.MinFree = config.Reserve{}
		c.Shutdown.Timeout = 30 * time.Second
	})
	h.master.Hold()
	h.start()
	h.submit("done", "img")
	h.waitJob("done", spool.StateBuilt)
	// Once only the terminal report is left, having failed once, fill
	// the disk and let CubeMaster accept it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		reps, _ := h.sp.Reports(context.Background(), "done")
		if len(reps) == 1 && reps[0].Terminal && reps[0].Attempts >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox = %+v; want only the terminal report, retried", reps)
		}
	}
	truncateWAL(t, h.cfg.Spool.Path)
	filler := tmpfs.Fill(t, dir)
	defer os.Remove(filler)
	h.master.Release()
	// Not h.terminal: the report cannot leave the outbox, by design.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.master.WaitTerminal(ctx, "done"); err != nil {
		t.Fatalf("terminal report: %v", err)
	}
	time.Sleep(time.Second)
	start := time.Now()
	h.stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("stop took %s with the spool disk full; want a few seconds at most", took)
	}
	terminal := 0
	for _, c := range h.master.Callbacks("done") {
		if c.Terminal() {
			terminal++
		}
	}
	if terminal < 1 || terminal >= 20 {
		t.Errorf("terminal report delivered %d times; want at least once and fewer than 20", terminal)
	}
}
