package config

import (
	"slices"
	"strings"
	"testing"
)

// settingsByKey lists rep's settings of c by key, failing on a key listed
// twice.
func settingsByKey(t *testing.T, rep *Provenance, c *Config) map[string]Setting {
	t.Helper()
	byKey := map[string]Setting{}
	for _, s := range rep.Settings(c) {
		if _, dup := byKey[s.Key]; dup {
			t.Errorf("%s listed twice", s.Key)
		}
		byKey[s.Key] = s
	}
	return byKey
}

// fileOf writes settings back as a configuration file: each dotted key
// nested under its sections, with the value as check-config prints it.
func fileOf(settings []Setting) string {
	var b strings.Builder
	var open []string // the sections of the previous key
	for _, s := range settings {
		path := strings.Split(s.Key, ".")
		common := 0
		for common < len(open) && common < len(path)-1 && open[common] == path[common] {
			common++
		}
		for i := common; i < len(path)-1; i++ {
			b.WriteString(strings.Repeat("  ", i) + path[i] + ":\n")
		}
		b.WriteString(strings.Repeat("  ", len(path)-1) + path[len(path)-1] + ": " + s.Value + "\n")
		open = path[:len(path)-1]
	}
	return b.String()
}

// TestSettingsAreKeysOrVariables: every setting check-config lists is
// either a key the file takes (written back as printed, no key is unknown
// and each gives the same value, from the file) or a variable, for
// the two settings only the environment holds; never a key the file
// refuses (an unknown key is a warning).
func TestSettingsAreKeysOrVariables(t *testing.T) {
	c, rep, err := readFile(t, "", map[string]string{"CUBE_TEMPLATE_CALLBACK_TOKEN": "token-secret-value",
		"CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN": "true"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	byKey := settingsByKey(t, rep, c)
	for key, want := range map[string][2]string{
		"CUBE_TEMPLATE_CALLBACK_TOKEN":             {"REDACTED", "env CUBE_TEMPLATE_CALLBACK_TOKEN"},
		"CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN": {"true", "env CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN"},
	} {
		if s := byKey[key]; s.Value != want[0] || s.Source != want[1] {
			t.Errorf("%s = %+v, want value %s from %s", key, s, want[0], want[1])
		}
	}
	var keys []Setting
	for _, s := range rep.Settings(c) {
		switch {
		case strings.Contains(s.Key, "."):
			keys = append(keys, s)
		case strings.ToUpper(s.Key) != s.Key:
			t.Errorf("%s is neither a section.key nor a variable", s.Key)
		}
	}
	text := fileOf(keys)
	back, rep2, err := readFile(t, text, nil, Options{})
	if err != nil {
		t.Fatalf("the settings written back as a file: %v\n%s", err, text)
	}
	for _, w := range rep2.Warnings {
		if strings.HasPrefix(w.Text, "unknown key") {
			t.Errorf("the settings written back: %s", w.Text)
		}
	}
	again := settingsByKey(t, rep2, back)
	for _, s := range keys {
		if got := again[s.Key]; got.Value != s.Value || !strings.HasPrefix(got.Source, rep2.Path+":") {
			t.Errorf("%s written back = %+v, want %s from the file", s.Key, got, s.Value)
		}
	}
}

// TestEnvOnlyKeyInFile: a file naming an environment-only setting as a key
// is told which variable sets it, and a hint never names the unknown key
// itself.
func TestEnvOnlyKeyInFile(t *testing.T) {
	_, rep, err := readFile(t, "master:\n  token: x\n  insecure_no_token: true\n", nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, w := range rep.Warnings {
		texts = append(texts, w.Text)
	}
	for _, want := range []string{
		`unknown key "master.token" (line 2) ignored; the environment alone sets it: CUBE_TEMPLATE_CALLBACK_TOKEN`,
		`unknown key "master.insecure_no_token" (line 3) ignored; the environment alone sets it: CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN`,
	} {
		if !slices.Contains(texts, want) {
			t.Errorf("warnings %q lack %q", texts, want)
		}
	}
	for _, key := range []string{"master.token", "master.insecure_no_token", "build.max_concurent_builds", "common.http_bnd"} {
		if h := hintFor(key); strings.Contains(h, `"`+key+`"`) {
			t.Errorf("hintFor(%q) = %q, which suggests the key itself", key, h)
		}
	}
	if h := hintFor("build.max_concurent_builds"); h != `did you mean "build.max_concurrent_builds"?` {
		t.Errorf("hintFor(a typo) = %q", h)
	}
}

// TestStrictShowsItsSource: config.strict shows the strictness in force
// and what asked for it, as every setting does.
func TestStrictShowsItsSource(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		env        map[string]string
		opts       Options
		value      string
		source     string // "" for the file's line 2
	}{
		{"Default", "", nil, Options{}, "false", "default"},
		{"Env", "", map[string]string{StrictEnv: "true"}, Options{}, "true", "env " + StrictEnv},
		{"EnvFalse", "", map[string]string{StrictEnv: "false"}, Options{}, "false", "default"},
		{"Flag", "", map[string]string{StrictEnv: "true"}, Options{Strict: true}, "true", "flag --strict-config"},
		{"File", "config:\n  strict: true\n", nil, Options{}, "true", ""},
		{"EnvOverFile", "config:\n  strict: false\n", map[string]string{StrictEnv: "1"}, Options{}, "true", "env " + StrictEnv},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, rep, err := readFile(t, tc.file, tc.env, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.source
			if want == "" {
				want = rep.Path + ":2"
			}
			if s := settingsByKey(t, rep, c)["config.strict"]; s.Value != tc.value || s.Source != want {
				t.Errorf("config.strict = %+v, want %s from %s", s, tc.value, want)
			}
		})
	}
}
