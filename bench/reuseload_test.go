package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestReuseLoadReport(t *testing.T) {
	r := &Results{ReuseLoad: []ReuseLoadSample{
		{Image: "debian", Sample: 0, Cold: time.Second, Accept: 5 * time.Millisecond, Reuse: 40 * time.Millisecond},
		{Image: "debian", Sample: 1, Cold: 3 * time.Second, Accept: 7 * time.Millisecond, Reuse: 60 * time.Millisecond},
		{Image: "debian", Sample: 2, Cold: 2 * time.Second, Accept: 9 * time.Millisecond, Reuse: 50 * time.Millisecond},
		{Image: "large", Sample: 0, Cold: 2 * time.Second, Accept: 5 * time.Millisecond, Reuse: 30 * time.Millisecond},
		{Image: "large", Sample: 1, Cold: 2 * time.Second, Accept: 5 * time.Millisecond, Reuse: 100 * time.Millisecond},
	}}
	want := map[string]bool{"reuse under load debian": true, "reuse under load large": false}
	got := map[string]bool{}
	for _, tg := range r.reuseLoadTargets() {
		got[tg.Name] = tg.Pass
		if tg.Name == "reuse under load debian" && tg.Got != "median 50.0 ms, max 60.0 ms over 3" {
			t.Errorf("debian target Got = %q", tg.Got)
		}
	}
	for name, pass := range want {
		if p, ok := got[name]; !ok || p != pass {
			t.Errorf("target %q: pass = %v (present %v), want %v (a sample of 100 ms misses)", name, p, ok, pass)
		}
	}
	var b bytes.Buffer
	r.writeReuseLoad(&b)
	if !strings.Contains(b.String(), "| debian | 3 | 50.0 | 60.0 | 7.0 | 2.000 |") {
		t.Errorf("reuse under load table lacks the debian row:\n%s", b.String())
	}
	var all bytes.Buffer
	if err := r.Write(&all); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(all.String(), "MISS  reuse under load large") {
		t.Errorf("report lacks the large image's verdict:\n%s", all.String())
	}
}
