package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const redisSection = `redis:
  nodes:
    - 10.0.0.7:6379
  password: redis-pass-hunter2
  db_no: 3
`

func TestRedisOffByDefault(t *testing.T) {
	c := Default()
	if c.Redis.Enabled() || c.Redis.DBNo != 0 {
		t.Fatalf("Redis by default = %+v, want off on db 0", c.Redis)
	}
	// Without nodes nothing else is checked.
	c.Redis.DBNo = -1
	if err := c.Validate(); err != nil {
		t.Errorf("Validate without nodes = %v, want nil", err)
	}
}

func TestRedisParse(t *testing.T) {
	c, warnings, err := Parse(strings.NewReader(redisSection))
	if err != nil || len(warnings) != 0 {
		t.Fatalf("Parse = %v, warnings %v", err, warnings)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Redis{Nodes: Nodes{"10.0.0.7:6379"}, Password: "redis-pass-hunter2", DBNo: 3}
	if !c.Redis.equal(want) || !c.Redis.Enabled() {
		t.Errorf("Redis = %+v, want %+v", c.Redis, want)
	}
}

func TestRedisNodesForms(t *testing.T) {
	cases := []struct {
		name, doc string
		want      Nodes
	}{
		{"Sequence", "redis:\n  nodes: [a:1, b:2]\n", Nodes{"a:1", "b:2"}},
		{"OneString", "redis:\n  nodes: 127.0.0.1:6379\n", Nodes{"127.0.0.1:6379"}},
		{"CommaString", "redis:\n  nodes: \"a:1, b:2,,\"\n", Nodes{"a:1", "b:2"}},
		{"Empty", "redis:\n  nodes: []\n", nil},
		{"EmptyString", "redis:\n  nodes: \"\"\n", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := Parse(strings.NewReader(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.Redis.Nodes, tc.want) {
				t.Errorf("Nodes = %q, want %q", c.Redis.Nodes, tc.want)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate = %v", err)
			}
		})
	}
	if _, _, err := Parse(strings.NewReader("redis:\n  nodes: {a: 1}\n")); err == nil {
		t.Error("Parse of a mapping for redis.nodes succeeded, want an error")
	}
}

func TestRedisPasswordNeverPrints(t *testing.T) {
	c, _, err := Parse(strings.NewReader(redisSection))
	if err != nil {
		t.Fatal(err)
	}
	y, _ := yaml.Marshal(c)
	j, _ := json.Marshal(c)
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("cfg", "redis", c.Redis.Password)
	for name, out := range map[string]string{"%v": fmt.Sprintf("%v", c.Redis), "%+v": fmt.Sprintf("%+v", c.Redis),
		"%#v": fmt.Sprintf("%#v", c.Redis), "yaml": string(y), "json": string(j), "slog": logged.String()} {
		if strings.Contains(out, "hunter2") {
			t.Errorf("%s shows the password: %s", name, out)
		}
	}
	if c.Redis.Password.Reveal() != "redis-pass-hunter2" {
		t.Errorf("Reveal = %q", c.Redis.Password.Reveal())
	}
}

func TestRedisInvalidNamesKey(t *testing.T) {
	cases := map[string]string{
		"redis:\n  nodes: [redis]\n":                     `redis.nodes: "redis" is not host:port`,
		"redis:\n  nodes: [\":6379\"]\n":                 `redis.nodes: ":6379" is not host:port`,
		"redis:\n  nodes: [r:0]\n":                       `redis.nodes: "r:0" is not host:port`,
		"redis:\n  nodes: [r:65536]\n":                   `redis.nodes: "r:65536" is not host:port`,
		"redis:\n  nodes: [a:1, a:1]\n":                  `redis.nodes: "a:1" is listed twice`,
		"redis:\n  nodes: [a:1]\n  db_no: -1\n":          "redis.db_no: -1 is not a database number",
		"redis:\n  nodes: [a:1, b:1]\n  db_no: 2\n":      "redis.db_no: 2 with 2 nodes: a Redis cluster has database 0 only",
		"redis:\n  nodes: [a:1]\n  pasword: secret\n":    "", // a warning, checked below
		"redis:\n  nodes: [\"[::1]:6379\", x:1]\n":       "",
		"redis:\n  nodes: [a:1, b:1]\n  db_no: 0\n":      "",
		"redis:\n  nodes: [127.0.0.1:6379]\n  db_no: 15": "",
	}
	for doc, want := range cases {
		c, warnings, err := Parse(strings.NewReader(doc))
		if err == nil {
			err = c.Validate()
		}
		switch {
		case want == "" && err != nil:
			t.Errorf("config %q: error %v, want none", doc, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("config %q: error %v, want it to mention %q", doc, err, want)
		}
		if strings.Contains(doc, "pasword") && (len(warnings) != 1 || !strings.Contains(warnings[0], `"redis.pasword"`)) {
			t.Errorf("config %q: warnings %q, want one for redis.pasword", doc, warnings)
		}
	}
}

func TestRedisRestartOnly(t *testing.T) {
	a, b := Default(), Default()
	b.Redis.Nodes = Nodes{}
	if keys := a.RestartOnly(b); len(keys) != 0 {
		t.Errorf("RestartOnly for no nodes vs an empty list = %v, want none", keys)
	}
	for name, edit := range map[string]func(*Redis){
		"Nodes":    func(r *Redis) { r.Nodes = Nodes{"r:6379"} },
		"Password": func(r *Redis) { r.Password = "other" },
		"DBNo":     func(r *Redis) { r.DBNo = 1 },
	} {
		b := Default()
		edit(&b.Redis)
		if keys := a.RestartOnly(b); len(keys) != 1 || keys[0] != "redis" {
			t.Errorf("%s: RestartOnly = %v, want [redis]", name, keys)
		}
	}
}
