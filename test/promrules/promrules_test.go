package promrules

import (
	"slices"
	"strings"
	"testing"
)

const sample = `groups:
  - name: a
    rules:
      - record: job:x:rate5m
        expr: rate(x[5m])
      - alert: First
        expr: x > 1
        for: 5m
        labels: {severity: warning}
  - name: b
    interval: 1m
    rules:
      - alert: Second
        expr: y > 1
`

// TestParse: the groups and rules read back, alerting rules in file order,
// recording rules counted but not listed as alerts.
func TestParse(t *testing.T) {
	f, err := parse([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range f.Alerts() {
		names = append(names, r.Alert)
	}
	if !slices.Equal(names, []string{"First", "Second"}) || f.Count() != 3 {
		t.Errorf("alerts %q, %d rules; want [First Second], 3", names, f.Count())
	}
	if r := f.Alert(t, "First"); r.For != "5m" || r.Labels["severity"] != "warning" || f.Groups[1].Interval != "1m" {
		t.Errorf("First = %+v, group b interval %q; want for 5m, severity warning, interval 1m", r, f.Groups[1].Interval)
	}
}

// TestParseStrict: a field rulefmt does not know, or a key given twice, is
// refused rather than dropped.
func TestParseStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"UnknownField": strings.Replace(sample, "for: 5m", "fore: 5m", 1),
		"WrongCase":    strings.Replace(sample, "expr: x > 1", "Expr: x > 1", 1),
		"DuplicateKey": strings.Replace(sample, "for: 5m", "for: 5m\n        for: 10m", 1),
	} {
		if _, err := parse([]byte(doc)); err == nil {
			t.Errorf("%s: parsed without error", name)
		}
	}
}
