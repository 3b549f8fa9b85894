package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// TestReportsBounded: a build error an image made huge, and a start check
// result as large as an earlier release could record, reach CubeMaster,
// the spool, the log and the spans within their limits. Both are kept
// under the stand-in's 1 MiB body limit so that, unbounded, they arrive
// and show how large they are.
func TestReportsBounded(t *testing.T) {
	h := newHarness(t, nil)
	rec := tracetest.NewSpanRecorder()
	h.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	hugeName := strings.Repeat("é", 200_000)
	h.builder.beforePublish = func(ctx context.Context, spec rootfs.Spec) error {
		if strings.Contains(spec.Image.Digest, "/huge-error@") {
			return errors.New(`layer 0: entry "` + hugeName + `": name longer than 4095 bytes`)
		}
		return nil
	}
	check := &rootfs.StartCheck{Result: "warnings", Command: []string{"app"}}
	for range 200 {
		check.Command = append(check.Command, strings.Repeat("<", 100))
		check.Problems = append(check.Problems, `warning: command "app": skipped on PATH: `+strings.Repeat("/l:", 1000))
	}
	h.builder.startCheck = check
	h.start()

	h.submit("huge-error", "huge-error")
	cb := h.terminal("huge-error")
	msg := cb.Field("error_message")
	if cb.Field("status") != "FAILED" || !strings.HasPrefix(msg, `build image: layer 0: entry "éé`) {
		t.Errorf("terminal report %s with error_message %.100q…, want FAILED naming the entry", cb.Field("status"), msg)
	}
	if len(msg) > safetext.MessageMax {
		t.Errorf("error_message is %d bytes, over %d", len(msg), safetext.MessageMax)
	}
	if j := h.waitJob("huge-error", spool.StateFailed); len(j.Error) > safetext.MessageMax {
		t.Errorf("the spool's job row holds an error of %d bytes", len(j.Error))
	}

	h.submit("huge-check", "huge-check")
	cb = h.terminal("huge-check")
	tc, err := json.Marshal(cb.Body["template_check"])
	if err != nil {
		t.Fatal(err)
	}
	if cb.Field("status") != "BUILT" || !strings.Contains(string(tc), `"result":"warnings"`) || len(tc) > safetext.TemplateCheckMax {
		t.Errorf("terminal report %s with a template_check of %d bytes: %.200s; want BUILT with at most %d bytes",
			cb.Field("status"), len(tc), tc, safetext.TemplateCheckMax)
	}
	h.stop()

	for _, line := range strings.Split(h.logs.String(), "\n") {
		if len(line) > safetext.MessageMax+1024 {
			t.Errorf("a log line is %d bytes long: %.200s…", len(line), line)
		}
	}
	for _, s := range rec.Ended() {
		if n := len(s.Status().Description); n > safetext.MessageMax {
			t.Errorf("span %s has a status of %d bytes", s.Name(), n)
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				if n := len(kv.Value.String()); n > safetext.MessageMax {
					t.Errorf("span %s event %s has %s of %d bytes", s.Name(), ev.Name, kv.Key, n)
				}
			}
		}
	}
}

// TestImageConfigOverCubeMastersColumn: an image whose configuration
// would not fit CubeMaster's image_config_json column fails at PULLING,
// before any layer is fetched, with a message saying why, instead of a
// BUILT report CubeMaster could never store.
func TestImageConfigOverCubeMastersColumn(t *testing.T) {
	h := newHarness(t, nil)
	env := make([]string, 0, 2000)
	for i := range 2000 {
		env = append(env, "VAR"+strings.Repeat("x", 30)+"="+strings.Repeat("v", 10)+string(rune('a'+i%26)))
	}
	h.builder.config = &rootfs.ImageConfig{Cmd: []string{"/bin/sh"}, Env: env}
	h.start()
	h.submit("big-config", "big-config:v1")
	cb := h.terminal("big-config")
	if cb.Field("status") != "FAILED" || cb.Field("phase") != "PULLING" ||
		!strings.Contains(cb.Field("error_message"), "as image_config_json, over the 65535 bytes CubeMaster can store") {
		t.Errorf("terminal report = %v, want FAILED at PULLING naming image_config_json's bound", cb.Body)
	}
	if n := h.builder.buildCount(); n != 0 {
		t.Errorf("%d builds ran for an image whose BUILT report could never be stored", n)
	}
}
