package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const dbSection = `instance_db_config:
  driver: mysql
  addr: 10.0.0.5:3306
  user: cube
  pwd: db-pass-hunter2
  db_name: cube_mvp
  conn_timeout: 3
  read_timeout: 4
  write_timeout: 6
  max_idle_conns: 2
  max_open_conns: 8
  max_conn_life_time_seconds: 60
`

func TestInstanceDBOffByDefault(t *testing.T) {
	c := Default()
	if c.InstanceDB.Enabled() {
		t.Fatalf("InstanceDB enabled by default: %+v", c.InstanceDB)
	}
	// Without a driver nothing else is checked: TC works alone.
	c.InstanceDB.Addr, c.InstanceDB.ConnTimeout = "not an address", -1
	if err := c.Validate(); err != nil {
		t.Errorf("Validate without a driver = %v, want nil", err)
	}
}

func TestInstanceDBParse(t *testing.T) {
	c, warnings, err := Parse(strings.NewReader(dbSection))
	if err != nil || len(warnings) != 0 {
		t.Fatalf("Parse = %v, warnings %v", err, warnings)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := InstanceDB{Driver: "mysql", Addr: "10.0.0.5:3306", User: "cube", Pwd: "db-pass-hunter2", DBName: "cube_mvp",
		ConnTimeout: 3, ReadTimeout: 4, WriteTimeout: 6, MaxIdleConns: 2, MaxOpenConns: 8, MaxConnLifeTimeSeconds: 60}
	if c.InstanceDB != want {
		t.Errorf("InstanceDB = %+v, want %+v", c.InstanceDB, want)
	}
	// Unset keys keep upstream's defaults.
	c, _, err = Parse(strings.NewReader("instance_db_config:\n  driver: postgres\n  addr: db:5432\n  user: u\n  db_name: d\n  sslmode: require\n"))
	if err != nil || c.Validate() != nil {
		t.Fatalf("Parse = %v / %v", err, c.Validate())
	}
	if d := c.InstanceDB; d.ConnTimeout != 5 || d.ReadTimeout != 5 || d.WriteTimeout != 5 || d.MaxIdleConns != 5 ||
		d.MaxOpenConns != 20 || d.MaxConnLifeTimeSeconds != 300 || d.SSLMode != "require" {
		t.Errorf("defaults = %+v", d)
	}
}

func TestInstanceDBPasswordNeverPrints(t *testing.T) {
	c, _, err := Parse(strings.NewReader(dbSection))
	if err != nil {
		t.Fatal(err)
	}
	y, _ := yaml.Marshal(c)
	j, _ := json.Marshal(c)
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("cfg", "db", c.InstanceDB.Pwd)
	for name, out := range map[string]string{"%v": fmt.Sprintf("%v", c.InstanceDB), "%+v": fmt.Sprintf("%+v", c.InstanceDB),
		"%#v": fmt.Sprintf("%#v", c.InstanceDB), "yaml": string(y), "json": string(j), "slog": logged.String()} {
		if strings.Contains(out, "hunter2") {
			t.Errorf("%s shows the password: %s", name, out)
		}
	}
	if c.InstanceDB.Pwd.Reveal() != "db-pass-hunter2" {
		t.Errorf("Reveal = %q", c.InstanceDB.Pwd.Reveal())
	}
}

func TestInstanceDBInvalidNamesKey(t *testing.T) {
	base := "instance_db_config:\n  driver: mysql\n  addr: db:3306\n  user: u\n  db_name: d\n"
	cases := map[string]string{
		"instance_db_config:\n  driver: oracle\n  addr: db:1\n  user: u\n  db_name: d\n": "instance_db_config.driver",
		"instance_db_config:\n  driver: mysql\n":                                         "instance_db_config.addr",
		base + "  conn_timeout: 0\n":                                                     "instance_db_config.conn_timeout",
		base + "  read_timeout: -1\n":                                                    "instance_db_config.read_timeout",
		base + "  write_timeout: 4000\n":                                                 "instance_db_config.write_timeout",
		base + "  max_open_conns: 0\n":                                                   "instance_db_config.max_open_conns",
		base + "  max_idle_conns: 30\n":                                                  "instance_db_config.max_idle_conns: 30 is above max_open_conns 20",
		base + "  max_conn_life_time_seconds: 0\n":                                       "instance_db_config.max_conn_life_time_seconds",
		base + "  sslmode: require\n":                                                    "instance_db_config.sslmode",
		strings.Replace(base, "mysql", "postgres", 1) + "  sslmode: sometimes\n":         "instance_db_config.sslmode",
	}
	wantProblems(t, cases)
}

func TestInstanceDBFieldsNameKey(t *testing.T) {
	cases := []struct {
		edit func(*InstanceDB)
		want string
	}{
		{func(d *InstanceDB) { d.Addr = "db" }, `instance_db_config.addr: "db" is not host:port`},
		{func(d *InstanceDB) { d.Addr = "db:0" }, "instance_db_config.addr"},
		{func(d *InstanceDB) { d.Addr = ":3306" }, "instance_db_config.addr"},
		{func(d *InstanceDB) { d.User = " " }, "instance_db_config.user: required"},
		{func(d *InstanceDB) { d.DBName = "" }, "instance_db_config.db_name: required"},
	}
	for _, c := range cases {
		cfg := Default()
		cfg.InstanceDB.Driver, cfg.InstanceDB.Addr, cfg.InstanceDB.User, cfg.InstanceDB.DBName = "postgres", "db:5432", "u", "d"
		if err := cfg.Validate(); err != nil {
			t.Fatalf("valid base: %v", err)
		}
		c.edit(&cfg.InstanceDB)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate = %v, want it to mention %q", err, c.want)
		}
	}
}

func TestInstanceDBRestartOnly(t *testing.T) {
	a, b := Default(), Default()
	b.InstanceDB.Driver, b.InstanceDB.Addr = "mysql", "db:3306"
	if keys := a.RestartOnly(b); len(keys) != 1 || keys[0] != "instance_db_config" {
		t.Errorf("RestartOnly = %v, want [instance_db_config]", keys)
	}
}
