package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestJournalPriorityPrefix: under journald every line, in either format
// and from a logger narrowed with With, starts with its sd-daemon priority,
// which journald turns into the entry's PRIORITY (journalctl -p).
func TestJournalPriorityPrefix(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "8:424242")
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			level := new(slog.LevelVar)
			level.Set(slog.LevelDebug)
			logger := newLogger(&buf, format, level).With("component", "test")
			logger.Debug("d")
			logger.Info("i")
			logger.Warn("w")
			logger.Error("e")
			lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
			want := []string{"<7>", "<6>", "<4>", "<3>"}
			if len(lines) != len(want) {
				t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
			}
			for i, l := range lines {
				rest, ok := strings.CutPrefix(l, want[i])
				if !ok {
					t.Errorf("line %d does not start with %s: %s", i, want[i], l)
				}
				if format == "json" && !json.Valid([]byte(rest)) {
					t.Errorf("line %d is not JSON behind its prefix: %s", i, l)
				}
				if !strings.Contains(rest, "component") {
					t.Errorf("line %d lost the With attribute: %s", i, l)
				}
			}
		})
	}
}

// TestNoPriorityPrefixOffJournal: on a terminal or a file, lines are plain.
func TestNoPriorityPrefixOffJournal(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "")
	var buf bytes.Buffer
	newLogger(&buf, "text", new(slog.LevelVar)).Warn("w")
	if strings.HasPrefix(buf.String(), "<") {
		t.Errorf("prefix outside journald: %s", buf.String())
	}
}

// TestDurationsInJSONAreSeconds: JSON gives durations as float seconds, in
// groups too; text keeps Go's readable form.
func TestDurationsInJSONAreSeconds(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "")
	var buf bytes.Buffer
	newLogger(&buf, "json", new(slog.LevelVar)).Info("done", "took", 1500*time.Millisecond,
		slog.Group("build", "wait", 250*time.Millisecond))
	var rec struct {
		Took  any `json:"took"`
		Build struct {
			Wait any `json:"wait"`
		} `json:"build"`
	}
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	if rec.Took != 1.5 || rec.Build.Wait != 0.25 {
		t.Errorf("took=%v build.wait=%v, want 1.5 and 0.25 (seconds): %s", rec.Took, rec.Build.Wait, buf.String())
	}
	buf.Reset()
	newLogger(&buf, "text", new(slog.LevelVar)).Info("done", "took", 1500*time.Millisecond)
	if !strings.Contains(buf.String(), "took=1.5s") {
		t.Errorf("text line: %s, want took=1.5s", buf.String())
	}
}

// TestHeldRecordsReplayInTheConfiguredFormat: records logged before the
// logger exists come out through it, with their With attributes and
// groups, filtered by its level.
func TestHeldRecordsReplayInTheConfiguredFormat(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "")
	var held heldRecords
	early := held.logger()
	early.Warn("config: unknown key", "key", "build.turbo")
	early.With("path", "/etc/x.yaml").WithGroup("g").Warn("config: secret in file", "field", "token")
	early.Debug("below the level")

	var buf bytes.Buffer
	held.replay(context.Background(), newLogger(&buf, "json", new(slog.LevelVar)).Handler())
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2 (debug filtered):\n%s", len(lines), buf.String())
	}
	var second map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatalf("replayed line is not JSON: %s", lines[1])
	}
	g, _ := second["g"].(map[string]any)
	if second["level"] != "WARN" || second["path"] != "/etc/x.yaml" || g["field"] != "token" {
		t.Errorf("replayed record = %v, want level WARN, path and g.field", second)
	}
	buf.Reset()
	held.replay(context.Background(), newLogger(&buf, "json", new(slog.LevelVar)).Handler())
	if buf.Len() != 0 {
		t.Errorf("a second replay wrote %q; records are replayed once", buf.String())
	}
}
