package space

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/test/tmpfs"
)

// testConfig has its store on dir, its spool and work directory in fresh
// directories, and no reserve.
func testConfig(t *testing.T, dir string) *config.Config {
	cfg := config.Default()
	cfg.Store.Dir = dir
	cfg.Store.WorkDir = filepath.Join(t.TempDir(), "not", "created", "yet")
	cfg.Spool.Path = filepath.Join(t.TempDir(), "spool.db")
	cfg.Store.MinFree, cfg.Spool.MinFree = config.Reserve{}, config.Reserve{}
	return cfg
}

// TestSpaceOfMissingDirectory: a directory not created yet is measured on
// the filesystem it will be created on; one that cannot be (a path
// through a file) is an error for the check, never a refusal of writes.
func TestSpaceOfMissingDirectory(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	work := Named(cfg, WorkDir)
	sp, err := work.Space()
	if err != nil || sp.Size <= 0 {
		t.Fatalf("space of a directory not created yet = %+v, %v; want its parent's filesystem", sp, err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Store.Dir = filepath.Join(file, "store")
	store := Named(cfg, Store)
	if err := store.Check(); err == nil {
		t.Error("Check of a path through a file passed")
	}
	if err := store.RoomFor(1 << 60); err != nil {
		t.Errorf("RoomFor on a volume that cannot be measured = %v, want nil", err)
	}
}

// reservedStore is the store volume on a fresh 8 MiB tmpfs keeping 4 MiB
// free, and its directory.
func reservedStore(t *testing.T) (Volume, string) {
	dir := tmpfs.Mount(t, "8m")
	cfg := testConfig(t, dir)
	cfg.Store.MinFree = config.Reserve{Bytes: 4 << 20}
	return Named(cfg, Store), dir
}

// TestWritable: the store must be a directory the agent may write to.
func TestWritable(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	if err := Named(cfg, Store).Writable(); err != nil {
		t.Errorf("Writable of a fresh directory = %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Store.Dir = file
	if err := Named(cfg, Store).Writable(); err == nil || err.Error() != "store "+file+" is not a directory" {
		t.Errorf("Writable of a file = %v", err)
	}
	cfg.Store.Dir = filepath.Join(file, "store")
	if err := Named(cfg, Store).Writable(); err == nil || !strings.HasPrefix(err.Error(), "store "+cfg.Store.Dir+": ") {
		t.Errorf("Writable of a path through a file = %v", err)
	}
}

// TestReserve: a write that would take the volume below its reserve is
// refused naming the volume and the setting; one that leaves it is not.
func TestReserve(t *testing.T) {
	v, dir := reservedStore(t)
	if err := v.Check(); err != nil {
		t.Fatalf("Check of an empty 8 MiB volume keeping 4 MiB = %v", err)
	}
	if err := v.RoomFor(1 << 20); err != nil {
		t.Errorf("RoomFor(1 MiB) = %v, want nil", err)
	}
	err := v.RoomFor(5 << 20)
	if err == nil || !strings.Contains(err.Error(), "store volume "+dir) || !strings.Contains(err.Error(), "kept free by store.min_free") {
		t.Errorf("RoomFor(5 MiB) = %v, want a refusal naming the store volume and store.min_free", err)
	}
	spool := Named(testConfig(t, dir), Spool)
	if err := spool.BelowReserve(rootfs.Space{Size: 10, Free: 1, Reserve: 2}); err == nil || !strings.Contains(err.Error(), "spool.min_free") {
		t.Errorf("BelowReserve of the spool = %v, want one naming spool.min_free", err)
	}
}

// TestGuardStopsAtReserve: a stream written to a volume through its
// Guard stops within a check interval of the reserve, with
// ErrBelowReserve; below the reserve already, it stops before a byte.
func TestGuardStopsAtReserve(t *testing.T) {
	v, dir := reservedStore(t)
	f, err := os.Create(filepath.Join(dir, "upload"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g := v.Guard(bytes.NewReader(make([]byte, 16<<20)))
	_, err = io.Copy(f, g)
	if !errors.Is(err, ErrBelowReserve) {
		t.Fatalf("copy of 16 MiB to an 8 MiB volume keeping 4 MiB = %v, want ErrBelowReserve", err)
	}
	if g.Written < 3<<20 || g.Written > 4<<20+guardCheckEvery {
		t.Errorf("the guard passed %d bytes on, want about 4 MiB", g.Written)
	}
	f.Sync()
	g = v.Guard(strings.NewReader("more"))
	if n, err := g.Read(make([]byte, 8)); n != 0 || !errors.Is(err, ErrBelowReserve) || g.Written != 0 {
		t.Errorf("Read below the reserve = %d, %v (written %d); want 0 and ErrBelowReserve", n, err, g.Written)
	}
}

// TestViewsAndCollector: every volume shows in /health's view and in the
// series, one that cannot be measured as scrape_success 0 only.
func TestViewsAndCollector(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	views := Views(cfg)
	if len(views) != 3 || views[Store].Dir != cfg.Store.Dir || views[Spool].SizeBytes <= 0 || views[WorkDir].FreeBytes <= 0 {
		t.Errorf("Views = %+v, want the three volumes measured", views)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Store.Dir = filepath.Join(file, "store")
	if _, ok := Views(cfg)[Store]; ok {
		t.Error("Views shows a store that cannot be measured")
	}
	var logs bytes.Buffer
	c := NewCollector(func() *config.Config { return cfg }, slog.New(slog.NewTextHandler(&logs, nil)))
	if n := testutil.CollectAndCount(c, "volume_size_bytes"); n != 2 {
		t.Errorf("%d volume_size_bytes series, want 2 (spool, work_dir)", n)
	}
	want := `
# HELP volume_scrape_success Whether this scrape measured the volume's filesystem (1) or not (0).
# TYPE volume_scrape_success gauge
volume_scrape_success{volume="spool"} 1
volume_scrape_success{volume="store"} 0
volume_scrape_success{volume="work_dir"} 1
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "volume_scrape_success"); err != nil {
		t.Error(err)
	}
	if !strings.Contains(logs.String(), "measure volume") || !strings.Contains(logs.String(), "volume=store") {
		t.Errorf("no warning for the store:\n%s", logs.String())
	}
}
