package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// volume is a filesystem the agent writes to and watches.
type volume struct {
	name string
	dir  string
	// limits give the reserve kept free; key is the setting that sizes it.
	limits rootfs.Limits
	key    string
}

// volumes are the store (where images are written), the spool's directory
// and the work directory (layer cache, scratch files), each with the
// reserve kept free on it.
func volumes(cfg *config.Config) []volume {
	reserve := func(r config.Reserve) rootfs.Limits {
		return rootfs.Limits{MinFreeBytes: int64(r.Bytes), MinFreePercent: r.Percent}
	}
	return []volume{
		{name: "store", dir: cfg.Store.Dir, limits: reserve(cfg.Store.MinFree), key: rootfs.LimitMinFree},
		{name: "spool", dir: filepath.Dir(cfg.Spool.Path), limits: reserve(cfg.Spool.MinFree), key: "spool.min_free"},
		// Builds fill the layer cache before the store: the same reserve.
		{name: "work_dir", dir: cfg.Store.WorkDir, limits: reserve(cfg.Store.MinFree), key: rootfs.LimitMinFree},
	}
}

// space measures v's filesystem. A directory not created yet (the work
// directory before its first build) is measured on its nearest existing
// parent: the filesystem it will be created on.
func (v volume) space() (rootfs.Space, error) {
	dir := v.dir
	for {
		sp, err := rootfs.StoreSpace(dir, v.limits)
		if err == nil || !errors.Is(err, fs.ErrNotExist) || filepath.Dir(dir) == dir {
			return sp, err
		}
		dir = filepath.Dir(dir)
	}
}

// belowReserve returns an error naming v and its setting when sp has less
// free than v keeps in reserve.
func (v volume) belowReserve(sp rootfs.Space) error {
	if sp.Free >= sp.Reserve {
		return nil
	}
	return fmt.Errorf("%s volume %s: %d bytes free, below the %d kept free by %s", v.name, v.dir, sp.Free, sp.Reserve, v.key)
}

// roomFor returns belowReserve's error when writing n more bytes would take
// v below its reserve. A filesystem that cannot be measured is no reason
// to refuse: /health and the metrics report that.
func (v volume) roomFor(n int64) error {
	sp, err := v.space()
	if err != nil {
		return nil
	}
	sp.Free -= n
	return v.belowReserve(sp)
}

// volumeNamed returns the volume called name.
func volumeNamed(cfg *config.Config, name string) volume {
	for _, v := range volumes(cfg) {
		if v.name == name {
			return v
		}
	}
	panic("agent: no volume " + name)
}

// spaceCollector reports the room on the agent's volumes once per scrape.
type spaceCollector struct {
	config                  func() *config.Config
	logger                  *slog.Logger
	size, free, reserve, ok *prometheus.Desc
}

func newSpaceCollector(cfg func() *config.Config, logger *slog.Logger) *spaceCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "volume", name), help, []string{"volume"}, nil)
	}
	return &spaceCollector{
		config:  cfg,
		logger:  logger,
		size:    desc("size_bytes", "Size of the filesystem holding the volume (store, spool)."),
		free:    desc("free_bytes", "Bytes the agent may still write on the volume's filesystem."),
		reserve: desc("reserve_bytes", "Bytes kept free on the volume's filesystem (store.min_free, spool.min_free)."),
		ok:      desc("scrape_success", "Whether this scrape measured the volume's filesystem (1) or not (0)."),
	}
}

// Describe implements prometheus.Collector.
func (c *spaceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.size, c.free, c.reserve, c.ok} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *spaceCollector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range volumes(c.config()) {
		sp, err := v.space()
		if err != nil {
			c.logger.Warn("measure volume", "volume", v.name, "err", err)
			ch <- prometheus.MustNewConstMetric(c.ok, prometheus.GaugeValue, 0, v.name)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(sp.Size), v.name)
		ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(sp.Free), v.name)
		ch <- prometheus.MustNewConstMetric(c.reserve, prometheus.GaugeValue, float64(sp.Reserve), v.name)
		ch <- prometheus.MustNewConstMetric(c.ok, prometheus.GaugeValue, 1, v.name)
	}
}

// spaceView is a volume's room as /health shows it.
type spaceView struct {
	Dir          string `json:"dir"`
	SizeBytes    int64  `json:"size_bytes"`
	FreeBytes    int64  `json:"free_bytes"`
	ReserveBytes int64  `json:"reserve_bytes"`
}
