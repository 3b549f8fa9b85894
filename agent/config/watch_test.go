package config

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchCloseWaits checks that Close returns only once the
// watcher's goroutine has ended: with a reload in progress, not before it
// finishes, and never a reload after.
func TestWatchCloseWaits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conf.yaml")
	if err := os.WriteFile(path, []byte("log:\n  level: info\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}, 10), make(chan struct{})
	reloading := make(chan bool, 1)
	reloading <- false
	cw, err := Watch(context.Background(), path, slog.New(slog.DiscardHandler), func() {
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

// TestWatchEndsWithContext checks that Close returns once ctx
// has ended the watcher.
func TestWatchEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cw, err := Watch(ctx, filepath.Join(t.TempDir(), "conf.yaml"), slog.New(slog.DiscardHandler), func() {})
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

// TestWatchFollowsConfigMapUpdate: Kubernetes mounts a ConfigMap as
// conf.yaml -> ..data/conf.yaml, ..data -> ..<timestamp>, and updates it by
// renaming a new ..data link over the old one: no event names conf.yaml.
func TestWatchFollowsConfigMapUpdate(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "conf.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_12_01_a", "log:\n  level: info\n")
	for _, l := range [][2]string{{"..2026_12_01_a", "..data"}, {"..data/conf.yaml", "conf.yaml"}} {
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	reloads := make(chan struct{}, 10)
	cw, err := Watch(context.Background(), filepath.Join(dir, "conf.yaml"), slog.New(slog.DiscardHandler),
		func() { reloads <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer cw.Close()
	version("..2026_12_01_b", "log:\n  level: debug\n")
	if err := os.Symlink("..2026_12_01_b", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reloads:
	case <-time.After(5 * time.Second):
		t.Fatal("no reload after the ConfigMap's ..data link was swapped")
	}
}

// TestWatchSeesRenameReplace: an editor's write-to-temp-and-rename is a
// change; a change to another file of the directory is not.
func TestWatchSeesRenameReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conf.yaml")
	os.WriteFile(path, []byte("log:\n  level: info\n"), 0o644)
	reloads := make(chan struct{}, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cw, err := Watch(ctx, path, slog.New(slog.DiscardHandler), func() { reloads <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer cw.Close()
	tmp := filepath.Join(dir, ".conf.yaml.swp")
	os.WriteFile(tmp, []byte("log:\n  level: debug\n"), 0o644)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reloads:
	case <-time.After(5 * time.Second):
		t.Fatal("no reload after rename-replace of the config file")
	}
	os.WriteFile(filepath.Join(dir, "other.yaml"), []byte("x"), 0o644)
	select {
	case <-reloads:
		t.Error("a change to another file triggered a reload")
	case <-time.After(600 * time.Millisecond):
	}
}
