package config

import (
	"fmt"
	"strconv"
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
}

// defaultReplicas is upstream's poll interval and reconcile period.
func defaultReplicas() Replicas {
	return Replicas{LockPollInterval: 5 * time.Second, LockKeepalive: 10 * time.Second, ReconcileInterval: 10 * time.Minute}
}

// replicasEnv are the replica settings' environment overrides, under
// upstream's names (CUBE_TC_* the deprecated ones).
var replicasEnv = []envOverride{
	{[]string{"CUBE_TEMPLATE_CENTER_RECONCILE_INTERVAL", "CUBE_TC_RECONCILE_INTERVAL"}, func(c *Config, name, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%s: %q is not a duration (e.g. 10m)", name, v)
		}
		c.Replicas.ReconcileInterval = d
		return nil
	}},
	{[]string{"CUBE_TEMPLATE_CENTER_RECONCILE_DISABLED", "CUBE_TC_RECONCILE_DISABLED"}, func(c *Config, name, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%s: %q is not a boolean", name, v)
		}
		c.Replicas.ReconcileDisabled = b
		return nil
	}},
}

// validate returns the replica settings' problems, each naming its key.
func (r *Replicas) validate() []error {
	var errs []error
	for key, d := range map[string]time.Duration{"replicas.lock_poll_interval": r.LockPollInterval,
		"replicas.lock_keepalive": r.LockKeepalive, "replicas.reconcile_interval": r.ReconcileInterval} {
		if d < 100*time.Millisecond {
			errs = append(errs, fmt.Errorf("%s: %s is below 100ms", key, d))
		}
	}
	return errs
}
