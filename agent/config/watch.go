package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watcher is a running Watch; Close stops it.
type Watcher struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // closing the fsnotify watcher; read after done
}

// Close stops the watcher and returns once its goroutine has ended, so no
// reload starts after it (a reload in progress finishes first).
func (cw *Watcher) Close() error {
	cw.cancel()
	<-cw.done
	return cw.err
}

// Watch calls reload whenever the file at path changes, including
// editors' write-to-temp-and-rename and a Kubernetes ConfigMap update
// (which swaps a symlink the file's own link goes through, with no event on
// the file's name), until ctx ends or Close is called. It watches the
// parent directory, since a rename replaces the file's inode.
func Watch(ctx context.Context, path string, logger *slog.Logger, reload func()) (*Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch config: %w", err)
	}
	dir, name := filepath.Split(filepath.Clean(path))
	if dir == "" {
		dir = "."
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, fmt.Errorf("watch config directory %s: %w", dir, err)
	}
	// target is the file path resolves to; a change of it through a
	// symlink elsewhere in the directory is a change of the config.
	target, _ := filepath.EvalSymlinks(path)
	retargeted := func() bool {
		now, err := filepath.EvalSymlinks(path)
		if err != nil || now == target {
			return false
		}
		target = now
		return true
	}
	ctx, cancel := context.WithCancel(ctx)
	cw := &Watcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(cw.done)
		defer func() {
			if err := w.Close(); err != nil {
				cw.err = fmt.Errorf("close config watcher: %w", err)
			}
		}()
		// Editors emit bursts (truncate, write, chmod, rename): settle first.
		var settle <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				switch {
				case filepath.Base(ev.Name) == name && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename|fsnotify.Chmod) != 0,
					ev.Op&(fsnotify.Create|fsnotify.Rename) != 0 && retargeted():
					settle = time.After(250 * time.Millisecond)
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				logger.Warn("config watcher", "err", err)
			case <-settle:
				settle = nil
				if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
					continue // mid-rename; the Create event follows
				}
				reload()
			}
		}
	}()
	return cw, nil
}
