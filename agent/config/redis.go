package config

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Redis locates CubeMaster's Redis (redis:, upstream's key names), where TC
// writes the live pull progress of running jobs. With no nodes nothing is
// written, as without the section.
type Redis struct {
	// Nodes are host:port addresses: one is a single server, several a
	// cluster. Empty turns Redis off.
	Nodes Nodes `yaml:"nodes"`
	// Password never prints (see Secret).
	Password Secret `yaml:"password"`
	// DBNo is the database number; it must be CubeMaster's (0 by default,
	// and the only one a cluster has).
	DBNo int `yaml:"db_no"`
	// TLS, when enabled, reaches every node over TLS with its certificate
	// verified.
	TLS TLS `yaml:"tls"`
}

// Nodes is a list of host:port addresses. In YAML it is a sequence, or a
// single string holding one address or several separated by commas.
type Nodes []string

// UnmarshalYAML accepts a sequence of addresses or one comma-separated
// string.
func (n *Nodes) UnmarshalYAML(v *yaml.Node) error {
	if v.Kind == yaml.ScalarNode {
		var s string
		if err := v.Decode(&s); err != nil {
			return err
		}
		*n = nil
		for part := range strings.SplitSeq(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				*n = append(*n, part)
			}
		}
		return nil
	}
	var list []string
	if err := v.Decode(&list); err != nil {
		return err
	}
	*n = list
	return nil
}

// defaultRedis is Redis off, on upstream's database number.
func defaultRedis() Redis { return Redis{DBNo: 0} }

// Enabled reports whether a Redis is configured.
func (r *Redis) Enabled() bool { return len(r.Nodes) > 0 }

// equal reports whether r and o are the same settings (no nodes and an
// empty list are the same).
func (r Redis) equal(o Redis) bool {
	return slices.Equal(r.Nodes, o.Nodes) && r.Password == o.Password && r.DBNo == o.DBNo && r.TLS == o.TLS
}

// validate returns the Redis settings' problems, each naming its key;
// nothing is checked when no node is configured.
func (r *Redis) validate() []error {
	if !r.Enabled() {
		return nil
	}
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("redis.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	seen := map[string]bool{}
	for _, node := range r.Nodes {
		if host, port, err := net.SplitHostPort(node); err != nil || host == "" || !validPort(port) {
			bad("nodes", "%q is not host:port", node)
		} else if seen[node] {
			bad("nodes", "%q is listed twice", node)
		}
		seen[node] = true
	}
	errs = append(errs, r.TLS.validate("redis.tls")...)
	switch {
	case r.DBNo < 0:
		bad("db_no", "%d is not a database number", r.DBNo)
	case r.DBNo != 0 && len(r.Nodes) > 1:
		bad("db_no", "%d with %d nodes: a Redis cluster has database 0 only", r.DBNo, len(r.Nodes))
	}
	return errs
}
