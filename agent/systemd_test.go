package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestConfigWatcherCloseWaits checks that Close returns only once the
// watcher's goroutine has ended: with a reload in progress, not before it
// finishes, and never a reload after.
func TestConfigWatcherCloseWaits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conf.yaml")
	if err := os.WriteFile(path, []byte("log:\n  level: info\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}, 10), make(chan struct{})
	reloading := make(chan bool, 1)
	reloading <- false
	cw, err := WatchConfig(context.Background(), path, slog.New(slog.DiscardHandler), func() {
		<-reloading
		reloading <- true
		started <- struct{}{}
		<-release
		<-reloading
		reloading <- false
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("log:\n  level: debug\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("no reload after a write to the config file")
	}
	closed := make(chan error, 1)
	go func() { closed <- cw.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a reload was in progress")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the reload finished")
	}
	if <-reloading {
		t.Error("a reload was running after Close returned")
	}
}

// TestConfigWatcherEndsWithContext checks that Close returns once ctx
// has ended the watcher.
func TestConfigWatcherEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cw, err := WatchConfig(ctx, filepath.Join(t.TempDir(), "conf.yaml"), slog.New(slog.DiscardHandler), func() {})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-cw.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the watcher's goroutine did not end with its context")
	}
	if err := cw.Close(); err != nil {
		t.Errorf("Close after ctx ended: %v", err)
	}
}
