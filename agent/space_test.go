package agent

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

type healthBody struct {
	Status string               `json:"status"`
	Checks map[string]bool      `json:"checks"`
	Errors map[string]string    `json:"errors"`
	Space  map[string]spaceView `json:"space"`
}

func getHealth(t *testing.T, h *harness) (int, healthBody) {
	t.Helper()
	resp, err := http.Get(h.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body healthBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decode /health: %v", err)
	}
	return resp.StatusCode, body
}

func TestHealthAndMetricsShowSpace(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	code, body := getHealth(t, h)
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
	if spool.SizeBytes <= 0 || spool.ReserveBytes != 0 {
		t.Errorf("spool space = %+v", spool)
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
	code, body := getHealth(t, h)
	if code != http.StatusServiceUnavailable || body.Checks["store_space"] || !strings.Contains(body.Errors["store_space"], "store.min_free") {
		t.Errorf("health with the whole store reserved = %d %+v, want 503 naming store.min_free", code, body)
	}
	if !body.Checks["spool"] || !body.Checks["store"] {
		t.Errorf("other checks failed too: %+v", body.Checks)
	}
}
