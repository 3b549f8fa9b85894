// Package space watches the filesystems the agent writes to (the store,
// the spool's directory, the work directory): whether one can be written
// at all, the reserve kept free on each, the refusal of a write that would
// take one below it, the guard that stops an upload once it does, and the
// volume series.
package space

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// The volumes' names, as /health, the checks and the volume label show
// them.
const (
	Store   = "store"
	Spool   = "spool"
	WorkDir = "work_dir"
)

// Volume is a filesystem the agent writes to and watches.
type Volume struct {
	Name string
	Dir  string
	// limits give the reserve kept free; key is the setting that sizes it.
	limits rootfs.Limits
	key    string
}

// Volumes are the store (where images are written), the spool's directory
// and the work directory (layer cache, scratch files), each with the
// reserve kept free on it.
func Volumes(cfg *config.Config) []Volume {
	reserve := func(r config.Reserve) rootfs.Limits {
		return rootfs.Limits{MinFreeBytes: int64(r.Bytes), MinFreePercent: r.Percent}
	}
	return []Volume{
		{Name: Store, Dir: cfg.Store.Dir, limits: reserve(cfg.Store.MinFree), key: rootfs.LimitMinFree},
		{Name: Spool, Dir: filepath.Dir(cfg.Spool.Path), limits: reserve(cfg.Spool.MinFree), key: "spool.min_free"},
		// Builds fill the layer cache before the store: the same reserve.
		{Name: WorkDir, Dir: cfg.Store.WorkDir, limits: reserve(cfg.Store.MinFree), key: rootfs.LimitMinFree},
	}
}

// Named returns the volume called name (Store, Spool or WorkDir).
func Named(cfg *config.Config, name string) Volume {
	for _, v := range Volumes(cfg) {
		if v.Name == name {
			return v
		}
	}
	panic("space: no volume " + name)
}

// Space measures v's filesystem. A directory not created yet (the work
// directory before its first build) is measured on its nearest existing
// parent: the filesystem it will be created on.
func (v Volume) Space() (rootfs.Space, error) {
	dir := v.Dir
	for {
		sp, err := rootfs.StoreSpace(dir, v.limits)
		if err == nil || !errors.Is(err, fs.ErrNotExist) || filepath.Dir(dir) == dir {
			return sp, err
		}
		dir = filepath.Dir(dir)
	}
}

// BelowReserve returns an error naming v and its setting when sp has less
// free than v keeps in reserve.
func (v Volume) BelowReserve(sp rootfs.Space) error {
	if sp.Free >= sp.Reserve {
		return nil
	}
	return fmt.Errorf("%s volume %s: %d bytes free, below the %d kept free by %s", v.Name, v.Dir, sp.Free, sp.Reserve, v.key)
}

// Check measures v and returns BelowReserve's error, or why it could not
// be measured: the readiness check of v.
func (v Volume) Check() error {
	sp, err := v.Space()
	if err != nil {
		return err
	}
	return v.BelowReserve(sp)
}

// Writable checks v's directory exists and may be written (a read-only
// mount fails too).
func (v Volume) Writable() error {
	fi, err := os.Stat(v.Dir)
	if err != nil {
		return fmt.Errorf("%s %s: %w", v.Name, v.Dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s %s is not a directory", v.Name, v.Dir)
	}
	if err := unix.Access(v.Dir, unix.W_OK); err != nil {
		return fmt.Errorf("%s %s is not writable: %w", v.Name, v.Dir, err)
	}
	return nil
}

// RoomFor returns BelowReserve's error when writing n more bytes would take
// v below its reserve. A filesystem that cannot be measured is no reason
// to refuse: /health and the metrics report that.
func (v Volume) RoomFor(n int64) error {
	sp, err := v.Space()
	if err != nil {
		return nil
	}
	sp.Free -= n
	return v.BelowReserve(sp)
}

// ErrBelowReserve stops a write, through a Guard, that took its volume
// below the reserve.
var ErrBelowReserve = errors.New("store below its reserve")

// guardCheckEvery is how many bytes a Guard passes on between two looks
// at the volume's free space: small beside any reserve worth setting,
// large beside a statfs call.
const guardCheckEvery = 1 << 20

// Guard passes a stream on to be written to its volume and stops it once
// the volume falls below its reserve (a body without Content-Length,
// another writer filling the disk meanwhile): each look comes before the
// bytes read are handed on.
type Guard struct {
	r   io.Reader
	vol Volume
	// Written counts the bytes passed on.
	Written int64
	checked int64
}

// Guard returns a Guard of r writing to v.
func (v Volume) Guard(r io.Reader) *Guard { return &Guard{r: r, vol: v} }

// Read implements io.Reader; past the reserve it fails with an error
// wrapping ErrBelowReserve.
func (g *Guard) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if n > 0 && (g.Written-g.checked >= guardCheckEvery || g.Written == 0) {
		g.checked = g.Written
		if rerr := g.vol.RoomFor(int64(n)); rerr != nil {
			return 0, fmt.Errorf("%w: %w", ErrBelowReserve, rerr)
		}
	}
	g.Written += int64(n)
	return n, err
}

// View is a volume's room as /health shows it.
type View struct {
	Dir          string `json:"dir"`
	SizeBytes    int64  `json:"size_bytes"`
	FreeBytes    int64  `json:"free_bytes"`
	ReserveBytes int64  `json:"reserve_bytes"`
}

// Views measures every volume, by name; one that cannot be measured is
// left out.
func Views(cfg *config.Config) map[string]View {
	views := map[string]View{}
	for _, v := range Volumes(cfg) {
		if sp, err := v.Space(); err == nil {
			views[v.Name] = View{Dir: v.Dir, SizeBytes: sp.Size, FreeBytes: sp.Free, ReserveBytes: sp.Reserve}
		}
	}
	return views
}

// collector reports the room on the agent's volumes once per scrape.
type collector struct {
	config                  func() *config.Config
	logger                  *slog.Logger
	size, free, reserve, ok *prometheus.Desc
}

// NewCollector returns the volume series of the volumes of the
// configuration config returns at each scrape. Their names carry no
// namespace: register it with a prefixing Registerer.
func NewCollector(cfg func() *config.Config, logger *slog.Logger) prometheus.Collector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("", "volume", name), help, []string{"volume"}, nil)
	}
	return &collector{
		config:  cfg,
		logger:  logger,
		size:    desc("size_bytes", "Size of the filesystem holding the volume (store, spool)."),
		free:    desc("free_bytes", "Bytes the agent may still write on the volume's filesystem."),
		reserve: desc("reserve_bytes", "Bytes kept free on the volume's filesystem (store.min_free, spool.min_free)."),
		ok:      desc("scrape_success", "Whether this scrape measured the volume's filesystem (1) or not (0)."),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.size, c.free, c.reserve, c.ok} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range Volumes(c.config()) {
		sp, err := v.Space()
		if err != nil {
			c.logger.Warn("measure volume", "volume", v.Name, "err", err)
			ch <- prometheus.MustNewConstMetric(c.ok, prometheus.GaugeValue, 0, v.Name)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(sp.Size), v.Name)
		ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(sp.Free), v.Name)
		ch <- prometheus.MustNewConstMetric(c.reserve, prometheus.GaugeValue, float64(sp.Reserve), v.Name)
		ch <- prometheus.MustNewConstMetric(c.ok, prometheus.GaugeValue, 1, v.Name)
	}
}
