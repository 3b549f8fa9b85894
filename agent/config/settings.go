package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// Setting is one effective value, as `templatecenter check-config` prints
// it: secrets redacted.
type Setting struct {
	// Key is the file's key ("build.queue_size"), or the variable of a
	// setting only the environment holds ("CUBE_TEMPLATE_CALLBACK_TOKEN").
	Key    string `json:"key"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

// envOnly are the settings no file key holds: only their variable sets
// them, so check-config lists them under the variable. name is what the
// load records their source under, and what a file may hold by mistake
// (older releases printed it as a key).
var envOnly = []struct {
	name, variable string
	value          func(*Config) string
}{
	{"master.token", "CUBE_TEMPLATE_CALLBACK_TOKEN", func(c *Config) string { return formatValue(reflect.ValueOf(Secret(c.Master.Token))) }},
	{"master.insecure_no_token", "CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN", func(c *Config) string { return strconv.FormatBool(c.Master.InsecureNoToken) }},
}

// Settings lists every setting of c with its value and where it came from,
// in the order of the sections, the environment's own after master's;
// secrets show only whether they are set.
func (r *Provenance) Settings(c *Config) []Setting {
	out := c.flatten()
	for i := range out {
		out[i].Source = r.Source(out[i].Key)
	}
	i := 0 // after the master section
	for j, s := range out {
		if strings.HasPrefix(s.Key, "master.") {
			i = j + 1
		}
	}
	var env []Setting
	for _, e := range envOnly {
		env = append(env, Setting{Key: e.variable, Value: e.value(c), Source: r.Source(e.name)})
	}
	return slices.Insert(out, i, env...)
}

var (
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	durationType    = reflect.TypeFor[time.Duration]()
	secretType      = reflect.TypeFor[Secret]()
)

// flatten lists c's settings by their file keys: the keys a file may hold,
// and no other.
func (c *Config) flatten() []Setting {
	var out []Setting
	flattenValue(reflect.ValueOf(*c), "", &out)
	return out
}

// envOnlyHint says which variable sets key when key names a setting only
// the environment holds, "" otherwise.
func envOnlyHint(key string) string {
	for _, e := range envOnly {
		if e.name == key {
			return fmt.Sprintf("the environment alone sets it: %s", e.variable)
		}
	}
	return ""
}

func flattenValue(v reflect.Value, prefix string, out *[]Setting) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		f, key := v.Field(i), prefix+name
		if f.Kind() == reflect.Struct && !reflect.PointerTo(f.Type()).Implements(unmarshalerType) {
			flattenValue(f, key+".", out)
			continue
		}
		// A URL's userinfo and query are secrets (CUBE_MASTER_ADDR may
		// carry user:password@).
		*out = append(*out, Setting{Key: key, Value: safetext.Redact(formatValue(f))})
	}
}

// formatValue renders a setting as it could be written in the file.
func formatValue(v reflect.Value) string {
	switch {
	case v.Type() == secretType:
		if v.String() == "" {
			return `""`
		}
		return v.Interface().(Secret).String()
	case v.Type() == durationType:
		return v.Interface().(time.Duration).String()
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		return s.String()
	}
	switch v.Kind() {
	case reflect.String:
		return strconv.Quote(v.String())
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = formatValue(v.Index(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = formatValue(k) + ": " + formatValue(v.MapIndex(k))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v.Interface())
}
