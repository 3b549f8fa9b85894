package config

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// Parse decodes YAML over the defaults, returning warnings for unknown keys
// and upstream names.
func Parse(r io.Reader) (*Config, []string, error) {
	cfg := Default()
	rep := &Provenance{}
	if err := cfg.parse(r, "config", false, rep); err != nil {
		return nil, nil, err
	}
	var warnings []string
	for _, w := range rep.Warnings {
		warnings = append(warnings, w.Text)
	}
	return cfg, warnings, nil
}

// parse decodes the file over c. Upstream's keys are applied under TC's
// names or reported ignored (upstream.go); unknown keys are warnings, or
// errors when strict (or config.strict) says so. name labels the sources.
func (c *Config) parse(r io.Reader, name string, strict bool, rep *Provenance) error {
	var doc yaml.Node
	if err := yaml.NewDecoder(r).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file means defaults
		}
		return fmt.Errorf("parse YAML: %w", err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return errors.New("parse YAML: the top level must be a mapping of sections")
	}
	if err := doc.Decode(c); err != nil {
		if keyed := decodeErrors(doc.Content[0], reflect.TypeOf(*c), ""); len(keyed) > 0 {
			return errors.Join(keyed...)
		}
		return fmt.Errorf("decode: %w", err)
	}
	w := &walker{name: name, rep: rep, upstream: map[string]*yaml.Node{}}
	w.walk(doc.Content[0], reflect.TypeOf(*c), "")
	errs := w.applyUpstream(c)
	for _, u := range w.unknown {
		hint := ""
		if u.hint != "" {
			hint = "; " + u.hint
		}
		if strict || c.ConfigFile.Strict {
			errs = append(errs, fmt.Errorf("%s: unknown keys are errors in strict mode%s", u.what, hint))
		} else {
			rep.warn(false, "%s ignored%s", u.what, hint)
		}
	}
	return errors.Join(errs...)
}

// decodeErrors decodes each value of the mapping n on its own into its
// field of t, and returns an error for each value that does not fit, naming
// its key and line, as every other error about the file does: yaml names
// the line alone, and stops at the first value one of our types refuses.
// Keys t has no field for are the walker's.
func decodeErrors(n *yaml.Node, t reflect.Type, prefix string) []error {
	if n.Kind != yaml.MappingNode || t.Kind() != reflect.Struct {
		return nil
	}
	fields := yamlFields(t)
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		ft, ok := fields[k.Value]
		if !ok {
			continue
		}
		key := prefix + k.Value
		if v.Kind == yaml.MappingNode && ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(unmarshalerType) {
			errs = append(errs, decodeErrors(v, ft, key+".")...)
			continue
		}
		if err := v.Decode(reflect.New(ft).Interface()); err != nil {
			errs = append(errs, fmt.Errorf("%s (line %d): %s", key, v.Line, decodeMessage(err)))
		}
	}
	return errs
}

// decodeMessage is what a failed decode says, without the line yaml puts
// in front of each of its own errors.
func decodeMessage(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err.Error()
	}
	msgs := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		if line, rest, ok := strings.Cut(e, ": "); ok && strings.HasPrefix(line, "line ") {
			e = rest
		}
		msgs[i] = e
	}
	return strings.Join(msgs, "; ")
}

// yamlFields maps the YAML keys of struct type t to their fields' types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			fields[name] = t.Field(i).Type
		}
	}
	return fields
}

// walker walks the file's mappings against the configuration's types: it
// records each key's line as its source, collects upstream's keys and
// describes unknown ones.
type walker struct {
	name     string
	rep      *Provenance
	upstream map[string]*yaml.Node // upstream key → its key node
	values   map[string]*yaml.Node // upstream key → its value node
	unknown  []unknownKey
	// dbSection is set when instance_db_config is a mapping.
	dbSection bool
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, prefix string) {
	if n.Kind != yaml.MappingNode {
		return
	}
	fields := map[string]reflect.Type{}
	if t != nil && t.Kind() == reflect.Struct {
		fields = yamlFields(t)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := prefix + k.Value
		if _, ok := upstreamKeys[key]; ok {
			w.upstream[key] = k
			if w.values == nil {
				w.values = map[string]*yaml.Node{}
			}
			w.values[key] = v
			continue
		}
		ft, ok := fields[k.Value]
		switch {
		case ok:
			w.rep.setSource(key, fmt.Sprintf("%s:%d", w.name, k.Line))
			if key == "instance_db_config" && v.Kind == yaml.MappingNode {
				w.dbSection = true
			}
			if ft.Kind() == reflect.Struct {
				w.walk(v, ft, key+".")
			}
		case upstreamSection(key) && v.Kind == yaml.MappingNode:
			w.walk(v, nil, key+".")
		default:
			w.unknown = append(w.unknown, unknownKey{fmt.Sprintf("unknown key %q (line %d)", key, k.Line), hintFor(key)})
		}
	}
}

// unknownKey is a key of the file that matches no setting, with what the
// file may have meant ("" for nothing close).
type unknownKey struct{ what, hint string }

// hintFor says what a file meant by the unknown key: the variable of a
// setting only the environment holds, or the closest known key, never the
// key itself.
func hintFor(key string) string {
	if h := envOnlyHint(key); h != "" {
		return h
	}
	if s := suggest(key); s != "" && s != key {
		return fmt.Sprintf("did you mean %q?", s)
	}
	return ""
}
