package config

import (
	"fmt"
	"time"
)

// Replicas tunes how TC coordinates with other replicas through CubeMaster's
// database (replicas:). It matters only with instance_db_config.
type Replicas struct {
	// LockPollInterval is how often a build that found its fingerprint's
	// lock held by another replica checks for a READY artifact row and
	// tries the lock again.
	LockPollInterval time.Duration `yaml:"lock_poll_interval"`
	// LockKeepalive is how often a held lock's connection is used to check
	// the lock, so idle timeouts never drop it; shortened to a third of the
	// server's idle timeout when that is shorter.
	LockKeepalive time.Duration `yaml:"lock_keepalive"`
	// ReconcileInterval is the period of the CLEANUP_PENDING sweep, whose
	// first pass runs soon after start.
	ReconcileInterval time.Duration `yaml:"reconcile_interval"`
	// ReconcileDisabled turns the sweep off.
	ReconcileDisabled bool `yaml:"reconcile_disabled"`
	// OrphanAge is how long after its BUILT report reached CubeMaster a
	// local copy that CubeMaster's database has no row for is kept before
	// it is removed (and then only when two sweeps a reconcile interval
	// apart found no row). It must outlast CubeMaster's own replay of a
	// BUILT job whose registration failed.
	OrphanAge time.Duration `yaml:"orphan_age"`
}

// DefaultOrphanAge is replicas.orphan_age's default: CubeMaster registers
// an artifact after the BUILT callback, asynchronously, and a BUILT job
// whose registration failed (its lock wait timed out) is replayed by
// CubeMaster's job reconciler, which treats a job as stale after an hour
// and runs every 10 minutes. A day is twenty times that window, and well
// inside the 7 days CubeMaster keeps an artifact row's gc_deadline.
const DefaultOrphanAge = 24 * time.Hour

// minOrphanAge is the shortest replicas.orphan_age: below it a copy could
// go while CubeMaster may still register it.
const minOrphanAge = 2 * time.Hour

// defaultReplicas is upstream's poll interval and reconcile period.
func defaultReplicas() Replicas {
	return Replicas{LockPollInterval: 5 * time.Second, LockKeepalive: 10 * time.Second, ReconcileInterval: 10 * time.Minute,
		OrphanAge: DefaultOrphanAge}
}

// replicasEnv are the replica settings' environment overrides, under
// upstream's names (CUBE_TC_* the deprecated ones).
var replicasEnv = []envOverride{
	{key: "replicas.reconcile_interval", names: []string{"CUBE_TEMPLATE_CENTER_RECONCILE_INTERVAL", "CUBE_TC_RECONCILE_INTERVAL"}, set: func(c *Config, name, v string) error {
		d, ok := upstreamDuration(v)
		if !ok {
			return ignored("not a positive duration (such as 10m), which upstream also ignores (replicas.reconcile_interval stays %s)",
				c.Replicas.ReconcileInterval)
		}
		if d < minReplicasInterval {
			// Upstream has no floor; TC's keeps the sweep from spinning.
			c.Replicas.ReconcileInterval = minReplicasInterval
			return &fellBack{note: fmt.Sprintf("below TC's floor %s: %s applies", minReplicasInterval, minReplicasInterval), applied: true}
		}
		c.Replicas.ReconcileInterval = d
		return nil
	}},
	{key: "replicas.reconcile_disabled", names: []string{"CUBE_TEMPLATE_CENTER_RECONCILE_DISABLED", "CUBE_TC_RECONCILE_DISABLED"}, set: func(c *Config, name, v string) error {
		b, known := upstreamFlag(v)
		c.Replicas.ReconcileDisabled = b
		if !known {
			return &fellBack{note: "not one of 1, true, yes, on, 0, false, no, off: upstream reads it as false, the sweep stays on", applied: true}
		}
		return nil
	}},
}

// minReplicasInterval is the shortest replicas interval.
const minReplicasInterval = 100 * time.Millisecond

// validate returns the replica settings' problems, each naming its key.
func (r *Replicas) validate() []error {
	var errs []error
	for key, d := range map[string]time.Duration{"replicas.lock_poll_interval": r.LockPollInterval,
		"replicas.lock_keepalive": r.LockKeepalive, "replicas.reconcile_interval": r.ReconcileInterval} {
		if d < minReplicasInterval {
			errs = append(errs, fmt.Errorf("%s: %s is below %s", key, d, minReplicasInterval))
		}
	}
	if r.OrphanAge < minOrphanAge {
		errs = append(errs, fmt.Errorf("replicas.orphan_age: %s is below %s, within CubeMaster's replay of BUILT jobs", r.OrphanAge, minOrphanAge))
	}
	return errs
}
