package rootfs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fsutil"
)

// Store is the artifact directory shared with CubeMaster: each artifact is
// <store>/<artifact_id>/<artifact_id>.ext4.
type Store string

// ArtifactDir is the directory holding one artifact.
func (s Store) ArtifactDir(id string) string { return filepath.Join(string(s), id) }

// ArtifactPath is where an artifact's image is published.
func (s Store) ArtifactPath(id string) string {
	return filepath.Join(string(s), id, id+".ext4")
}

// tempMarker tags temporary files with the host that wrote them, so the
// cleanup at boot never touches a file another host's agent is writing on a
// shared store.
func tempMarker() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return ".tmp-" + strings.ReplaceAll(host, "/", "_") + "-"
}

// CreateTemp creates the temporary file an artifact is built into, beside
// its final path so the publishing rename stays on one filesystem.
func (s Store) CreateTemp(id string) (*os.File, error) {
	dir := s.ArtifactDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create artifact directory: %w", err)
	}
	var r [6]byte
	rand.Read(r[:])
	path := filepath.Join(dir, id+".ext4"+tempMarker()+hex.EncodeToString(r[:]))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create temporary image: %w", err)
	}
	return f, nil
}

// Publish makes a finished temporary image the artifact: fsync, rename over
// the final name, fsync the directory. f is closed in every case, and the
// temporary file is removed when publishing fails.
func (s Store) Publish(f *os.File, id string) (err error) {
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync image: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close image: %w", err)
	}
	if err := os.Rename(tmp, s.ArtifactPath(id)); err != nil {
		return fmt.Errorf("publish image: %w", err)
	}
	return fsutil.SyncDir(s.ArtifactDir(id))
}

// Discard removes a temporary image after a failed build, and the artifact
// directory too when nothing else is left in it.
func (s Store) Discard(f *os.File, id string) {
	f.Close()
	os.Remove(f.Name())
	os.Remove(s.ArtifactDir(id)) // only succeeds when empty
}

// CleanLeftovers removes what a crash of this host's agent can leave in the
// store: temporary images it was writing and artifact directories left
// empty. Published images and other hosts' files are never touched. It
// returns the paths it removed.
func (s Store) CleanLeftovers() ([]string, error) {
	marker := tempMarker()
	entries, err := os.ReadDir(string(s))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("scan store: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "rfs-") {
			continue
		}
		dir := s.ArtifactDir(e.Name())
		files, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("scan %s: %w", dir, err))
			continue
		}
		left := len(files)
		for _, f := range files {
			if f.Type().IsRegular() && strings.Contains(f.Name(), ".ext4"+marker) {
				p := filepath.Join(dir, f.Name())
				if err := os.Remove(p); err != nil {
					errs = append(errs, fmt.Errorf("remove leftover %s: %w", p, err))
					continue
				}
				removed = append(removed, p)
				left--
			}
		}
		if left == 0 && os.Remove(dir) == nil {
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}

// CopyHashed copies src to dst while hashing it, stopping when ctx ends. It
// returns the SHA-256 (hex) and length of what was copied.
func CopyHashed(ctx context.Context, dst io.Writer, src io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(dst, h), fsutil.ContextReader(ctx, src))
	if err != nil {
		return "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
