package agent

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"github.com/cubesandbox/cubetemplatecenter/agent/liveprogress"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

// redisHarness is an agent harness, not started, publishing live progress
// to the package's Redis server.
func redisHarness(t *testing.T) (*dbserver.Redis, *harness) {
	t.Helper()
	srv := dbs.Redis(t)
	h := newHarness(t, nil)
	pub, err := liveprogress.New(liveprogress.Options{Nodes: []string{srv.Addr}, Password: srv.Password},
		slog.New(slog.NewTextHandler(h.logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(context.Background()) })
	h.live = pub
	return srv, h
}

// TestLiveProgressInRedis: a build's pull progress is in CubeMaster's
// Redis while the job runs, with a TTL, and gone once it ended; /health
// shows the Redis check. With Redis down the build is not slowed or
// failed, and /health stays ready with a warning.
func TestLiveProgressInRedis(t *testing.T) {
	ctx := context.Background()
	srv, h := redisHarness(t)
	entered, release := h.pauseAtPublish()
	h.start()
	rdb := srv.Client()
	defer rdb.Close()

	h.submit("job-live", "alpine:3")
	<-entered
	key := liveprogress.Key("job-live")
	wait.For(t, "the progress hash", func() bool {
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
	if code, body := h.health(false); code != http.StatusOK || !body.Checks["redis"] {
		t.Errorf("health = %d %v, want redis true", code, body)
	}
	close(release)
	if cb := h.terminal("job-live"); cb.Field("status") != "BUILT" {
		t.Fatalf("terminal report: %v", cb.Body)
	}
	wait.For(t, "the progress hash to go", func() bool { return rdb.Exists(ctx, key).Val() == 0 })

	stopServer(t, srv)
	h.builder.beforePublish = nil
	h.submit("job-down", "alpine:4")
	if cb := h.terminal("job-down"); cb.Field("status") != "BUILT" {
		t.Fatalf("build with Redis down: %v", cb.Body)
	}
	code, body := h.waitHealth("Redis down", func(_ int, b healthBody) bool { return !b.Checks["redis"] })
	if code != http.StatusOK || body.Checks["redis"] || body.Warnings["redis"] == "" {
		t.Errorf("health with Redis down = %d %v, want 200 with a redis warning", code, body)
	}
}

// TestHealthRunsNoCheckPerRequest: /health, /readyz and the status line
// read the checker's last round: a burst of requests sends Redis no more
// PINGs than the rounds that ran meanwhile.
func TestHealthRunsNoCheckPerRequest(t *testing.T) {
	ctx := context.Background()
	srv, h := redisHarness(t)
	h.start()
	rdb := srv.Client()
	defer rdb.Close()
	pings := func() int {
		t.Helper()
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		// cmdstat_ping:calls=N,usec=...
		_, rest, ok := strings.Cut(info, "cmdstat_ping:calls=")
		if !ok {
			return 0
		}
		n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		return n
	}
	before, start := pings(), time.Now()
	const requests = 60
	for i := range requests {
		path := []string{"/health", "/readyz"}[i%2]
		resp, err := http.Get(h.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d", path, resp.StatusCode)
		}
	}
	h.health(true) // the verbose answer reads the same round
	// One PING a round, a round every checkEvery (and one that may be
	// under way when the burst starts).
	rounds := int(time.Since(start)/checkEvery) + 2
	if got := pings() - before; got > rounds {
		t.Errorf("%d requests sent Redis %d PINGs, want at most the %d rounds that ran", requests+1, got, rounds)
	}
}
