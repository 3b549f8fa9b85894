package config

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestReplicasDefaultsAndYAML(t *testing.T) {
	if got, want := Default().Replicas, (Replicas{LockPollInterval: 5 * time.Second, LockKeepalive: 10 * time.Second,
		ReconcileInterval: 10 * time.Minute, OrphanAge: 24 * time.Hour}); got != want {
		t.Errorf("defaults = %+v, want %+v", got, want)
	}
	c, warnings, err := Parse(strings.NewReader("replicas:\n  lock_poll_interval: 1s\n  lock_keepalive: 3s\n" +
		"  reconcile_interval: 2m\n  reconcile_disabled: true\n  orphan_age: 48h\n"))
	if err != nil || len(warnings) != 0 || c.Validate() != nil {
		t.Fatalf("Parse = %v, %v, %v", err, warnings, c.Validate())
	}
	if want := (Replicas{time.Second, 3 * time.Second, 2 * time.Minute, true, 48 * time.Hour}); c.Replicas != want {
		t.Errorf("Replicas = %+v, want %+v", c.Replicas, want)
	}
}

func TestOrphanAgeFloor(t *testing.T) {
	c, _, err := Parse(strings.NewReader("replicas:\n  orphan_age: 30m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "replicas.orphan_age") {
		t.Errorf("orphan_age 30m: Validate = %v, want an error naming replicas.orphan_age", err)
	}
}

func TestReplicasEnv(t *testing.T) {
	var logged strings.Builder
	logger := slog.New(slog.NewTextHandler(&logged, nil))
	c, err := Load(envOf(map[string]string{"CUBE_TEMPLATE_CENTER_RECONCILE_INTERVAL": "30s",
		"CUBE_TC_RECONCILE_DISABLED": "true"}), logger)
	if err != nil {
		t.Fatal(err)
	}
	if c.Replicas.ReconcileInterval != 30*time.Second || !c.Replicas.ReconcileDisabled {
		t.Errorf("Replicas from the environment = %+v", c.Replicas)
	}
	if !strings.Contains(logged.String(), "CUBE_TC_RECONCILE_DISABLED is deprecated") {
		t.Errorf("no deprecation warning for the legacy name: %s", logged.String())
	}
	// Values upstream ignores or reads otherwise: upstream's reading, with
	// a warning (the whole matrix is TestUpstreamVariableParsing's).
	logged.Reset()
	c, err = Load(envOf(map[string]string{"CUBE_TEMPLATE_CENTER_RECONCILE_INTERVAL": "ten",
		"CUBE_TEMPLATE_CENTER_RECONCILE_DISABLED": "ten"}), logger)
	if err != nil || c.Replicas.ReconcileInterval != 10*time.Minute || c.Replicas.ReconcileDisabled {
		t.Errorf("=ten: %v, %+v; want upstream's default interval and the sweep on", err, c)
	}
	for _, env := range []string{"CUBE_TEMPLATE_CENTER_RECONCILE_INTERVAL", "CUBE_TEMPLATE_CENTER_RECONCILE_DISABLED"} {
		if !strings.Contains(logged.String(), env+`=\"ten\"`) {
			t.Errorf("no warning naming %s:\n%s", env, logged.String())
		}
	}
	// The file's key is TC's: below the floor is an error there.
	if _, _, err := loadWith(t, "replicas:\n  reconcile_interval: 1ms\n", nil); err == nil ||
		!strings.Contains(err.Error(), "replicas.reconcile_interval") {
		t.Errorf("a 1ms interval: error %v, want one naming replicas.reconcile_interval", err)
	}
}
