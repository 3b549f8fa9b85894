package config

import (
	"strings"
	"testing"
)

// TestDecodeErrorsNameTheKey: a value that does not fit its key's type is
// reported with the key and line, every such value at once.
func TestDecodeErrorsNameTheKey(t *testing.T) {
	_, _, err := readFile(t, "build:\n  layer_cache_quota: 20 bananas\nstore:\n  min_free: 5 apples\n"+
		"common: {http_port: abc, max_body_bytes: 1x}\nregistry:\n  insecure: {a: b}\nlog: 5\n", nil, Options{})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`build.layer_cache_quota (line 2): "20 bananas" is not a size like 512MiB, 512Mi or 20G`,
		`store.min_free (line 4): "5 apples" is not a size like 10GiB or a percentage like 5%`,
		"common.http_port (line 5): cannot unmarshal !!str `abc` into int",
		`common.max_body_bytes (line 5): "1x" is not a size`,
		"registry.insecure (line 7): cannot unmarshal !!map into []string",
		"log (line 8): cannot unmarshal !!int `5` into config.Log",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "line 2: ") {
		t.Errorf("the line is named twice:\n%v", err)
	}
}
