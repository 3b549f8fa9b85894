package config

import (
	"cmp"
	"errors"
	"fmt"
	"math"
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
		return upstreamTimeout(v, "common.read_timeout", &c.Common.ReadTimeout)
	}},
	"common.http_writetimeout": {to: "common.write_timeout", apply: func(c *Config, v *yaml.Node) error {
		return upstreamTimeout(v, "common.write_timeout", &c.Common.WriteTimeout)
	}},
	"common.master_addr": {to: "master.addr", apply: func(c *Config, v *yaml.Node) error {
		var s string
		if err := v.Decode(&s); err != nil {
			return err
		}
		// Upstream trims the value and falls back on its default when
		// nothing is left.
		if s = strings.TrimSpace(s); s == "" {
			return ignored("blank, which upstream also takes as unset (master.addr stays %s)", c.Master.Addr)
		}
		c.Master.Addr = s
		return nil
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

// upstreamTimeout applies one of upstream's HTTP timeouts (v) to dst, the
// TC key named key: upstreamSeconds' reading, where a value upstream's
// loader replaces by its default (0), or that net/http takes as no timeout
// (below 0), leaves TC's own value.
func upstreamTimeout(v *yaml.Node, key string, dst *time.Duration) error {
	d, ok, err := upstreamSeconds(v.Value)
	switch {
	case err != nil:
		return err
	case !ok && d == 0:
		return ignored("0, which upstream's loader takes as unset (%s stays %s)", key, *dst)
	case !ok:
		return ignored("%s, which upstream runs as no timeout at all; TC always bounds its connections (%s stays %s)",
			strings.TrimSpace(v.Value), key, *dst)
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
			err := u.apply(c, w.values[key])
			var fb *fellBack
			switch {
			case errors.As(err, &fb):
				w.rep.warn(false, "%s (line %d) is %s", key, line, fb.note)
				if !fb.applied {
					continue
				}
			case err != nil:
				errs = append(errs, fmt.Errorf("%s (line %d): %w", key, line, err))
				continue
			default:
				w.rep.warn(false, "%s (line %d) is deprecated, use %s (applied)", key, line, u.to)
			}
			w.rep.setSource(u.to, fmt.Sprintf("%s:%d (%s)", w.name, line, key))
		}
	}
	// Upstream's loader takes a port of 0 as unset (its default is 8089,
	// CubeMaster's); TC's default applies, as when the key is absent.
	if src, ok := w.rep.sources["common.http_port"]; ok && c.Common.HTTPPort == 0 {
		c.Common.HTTPPort = Default().Common.HTTPPort
		w.rep.warn(false, "common.http_port (line %s) is 0, which upstream's loader takes as unset: TC's default %d applies",
			strings.TrimPrefix(src, w.name+":"), c.Common.HTTPPort)
		delete(w.rep.sources, "common.http_port")
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
// only: still applied, each with a warning naming the key, and read by
// upstream's rules.
var upstreamEnv = []envOverride{
	{key: "build.download_jobs", names: []string{"CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS"}, fileOnly: true, raw: true,
		set: func(c *Config, name, v string) error {
			// Upstream reads the value as written: " 8" is not a number.
			n, ok := upstreamAtoi(v, false)
			if !ok {
				return ignored("not a whole number of at least 1, which upstream also ignores (build.download_jobs stays %d)",
					c.Build.DownloadJobs)
			}
			return capTo(n, maxDownloadJobs, &c.Build.DownloadJobs, "upstream's cap")
		}},
	{key: "build.layer_cache_quota", names: []string{"CUBE_TEMPLATECENTER_LAYER_CACHE_QUOTA_BYTES"}, fileOnly: true,
		set: func(c *Config, name, v string) error {
			b, ok := upstreamBytes(v)
			if !ok {
				return ignored("not a positive number of bytes (or a size such as 20Gi), which upstream also ignores "+
					"(build.layer_cache_quota stays %s)", c.Build.LayerCacheQuota)
			}
			c.Build.LayerCacheQuota = b
			return nil
		}},
}

// maxDownloadJobs is build.download_jobs' limit, upstream's cap on
// CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS.
const maxDownloadJobs = 32

// fellBack is what the setter of an upstream variable or key returns when it
// did not take the value as written but applied upstream's own rule for it:
// its default (the value is ignored) or its cap. It is a warning, never an
// error: upstream runs with such a value, so TC must too.
type fellBack struct {
	// note completes "NAME=VALUE is ..." and "key (line N) is ...".
	note string
	// applied is set when the setting took a value (a capped one).
	applied bool
}

func (f *fellBack) Error() string { return f.note }

// ignored is a fellBack that left the setting as it was.
func ignored(format string, args ...any) error {
	return &fellBack{note: "ignored: " + fmt.Sprintf(format, args...)}
}

// capTo sets *dst to n, or to limit when n is above it, saying whose
// limit it is.
func capTo(n, limit int, dst *int, whose string) error {
	if n > limit {
		*dst = limit
		return &fellBack{note: fmt.Sprintf("above %s %d: %d applies", whose, limit, limit), applied: true}
	}
	*dst = n
	return nil
}

// Upstream's readings of its variables, kept apart from the environment so
// that each is tested on strings. Each returns ok false for a value
// upstream treats as unset, falling back on its default.

// upstreamAtoi is upstream's integer variables: strconv.Atoi of the value,
// trimmed first when trim is set; a value that does not parse or is below 1
// is unset.
func upstreamAtoi(v string, trim bool) (int, bool) {
	if trim {
		v = strings.TrimSpace(v)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, false
	}
	return n, true
}

// upstreamDuration is upstream's reconciler durations: time.ParseDuration
// of the trimmed value; one that does not parse or is not positive is
// unset.
func upstreamDuration(v string) (time.Duration, bool) {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 {
		return 0, false
	}
	return d, true
}

// upstreamBytes is upstream's layer cache quota: a positive strconv.ParseInt
// of the trimmed value, bytes. TC also takes its sizes (20Gi, 512MiB).
func upstreamBytes(v string) (ByteSize, bool) {
	b, err := ParseByteSize(v)
	if err != nil || b <= 0 {
		return 0, false
	}
	return b, true
}

// upstreamFlag is upstream's boolean variables (tcconfig's boolValue): 1,
// true, yes and on, in any case and trimmed, are true, anything else false.
// known is false for a value that is none of those nor 0, false, no or off:
// upstream reads it as false without a word.
func upstreamFlag(v string) (b, known bool) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true, true
	case "0", "false", "no", "off":
		return false, true
	}
	return false, false
}

// upstreamTrue is how upstream reads CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN:
// true only for "true", in any case and trimmed. known is false for
// anything but true and false ("1" and "yes" too: upstream keeps its
// authentication on for them).
func upstreamTrue(v string) (b, known bool) {
	switch v = strings.TrimSpace(v); {
	case strings.EqualFold(v, "true"):
		return true, true
	case strings.EqualFold(v, "false"):
		return false, true
	}
	return false, false
}

// maxSeconds is the largest whole number of seconds a time.Duration holds.
const maxSeconds = math.MaxInt64 / int64(time.Second)

// upstreamSeconds reads one of upstream's common.http_*timeout values: an
// int field of whole seconds to upstream ("120"), to which TC adds a Go
// duration ("2m"). ok is false, with d zero, for 0, which upstream's loader
// replaces by its default; false, with d negative, for a negative value,
// which net/http runs as no timeout. Anything else that is not a number
// is an error: upstream's loader refuses it too.
func upstreamSeconds(s string) (d time.Duration, ok bool, err error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > maxSeconds {
			n = maxSeconds
		}
		d = time.Duration(max(n, -maxSeconds)) * time.Second
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, false, fmt.Errorf("%q is not whole seconds (120) or a duration (2m)", s)
	}
	return d, d > 0, nil
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
