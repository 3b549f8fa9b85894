package liveprogress

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

var servers dbserver.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	servers.Close()
	os.Exit(code)
}

// waitDeadline bounds every wait for the publisher's background work.
const waitDeadline = 30 * time.Second

// newWriter opens a writer to srv with opts' rate settings and
// closes it at cleanup.
func newWriter(tb testing.TB, srv *dbserver.Redis, opts Options) *Writer {
	tb.Helper()
	opts.Nodes = []string{srv.Addr}
	if opts.Password == "" {
		opts.Password = srv.Password
	}
	p, err := New(opts, slog.New(slog.NewTextHandler(testWriter{tb}, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return p
}

// testWriter sends the publisher's log to the test's log.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.tb.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// client is a direct connection to srv, for checks around the publisher.
func client(tb testing.TB, srv *dbserver.Redis) *redis.Client {
	tb.Helper()
	c := srv.Client()
	tb.Cleanup(func() { c.Close() })
	return c
}

// fields reads a progress hash as the wire has it.
func fields(tb testing.TB, c *redis.Client, jobID string) map[string]string {
	tb.Helper()
	m, err := c.HGetAll(context.Background(), Key(jobID)).Result()
	if err != nil {
		tb.Fatalf("HGETALL %s: %v", Key(jobID), err)
	}
	return m
}

func exists(tb testing.TB, c *redis.Client, jobID string) bool {
	tb.Helper()
	n, err := c.Exists(context.Background(), Key(jobID)).Result()
	if err != nil {
		tb.Fatalf("EXISTS %s: %v", Key(jobID), err)
	}
	return n == 1
}

func ttl(tb testing.TB, c *redis.Client, jobID string) time.Duration {
	tb.Helper()
	d, err := c.TTL(context.Background(), Key(jobID)).Result()
	if err != nil {
		tb.Fatalf("TTL %s: %v", Key(jobID), err)
	}
	return d
}

// jobID returns a job ID no earlier run used, so that tests on the shared
// server never see each other's keys.
func jobID(name string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return name + "-" + hex.EncodeToString(b)
}

// pullOf is a Pull whose every field derives from n, so a hash shows which
// Update it came from.
func pullOf(n int64) api.Pull {
	return api.Pull{TotalBytes: 1 << 30, DownloadedBytes: n, TotalLayers: 7, CompletedLayers: int(n % 8), SpeedBPS: 1000 + n}
}

func TestWriteFieldsAndTTL(t *testing.T) {
	srv := servers.Redis(t)
	c := client(t, srv)
	p := newWriter(t, srv, Options{MinInterval: 10 * time.Millisecond})
	job := jobID("job-fields")

	for i := range int64(4) {
		n := 1000 + i
		if i > 0 {
			// Lower the TTL: the next write must raise it again.
			if err := c.Expire(context.Background(), Key(job), 100*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			if d := ttl(t, c, job); d > 100*time.Second {
				t.Fatalf("TTL after EXPIRE 100 = %s", d)
			}
		}
		before := time.Now().UnixMilli()
		p.Update(job, pullOf(n))
		wait.For(t, fmt.Sprintf("write %d", i), func() bool { return fields(t, c, job)["pull_downloaded_bytes"] == strconv.FormatInt(n, 10) })
		after := time.Now().UnixMilli() // updated_at_ms is the write's time
		got := fields(t, c, job)
		want := map[string]string{"job_id": job, "pull_total_bytes": "1073741824", "pull_downloaded_bytes": strconv.FormatInt(n, 10),
			"pull_total_layers": "7", "pull_completed_layers": strconv.FormatInt(n%8, 10), "pull_speed_bps": strconv.FormatInt(1000+n, 10)}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("write %d: field %s = %q, want %q", i, k, got[k], v)
			}
		}
		if at, err := strconv.ParseInt(got["updated_at_ms"], 10, 64); err != nil || at < before || at > after {
			t.Errorf("write %d: updated_at_ms = %q, want a time in [%d, %d]", i, got["updated_at_ms"], before, after)
		}
		if len(got) != len(want)+1 {
			t.Errorf("write %d: hash has %d fields, want %d: %v", i, len(got), len(want)+1, got)
		}
		if d := ttl(t, c, job); d <= 3500*time.Second || d > KeyTTL {
			t.Errorf("write %d: TTL = %s, want just under %s", i, d, KeyTTL)
		}
	}
}

// monitor records the commands a Redis server runs, from MONITOR.
type monitor struct {
	conn  net.Conn
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

// startMonitor connects to srv and waits until MONITOR is on, so every
// command after it returns is seen.
func startMonitor(tb testing.TB, srv *dbserver.Redis) *monitor {
	tb.Helper()
	conn, err := net.Dial("tcp", srv.Addr)
	if err != nil {
		tb.Fatal(err)
	}
	m := &monitor{conn: conn, done: make(chan struct{})}
	tb.Cleanup(func() { conn.Close(); <-m.done })
	fmt.Fprintf(conn, "AUTH %s\r\nMONITOR\r\n", srv.Password)
	r := bufio.NewReader(conn)
	for _, want := range []string{"+OK", "+OK"} {
		line, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != want {
			tb.Fatalf("start MONITOR: %q, %v", line, err)
		}
	}
	go func() {
		defer close(m.done)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			m.mu.Lock()
			m.lines = append(m.lines, strings.TrimSpace(line))
			m.mu.Unlock()
		}
	}()
	return m
}

// commands returns the writes seen so far that touch key, each as its
// lower-case name and arguments without quotes, in order.
func (m *monitor) commands(key string) [][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out [][]string
	for _, line := range m.lines {
		_, rest, ok := strings.Cut(line, "] ")
		if !ok {
			continue
		}
		var args []string
		for _, a := range strings.Split(rest, `" "`) {
			args = append(args, strings.Trim(a, `"`))
		}
		name := strings.ToLower(args[0])
		// Keep what changes the key: the script's HSET and EXPIRE (not its
		// EVAL) and DEL, not the test's own reads.
		if !slices.Contains([]string{"hset", "expire", "del"}, name) || len(args) < 2 || args[1] != key {
			continue
		}
		out = append(out, append([]string{name}, args[1:]...))
	}
	return out
}

func TestRateLimitAndFinish(t *testing.T) {
	srv := servers.Redis(t)
	c := client(t, srv)
	mon := startMonitor(t, srv)
	// With an interval of an hour, every value after a job's first waits
	// for Finish, whatever the machine's speed.
	p := newWriter(t, srv, Options{MinInterval: time.Hour})
	jobs := []string{jobID("job-rate-a"), jobID("job-rate-b"), jobID("job-rate-c")}
	for _, job := range jobs {
		p.Update(job, pullOf(1))
	}
	wait.For(t, "the first writes", func() bool { return testutil.ToFloat64(p.writes) == float64(len(jobs)) })
	const updates = 500
	var wg sync.WaitGroup
	for _, job := range jobs {
		wg.Go(func() {
			for n := int64(2); n <= updates; n++ {
				p.Update(job, pullOf(n))
			}
		})
	}
	wg.Wait()
	for _, job := range jobs {
		if got := fields(t, c, job)["pull_downloaded_bytes"]; got != "1" {
			t.Errorf("%s: pull_downloaded_bytes = %q after the burst, want the first value 1", job, got)
		}
		p.Finish(job)
	}
	wait.For(t, "the deletes", func() bool { return testutil.ToFloat64(p.deletes) == float64(len(jobs)) })
	for _, job := range jobs {
		if exists(t, c, job) {
			t.Errorf("%s: key left after Finish", job)
		}
	}
	if w := testutil.ToFloat64(p.writes); w != float64(2*len(jobs)) {
		t.Errorf("writes = %v for %d updates of %d jobs, want %d (first and final of each)", w, updates, len(jobs), 2*len(jobs))
	}
	// The server saw, for each key: the first value with its TTL, the
	// final value with its TTL, then the deletion.
	for _, job := range jobs {
		key := Key(job)
		var seen [][]string
		wait.For(t, "MONITOR to show "+job+"'s deletion", func() bool {
			seen = mon.commands(key)
			return len(seen) > 0 && seen[len(seen)-1][0] == "del"
		})
		var summary []string
		for _, cmd := range seen {
			s := cmd[0]
			switch cmd[0] {
			case "hset":
				for i := 2; i+1 < len(cmd); i += 2 {
					if cmd[i] == "pull_downloaded_bytes" {
						s += " " + cmd[i+1]
					}
				}
			case "expire":
				s += " " + strings.Join(cmd[2:], " ")
			}
			summary = append(summary, s)
		}
		want := "hset 1,expire 3600,hset 500,expire 3600,del"
		if got := strings.Join(summary, ","); got != want {
			t.Errorf("%s: commands %q, want %q", job, got, want)
		}
	}
}

func TestMaxJobs(t *testing.T) {
	srv := servers.Redis(t)
	c := client(t, srv)
	p := newWriter(t, srv, Options{MinInterval: time.Hour, MaxJobs: 2})
	job1, job2, job3 := jobID("job-max-1"), jobID("job-max-2"), jobID("job-max-3")
	p.Update(job1, pullOf(1))
	p.Update(job2, pullOf(1))
	p.Update(job3, pullOf(1)) // no room: dropped at once
	if d := testutil.ToFloat64(p.dropped.WithLabelValues("full")); d != 1 {
		t.Fatalf("dropped{full} = %v, want 1", d)
	}
	wait.For(t, "two writes", func() bool { return testutil.ToFloat64(p.writes) == 2 })
	if exists(t, c, job3) {
		t.Error("the third job written though the publisher was full")
	}
	// Finishing a job frees its room once its deletion is done.
	p.Finish(job1)
	wait.For(t, "the deletion", func() bool { return testutil.ToFloat64(p.deletes) == 1 })
	wait.For(t, "room for a job", func() bool { return testutil.ToFloat64(p.pending) == 1 })
	p.Update(job3, pullOf(3))
	wait.For(t, "the third job's write", func() bool { return exists(t, c, job3) })
}

func TestFinishDeletesKeyOfEarlierProcess(t *testing.T) {
	srv := servers.Redis(t)
	c := client(t, srv)
	job := jobID("job-earlier")
	// A key left by a process that died mid-pull.
	if err := c.HSet(context.Background(), Key(job), "job_id", job, "pull_downloaded_bytes", "5").Err(); err != nil {
		t.Fatal(err)
	}
	p := newWriter(t, srv, Options{})
	p.Finish(job)
	wait.For(t, "the deletion", func() bool { return !exists(t, c, job) })
}

func TestUpdateAfterFinishStartsAnew(t *testing.T) {
	srv := servers.Redis(t)
	c := client(t, srv)
	p := newWriter(t, srv, Options{MinInterval: 10 * time.Millisecond})
	job := jobID("job-again")
	p.Update(job, pullOf(1))
	p.Finish(job)
	p.Update(job, pullOf(2))
	// The deletion comes before the later value, never after it.
	wait.For(t, "the second run's value", func() bool { return fields(t, c, job)["pull_downloaded_bytes"] == "2" })
	if d := ttl(t, c, job); d <= 3500*time.Second {
		t.Errorf("TTL = %s, want just under %s", d, KeyTTL)
	}
	p.Finish(job)
	wait.For(t, "the deletion", func() bool { return !exists(t, c, job) })
}

func TestCloseSendsPendingDeletion(t *testing.T) {
	srv := servers.Redis(t)
	c := client(t, srv)
	p, err := New(Options{Nodes: []string{srv.Addr}, Password: srv.Password, MinInterval: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	job := jobID("job-close")
	p.Update(job, pullOf(1))
	wait.For(t, "the write", func() bool { return exists(t, c, job) })
	p.Finish(job)
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if exists(t, c, job) {
		t.Error("key left after Finish and Close")
	}
	// Closed: nothing more is recorded or sent.
	p.Update(job, pullOf(2))
	p.Finish(job)
	if n := testutil.ToFloat64(p.pending); n != 0 {
		t.Errorf("pending jobs after Close = %v", n)
	}
	if err := p.Close(ctx); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestRedisDownAndBack(t *testing.T) {
	srv := dbserver.StartRedis(t) // stopped and started: not the shared one
	c := client(t, srv)
	p := newWriter(t, srv, Options{MinInterval: 10 * time.Millisecond, Timeout: 500 * time.Millisecond})
	ctx := context.Background()
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("Ping = %v", err)
	}
	p.Update("job-down", pullOf(1))
	wait.For(t, "the first write", func() bool { return exists(t, c, "job-down") })

	srv.Stop()
	if err := p.Ping(ctx); err == nil {
		t.Error("Ping with Redis stopped = nil, want an error")
	}
	for n := int64(2); n <= 1000; n++ {
		p.Update("job-down", pullOf(n))
	}
	p.Update("job-down-finished", pullOf(1))
	p.Finish("job-down-finished")
	wait.For(t, "failures to be counted", func() bool { return testutil.ToFloat64(p.failures) >= 2 })
	if w := testutil.ToFloat64(p.writes); w != 1 {
		t.Errorf("writes with Redis stopped = %v, want the 1 before", w)
	}

	if err := srv.Start(ctx); err != nil { // comes back empty
		t.Fatal(err)
	}
	wait.For(t, "the latest value after the restart", func() bool {
		return p.Ping(ctx) == nil && fields(t, c, "job-down")["pull_downloaded_bytes"] == "1000"
	})
	if d := ttl(t, c, "job-down"); d <= 3500*time.Second {
		t.Errorf("TTL after the restart = %s", d)
	}
	// The deletion asked for during the outage is made once Redis is back.
	wait.For(t, "the deferred deletion", func() bool { return testutil.ToFloat64(p.deletes) == 1 })
	if exists(t, c, "job-down-finished") {
		t.Error("finished job's key exists")
	}
}

func TestWrongPassword(t *testing.T) {
	srv := servers.Redis(t)
	c := client(t, srv)
	p := newWriter(t, srv, Options{Password: "not-the-password", MinInterval: 10 * time.Millisecond})
	err := p.Ping(context.Background())
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("Ping with a wrong password = %v, want WRONGPASS", err)
	}
	if strings.Contains(fmt.Sprint(err), "not-the-password") {
		t.Errorf("Ping error shows the password: %v", err)
	}
	job := jobID("job-wrongpass")
	p.Update(job, pullOf(1))
	p.Finish(jobID("job-other-wrongpass"))
	wait.For(t, "failures to be counted", func() bool { return testutil.ToFloat64(p.failures) >= 2 })
	if exists(t, c, job) || testutil.ToFloat64(p.writes) != 0 {
		t.Error("written with a wrong password")
	}
}

// TestNeverBlocks runs against a server that accepts connections and never
// answers: with the worker stuck in a round trip for as long as its hour's
// timeout, Update and Finish still return, Ping and Close end with their
// contexts.
func TestNeverBlocks(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan struct{}, 1)
	var conns sync.WaitGroup
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				defer conn.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := conn.Read(buf); err != nil {
						return
					}
					select {
					case got <- struct{}{}:
					default:
					}
				}
			})
		}
	}()
	p, err := New(Options{Nodes: []string{ln.Addr().String()}, MinInterval: time.Millisecond, Timeout: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Update("job-stuck", pullOf(1))
	select {
	case <-got:
	case <-time.After(waitDeadline):
		t.Fatal("the publisher never sent anything")
	}
	// Finished while its first write is on its way.
	p.Finish("job-stuck")
	for n := int64(2); n <= 10000; n++ {
		p.Update(fmt.Sprintf("job-stuck-%d", n%50), pullOf(n))
	}
	if n := testutil.ToFloat64(p.pending); n != 51 {
		t.Errorf("pending jobs = %v, want 51 (one entry per job)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Ping(ctx); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Ping = %v, want its context's deadline", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close = %v, want its context's deadline", err)
	}
	ln.Close()
	conns.Wait() // Close closed the client's connections
	// The write that failed became the final value, to go before the
	// deletion, not a value to write after it.
	p.mu.Lock()
	e := *p.jobs["job-stuck"]
	p.mu.Unlock()
	if !e.finish || e.dirty || e.final == nil || *e.final != pullOf(1) {
		t.Errorf("job-stuck after its write failed = %+v, want finishing with final value 1, nothing to write after", e)
	}
}

func TestNilWriter(t *testing.T) {
	var p *Writer
	p.Update("j", api.Pull{})
	p.Finish("j")
	if err := p.Ping(context.Background()); err != nil {
		t.Errorf("Ping = %v", err)
	}
	if cs := p.Collectors(); cs != nil {
		t.Errorf("Collectors = %v", cs)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
}

func TestNewRejects(t *testing.T) {
	cases := map[string]Options{
		"no redis nodes":           {},
		"a cluster has database 0": {Nodes: []string{"a:1", "b:1"}, DB: 1},
		"negative":                 {Nodes: []string{"a:1"}, Timeout: -1},
	}
	for want, o := range cases {
		if p, err := New(o, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New(%v) = %v, %v; want an error mentioning %q", o, p, err, want)
		}
	}
}

func TestOptionsNeverPrintPassword(t *testing.T) {
	o := Options{Nodes: []string{"r:6379"}, Password: "hunter2", DB: 1}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "redis", o)
	for _, s := range []string{fmt.Sprint(o), fmt.Sprintf("%+v", o), fmt.Sprintf("%#v", o), logged.String()} {
		if strings.Contains(s, "hunter2") {
			t.Errorf("password shown: %s", s)
		}
		if !strings.Contains(s, "redis://r:6379/1") {
			t.Errorf("address missing: %s", s)
		}
	}
}

func TestMetricNames(t *testing.T) {
	p, err := New(Options{Nodes: []string{"127.0.0.1:1"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collectors()...)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) != 0 {
		t.Errorf("lint = %v, %v", problems, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	want := "cube_templatecenter_redis_progress_deletes_total,cube_templatecenter_redis_progress_dropped_total," +
		"cube_templatecenter_redis_progress_failures_total,cube_templatecenter_redis_progress_pending_jobs," +
		"cube_templatecenter_redis_progress_writes_total"
	if got := strings.Join(names, ","); got != want {
		t.Errorf("metrics = %s, want %s", got, want)
	}
}

var _ io.Writer = testWriter{}

// TestMinIntervalAsRedisSeesIt checks the default rate as CubeMaster
// sees it: with updates far more frequent than DefaultMinInterval, two
// writes of one job's hash (seen by MONITOR) and two updated_at_ms values
// (seen by polling the hash) are never closer than DefaultMinInterval.
func TestMinIntervalAsRedisSeesIt(t *testing.T) {
	srv := servers.Redis(t)
	c := client(t, srv)
	id := jobID("interval")

	// MONITOR over a plain connection: it streams one line per command
	// Redis runs.
	conn, err := net.Dial("tcp", srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "AUTH %s\r\nMONITOR\r\n", srv.Password); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var writes []time.Time
	streaming := false
	go func() {
		sc := bufio.NewScanner(conn)
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			streaming = streaming || strings.Contains(line, `"PING"`) || strings.Contains(line, `"ping"`)
			// A write is one script call naming the key (EVAL, or
			// EVALSHA once the script is cached).
			if strings.Contains(line, Key(id)) && strings.Contains(strings.ToLower(line), `"eval`) {
				writes = append(writes, time.Now())
			}
			mu.Unlock()
		}
	}()
	wait.For(t, "MONITOR to stream", func() bool {
		c.Ping(context.Background())
		mu.Lock()
		defer mu.Unlock()
		return streaming
	})

	p := newWriter(t, srv, Options{})
	var stamps []int64
	stop := time.Now().Add(3 * time.Second)
	for n := int64(1); time.Now().Before(stop); n++ {
		p.Update(id, pullOf(n))
		if v := fields(t, c, id)["updated_at_ms"]; v != "" {
			at, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("updated_at_ms = %q", v)
			}
			if len(stamps) == 0 || stamps[len(stamps)-1] != at {
				stamps = append(stamps, at)
			}
		}
		time.Sleep(7 * time.Millisecond)
	}
	if len(stamps) < 3 {
		t.Fatalf("saw %d distinct updated_at_ms values in 3 s, want at least 3", len(stamps))
	}
	for i := 1; i < len(stamps); i++ {
		if gap := time.Duration(stamps[i]-stamps[i-1]) * time.Millisecond; gap < DefaultMinInterval {
			t.Errorf("updated_at_ms %d follows %d after %s, want at least %s", stamps[i], stamps[i-1], gap, DefaultMinInterval)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(writes) < 3 {
		t.Fatalf("MONITOR saw %d writes of %s in 3 s, want at least 3", len(writes), Key(id))
	}
	// MONITOR's lines reach this test a little after Redis ran the
	// command, each late by its own amount: allow 50 ms of that.
	for i := 1; i < len(writes); i++ {
		if gap := writes[i].Sub(writes[i-1]); gap < DefaultMinInterval-50*time.Millisecond {
			t.Errorf("write %d followed the one before after %s, want at least %s", i, gap, DefaultMinInterval)
		}
	}
}
