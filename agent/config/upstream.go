package config

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// This file makes an upstream TemplateCenter's conf.yaml and environment
// work here, never silently: each upstream key and variable is either
// applied under TC's name with a warning naming it, or reported ignored
// with the reason TC has no use for it. docs/upstream.md has the table.

// upstreamKey is one key of upstream's conf.yaml that TC does not spell
// the same way.
type upstreamKey struct {
	// to is TC's key for it; empty when TC ignores it.
	to string
	// why says why TC ignores it.
	why string
	// apply sets to from the upstream value.
	apply func(c *Config, v *yaml.Node) error
}

// Reasons shared by several keys or variables.
const (
	whyLogFiles  = "TC logs to stderr, which journald keeps and rotates under systemd (journald.conf SystemMaxUse=)"
	whyNoMigrate = "TC runs no schema migrations: CubeMaster owns its database's schema"
	whyRedisPool = "TC keeps its own small Redis pool and never retries a progress write (progress is advisory, a build never waits on Redis)"
	whyInherited = "inherited from CubeMaster's loader, unused by upstream's TemplateCenter as well"
	whyStale     = "TC never fails stale jobs: CubeMaster's reconciler owns job state"
	whyRemoved   = "removed upstream: TC is always CubeMaster's template builder"
)

// upstreamKeys are upstream's conf.yaml keys that TC spells differently
// or ignores, by their full path.
var upstreamKeys = map[string]upstreamKey{
	"common.http_readtimeout": {to: "common.read_timeout", apply: func(c *Config, v *yaml.Node) error {
		return seconds(v, &c.Common.ReadTimeout)
	}},
	"common.http_writetimeout": {to: "common.write_timeout", apply: func(c *Config, v *yaml.Node) error {
		return seconds(v, &c.Common.WriteTimeout)
	}},
	"common.master_addr": {to: "master.addr", apply: func(c *Config, v *yaml.Node) error {
		return v.Decode(&c.Master.Addr)
	}},
	"common.http_idletimeout":                           {why: "TC closes idle keep-alive connections after a fixed 2m"},
	"common.sync_meta_data_interval":                    {why: "TC keeps no node metadata replica"},
	"common.sync_metric_data_interval":                  {why: whyInherited},
	"common.collect_metric_interval":                    {why: whyInherited},
	"common.template_build_mode":                        {why: whyRemoved},
	"common.template_center_endpoint":                   {why: whyRemoved},
	"common.templatecenter_enabled":                     {why: whyRemoved},
	"common.template_center_addr":                       {why: "CubeMaster's key, for reaching TC; TC does not read it"},
	"log.module":                                        {why: whyLogFiles},
	"log.path":                                          {why: whyLogFiles},
	"log.file_size":                                     {why: whyLogFiles},
	"log.file_num":                                      {why: whyLogFiles},
	"instance_db_config.migration_lock_timeout_seconds": {why: whyNoMigrate},
	"redis.max_idle":                                    {why: whyRedisPool},
	"redis.max_active":                                  {why: whyRedisPool},
	"redis.idle_timeout":                                {why: whyRedisPool},
	"redis.max_retry":                                   {why: whyRedisPool},
	"auth.enable": {why: "TC authenticates every call with the shared token (CUBE_TEMPLATE_CALLBACK_TOKEN); " +
		"only CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN=true turns that off"},
}

// upstreamSection reports whether key is a section only upstream has
// (auth), whose keys are looked up in upstreamKeys.
func upstreamSection(key string) bool {
	for k := range upstreamKeys {
		if strings.HasPrefix(k, key+".") {
			return true
		}
	}
	return false
}

// seconds reads upstream's whole seconds ("120") or a Go duration ("2m").
func seconds(v *yaml.Node, dst *time.Duration) error {
	s := strings.TrimSpace(v.Value)
	if n, err := strconv.Atoi(s); err == nil {
		*dst = time.Duration(n) * time.Second
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not whole seconds (120) or a duration (2m)", s)
	}
	*dst = d
	return nil
}

// applyUpstream applies the upstream keys the walk found, in file order,
// and sets upstream's default driver (mysql) on a database section that
// names none.
func (w *walker) applyUpstream(c *Config) []error {
	keys := make([]string, 0, len(w.upstream))
	for k := range w.upstream {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Compare(w.upstream[a].Line, w.upstream[b].Line) })
	var errs []error
	for _, key := range keys {
		u, line := upstreamKeys[key], w.upstream[key].Line
		switch _, both := w.rep.sources[u.to]; {
		case u.to == "":
			w.rep.warn(false, "%s (line %d) ignored: %s", key, line, u.why)
		case both:
			w.rep.warn(false, "%s (line %d) is upstream's name for %s, which the file also sets: %s ignored", key, line, u.to, key)
		default:
			if err := u.apply(c, w.values[key]); err != nil {
				errs = append(errs, fmt.Errorf("%s (line %d): %w", key, line, err))
				continue
			}
			w.rep.warn(false, "%s (line %d) is deprecated, use %s (applied)", key, line, u.to)
			w.rep.setSource(u.to, fmt.Sprintf("%s:%d (%s)", w.name, line, key))
		}
	}
	// Upstream's loader makes mysql the default driver: a section without
	// one is MySQL, not "no database".
	if src, ok := w.rep.sources["instance_db_config"]; ok && c.InstanceDB.Driver == "" {
		if _, set := w.rep.sources["instance_db_config.driver"]; !set && w.dbSection {
			c.InstanceDB.Driver = DriverMySQL
			w.rep.setSource("instance_db_config.driver", src+" (no driver: mysql, upstream's default)")
		}
	}
	return errs
}

// upstreamEnv are upstream variables for settings TC reads from the file
// only: still applied, each with a warning naming the key.
var upstreamEnv = []envOverride{
	{key: "build.download_jobs", names: []string{"CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS"}, fileOnly: true,
		set: func(c *Config, name, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%s: %q is not a number", name, v)
			}
			c.Build.DownloadJobs = n
			return nil
		}},
	{key: "build.layer_cache_quota", names: []string{"CUBE_TEMPLATECENTER_LAYER_CACHE_QUOTA_BYTES"}, fileOnly: true,
		set: func(c *Config, name, v string) error {
			b, err := ParseByteSize(v)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			c.Build.LayerCacheQuota = b
			return nil
		}},
}

// ignoredVar is a group of upstream variables TC deliberately has no
// equivalent for.
type ignoredVar struct {
	names []string
	why   string
}

// ignoredEnv are upstream's variables that TC reports, when set, as
// ignored with the reason.
var ignoredEnv = []ignoredVar{
	{[]string{"CUBE_TEMPLATE_CENTER_RECONCILE_STALE_AFTER", "CUBE_TC_RECONCILE_STALE_AFTER",
		"CUBE_TEMPLATE_CENTER_RECONCILE_PENDING_STALE_AFTER", "CUBE_TEMPLATE_CENTER_RECONCILE_PULLING_STALE_AFTER",
		"CUBE_TEMPLATE_CENTER_RECONCILE_RUNNING_STALE_AFTER"}, whyStale},
	{[]string{"CUBE_TEMPLATE_CENTER_LOOP_MOUNT_EXT4_ENABLED", "CUBEMASTER_LOOP_MOUNT_EXT4_ENABLED"},
		"TC writes the ext4 image itself in one pass and never loop-mounts"},
	{[]string{"CUBE_TEMPLATE_CENTER_NODE_IP", "CUBE_SANDBOX_NODE_IP"},
		"TC listens where the socket unit (ListenStream=) or common.http_bind says, never narrowed to a node IP"},
	{[]string{"CUBE_TEMPLATE_CENTER_SERVE_TEMPLATE_API", "CUBE_TC_SERVE_TEMPLATE_API"},
		"TC does not serve the public template routes; CubeMaster does"},
	{[]string{"CUBEMASTER_NATIVE_ROOTFS_EXPORT_ENABLED"},
		"TC always pulls natively (no Docker, skopeo or umoci)"},
	{[]string{"CUBE_TEMPLATECENTER_LAYER_CACHE_DIR"},
		"the layer cache is always on, under store.work_dir (CUBE_TEMPLATE_CENTER_WORK_DIR)"},
	{[]string{"CUBEMASTER_EXT4_FIXED_OVERHEAD_MIB", "CUBEMASTER_EXT4_OVERHEAD_PERCENT"},
		"TC sizes each image from its content; build.headroom_percent and build.headroom_inodes leave room for the guest"},
	{[]string{"CUBEMASTER_DISK_SPACE_SAFETY_MARGIN"},
		"TC writes no scratch copy; it keeps store.min_free free on the store as it writes"},
	{[]string{"CUBE_AUTO_MIGRATION"}, whyNoMigrate},
	{[]string{"CUBETEMPLATECENTER_HTTP_BIND"},
		"read by upstream's installer only; set common.http_bind, or ListenStream= in the socket unit"},
	{[]string{"CUBETEMPLATECENTER_ADDR"},
		"read by upstream's post-start check only; TC tells systemd itself when it serves"},
	{[]string{"CUBE_TEMPLATE_CENTER_ADDR"}, "CubeMaster's variable, for reaching TC; TC does not read it"},
}

// suggest returns the known key closest to the unknown key, "" when none
// is close: the same name in the same section with a typo, or the exact
// name in another section.
func suggest(key string) string {
	section, leaf := splitKey(key)
	best, bestDist := "", 0
	for _, k := range knownKeys() {
		ks, kl := splitKey(k)
		d := editDistance(leaf, kl)
		if ks != section {
			if d != 0 {
				continue
			}
			d = 1 // the right name in the wrong section
		}
		if limit := max(1, len(leaf)/4); d <= limit && (best == "" || d < bestDist) {
			best, bestDist = k, d
		}
	}
	return best
}

func splitKey(key string) (section, leaf string) {
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		return key[:i], key[i+1:]
	}
	return "", key
}

// knownKeys are every key the file may hold: TC's, from the struct tags,
// and upstream's.
func knownKeys() []string {
	var keys []string
	for _, s := range Default().flatten() {
		keys = append(keys, s.Key)
		// Sections too, so that a misspelt section is found.
		for sec := s.Key; strings.Contains(sec, "."); {
			sec, _ = splitKey(sec)
			keys = append(keys, sec)
		}
	}
	for k := range upstreamKeys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// editDistance is the number of byte insertions, deletions, substitutions
// and swaps of neighbours that turn a into b (optimal string alignment):
// a swap is the commonest typo, so it counts one.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
