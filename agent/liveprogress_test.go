package agent

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/liveprogress"
)

// TestLiveProgressInRedis: a build's pull progress is in CubeMaster's
// Redis while the job runs, with a TTL, and gone once it ended; /health
// shows the Redis check. With Redis down the build is not slowed or
// failed, and /health stays ready with a warning.
func TestLiveProgressInRedis(t *testing.T) {
	srv := dbs.Redis(t)
	ctx := context.Background()
	h := newHarness(t, nil)
	pub, err := liveprogress.New(liveprogress.Options{Nodes: []string{srv.Addr}, Password: srv.Password},
		slog.New(slog.NewTextHandler(h.logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(ctx) })
	h.live = pub
	entered, release := h.pauseAtPublish()
	h.start()
	rdb := srv.Client()
	defer rdb.Close()

	h.submit("job-live", "alpine:3")
	<-entered
	key := liveprogress.Key("job-live")
	waitFor(t, "the progress hash", func() bool {
		v, err := rdb.HGet(ctx, key, "pull_total_bytes").Result()
		return err == nil && v == "1000"
	})
	fields, err := rdb.HGetAll(ctx, key).Result()
	if err != nil || fields["job_id"] != "job-live" || fields["pull_completed_layers"] != "1" || fields["pull_total_layers"] != "1" {
		t.Errorf("progress hash = %v, %v", fields, err)
	}
	if ttl, err := rdb.TTL(ctx, key).Result(); err != nil || ttl < 50*time.Minute {
		t.Errorf("progress TTL = %v, %v; want about an hour", ttl, err)
	}
	if code, body := health(t, h); code != http.StatusOK || body["checks"].(map[string]any)["redis"] != true {
		t.Errorf("health = %d %v, want redis true", code, body)
	}
	close(release)
	if cb := h.terminal("job-live"); cb.Field("status") != "BUILT" {
		t.Fatalf("terminal report: %v", cb.Body)
	}
	waitFor(t, "the progress hash to go", func() bool { return rdb.Exists(ctx, key).Val() == 0 })

	stopServer(t, srv)
	h.builder.beforePublish = nil
	h.submit("job-down", "alpine:4")
	if cb := h.terminal("job-down"); cb.Field("status") != "BUILT" {
		t.Fatalf("build with Redis down: %v", cb.Body)
	}
	code, body := health(t, h)
	if code != http.StatusOK || body["checks"].(map[string]any)["redis"] != false || body["warnings"].(map[string]any)["redis"] == nil {
		t.Errorf("health with Redis down = %d %v, want 200 with a redis warning", code, body)
	}
}
