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
	Key    string `json:"key"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

// Settings lists every setting of c with its value and where it came from,
// in the order of the sections; secrets show only whether they are set.
func (r *Report) Settings(c *Config) []Setting {
	out := c.flatten()
	for i := range out {
		out[i].Source = r.Source(out[i].Key)
	}
	return out
}

var (
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	durationType    = reflect.TypeFor[time.Duration]()
	secretType      = reflect.TypeFor[Secret]()
)

// flatten lists c's settings by their file keys, plus the two that only
// the environment sets (master.token, master.insecure_no_token).
func (c *Config) flatten() []Setting {
	var out []Setting
	flattenValue(reflect.ValueOf(*c), "", &out)
	i := 0 // after the master section
	for j, s := range out {
		if strings.HasPrefix(s.Key, "master.") {
			i = j + 1
		}
	}
	extra := []Setting{{Key: "master.token", Value: formatValue(reflect.ValueOf(Secret(c.Master.Token)))},
		{Key: "master.insecure_no_token", Value: strconv.FormatBool(c.Master.InsecureNoToken)}}
	return slices.Insert(out, i, extra...)
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
