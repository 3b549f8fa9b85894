package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"
)

// newLogger builds the process logger in format (text key=value lines, or
// JSON). Under journald (JOURNAL_STREAM set) lines carry no timestamp, as
// the journal adds its own, and start with their sd-daemon priority so
// that journalctl -p filters them. JSON gives durations in seconds (a
// float), as the metrics do; text keeps Go's form (1.5s), for people.
func newLogger(w io.Writer, format string, level *slog.LevelVar) *slog.Logger {
	underJournal := os.Getenv("JOURNAL_STREAM") != ""
	asJSON := format == "json"
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if underJournal && len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		if asJSON && a.Value.Kind() == slog.KindDuration {
			return slog.Float64(a.Key, a.Value.Duration().Seconds())
		}
		return a
	}}
	var out *priorityWriter
	if underJournal {
		out = &priorityWriter{w: w}
		w = out
	}
	var h slog.Handler
	if asJSON {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	if out != nil {
		h = priorityHandler{inner: h, out: out}
	}
	return slog.New(h)
}

// priority is the sd-daemon(3) prefix of a line at level: journald takes
// it off and files the line at that syslog priority (SyslogLevelPrefix=,
// on by default).
func priority(level slog.Level) string {
	switch {
	case level >= slog.LevelError:
		return "<3>"
	case level >= slog.LevelWarn:
		return "<4>"
	case level >= slog.LevelInfo:
		return "<6>"
	default:
		return "<7>"
	}
}

// priorityWriter writes each line the handler gives it behind the prefix
// priorityHandler set for it. slog's handlers write a record in one Write.
type priorityWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
}

// Write implements io.Writer; p.mu is held by priorityHandler.Handle.
func (p *priorityWriter) Write(b []byte) (int, error) {
	line := make([]byte, 0, len(p.prefix)+len(b))
	line = append(append(line, p.prefix...), b...)
	if _, err := p.w.Write(line); err != nil {
		return 0, err
	}
	return len(b), nil
}

// priorityHandler sets the line prefix for each record its inner handler
// writes; handlers derived with With share the writer and its lock.
type priorityHandler struct {
	inner slog.Handler
	out   *priorityWriter
}

// Enabled implements slog.Handler.
func (h priorityHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

// Handle implements slog.Handler.
func (h priorityHandler) Handle(ctx context.Context, r slog.Record) error {
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	h.out.prefix = priority(r.Level)
	return h.inner.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h priorityHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return priorityHandler{inner: h.inner.WithAttrs(as), out: h.out}
}

// WithGroup implements slog.Handler.
func (h priorityHandler) WithGroup(name string) slog.Handler {
	return priorityHandler{inner: h.inner.WithGroup(name), out: h.out}
}

// heldRecords keeps what is logged before the configured logger exists
// (the configuration's own warnings), to be written through it once it
// does, in its format.
type heldRecords struct {
	mu      sync.Mutex
	records []heldRecord
}

// heldRecord is one record and the With calls that made its logger.
type heldRecord struct {
	ops    []heldOp
	record slog.Record
}

// heldOp is one WithGroup (group set) or WithAttrs call.
type heldOp struct {
	group string
	attrs []slog.Attr
}

// logger returns a logger whose records are held.
func (h *heldRecords) logger() *slog.Logger { return slog.New(heldHandler{held: h}) }

// replay writes the held records through dst, the levels dst enables, and
// forgets them.
func (h *heldRecords) replay(ctx context.Context, dst slog.Handler) {
	h.mu.Lock()
	records := h.records
	h.records = nil
	h.mu.Unlock()
	for _, hr := range records {
		d := dst
		for _, op := range hr.ops {
			if op.group != "" {
				d = d.WithGroup(op.group)
			} else {
				d = d.WithAttrs(op.attrs)
			}
		}
		if d.Enabled(ctx, hr.record.Level) {
			d.Handle(ctx, hr.record)
		}
	}
}

// heldHandler appends records to held.
type heldHandler struct {
	held *heldRecords
	ops  []heldOp
}

// Enabled implements slog.Handler: the level is decided at replay.
func (h heldHandler) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (h heldHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	h.held.mu.Lock()
	h.held.records = append(h.held.records, heldRecord{ops: h.ops, record: r.Clone()})
	h.held.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler.
func (h heldHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return heldHandler{held: h.held, ops: append(slices.Clip(h.ops), heldOp{attrs: slices.Clone(as)})}
}

// WithGroup implements slog.Handler.
func (h heldHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return heldHandler{held: h.held, ops: append(slices.Clip(h.ops), heldOp{group: name})}
}
