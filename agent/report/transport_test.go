package report

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

func TestPlainHTTPHost(t *testing.T) {
	cases := []struct {
		url, token string
		host       string
		plain      bool
	}{
		{"http://10.0.0.5:8089", "tok", "10.0.0.5", true},
		{"HTTP://CubeMaster.example/", "tok", "cubemaster.example", true},
		{"http://[fd00::5]:8089", "tok", "fd00::5", true},
		{"http://localhost.example:8089", "tok", "localhost.example", true},
		{"http://10.0.0.5:8089", "", "", false},
		{"http://10.0.0.5:8089", "  ", "", false},
		{"https://10.0.0.5:8089", "tok", "", false},
		{"http://127.0.0.1:8089", "tok", "127.0.0.1", false},
		{"http://127.9.9.9:8089", "tok", "127.9.9.9", false},
		{"http://[::1]:8089", "tok", "::1", false},
		{"http://localhost:8089", "tok", "localhost", false},
		{"http://master.localhost:8089", "tok", "master.localhost", false},
	}
	for _, tc := range cases {
		host, plain := PlainHTTPHost(tc.url, tc.token)
		if host != tc.host || plain != tc.plain {
			t.Errorf("PlainHTTPHost(%q, %q) = %q, %v; want %q, %v", tc.url, tc.token, host, plain, tc.host, tc.plain)
		}
	}
}

// TestCheckTransportOncePerAddress warns once for each plain-http remote
// address the settings take, never for the same one twice, never with the
// token.
func TestCheckTransportOncePerAddress(t *testing.T) {
	var mu sync.Mutex
	s := Settings{BaseURL: "http://127.0.0.1:8089", Token: "secret-token"}
	var logs bytes.Buffer
	r := New(nil, func() Settings { mu.Lock(); defer mu.Unlock(); return s }, slog.New(slog.NewTextHandler(&logs, nil)), nil, nil)
	set := func(url string) {
		mu.Lock()
		s.BaseURL = url
		mu.Unlock()
		r.CheckTransport()
	}
	const warning = "over plain http"
	for _, step := range []struct {
		url  string
		want int
	}{
		{"http://127.0.0.1:8089", 0},
		{"http://10.0.0.5:8089", 1},
		{"http://10.0.0.5:8089", 1},
		{"https://10.0.0.5:8089", 1},
		{"http://10.0.0.6:8089", 2},
	} {
		set(step.url)
		if got := strings.Count(logs.String(), warning); got != step.want {
			t.Fatalf("after %s: %d warnings, want %d:\n%s", step.url, got, step.want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "secret-token") {
		t.Errorf("the log holds the token:\n%s", logs.String())
	}
}
