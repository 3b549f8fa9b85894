package safetext

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits on text that leaves TC. CubeMaster stores error_message in a MySQL
// TEXT column (64 KiB at most, and a failed insert loses the report), so a
// message stays well below that.
const (
	// NameMax bounds one name quoted in a message: a file, a command, a
	// registry error code.
	NameMax = 256
	// MessageMax bounds a message: a report's error_message, a log line's
	// error, a span's status.
	MessageMax = 4096
	// ListMax is how many items a list in a message names before "and N
	// more".
	ListMax = 8
	// TemplateCheckMax bounds a BUILT report's template_check, measured
	// as JSON: the start check's fields are cut (see ClipJSON) so that
	// their encoding stays below it.
	TemplateCheckMax = 16 << 10
)

// ellipsis marks a cut.
const ellipsis = "…"

// Quote quotes s as strconv.Quote does, keeping at most max bytes of s and
// marking a cut with an ellipsis after the closing quote: the quoted text
// is always a prefix of the real one.
func Quote(s string, max int) string {
	if len(s) <= max {
		return strconv.Quote(s)
	}
	return strconv.Quote(cut(s, max)) + ellipsis
}

// Name quotes a name derived from untrusted input, at most NameMax bytes
// of it.
func Name(s string) string { return Quote(s, NameMax) }

// Clip returns s as valid UTF-8 of at most max bytes; a cut ends with
// "… (N bytes more)" inside the limit.
func Clip(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= max {
		return s
	}
	// The note's length depends on the count; reserve for the longest.
	note := func(n int) string { return fmt.Sprintf("%s (%d bytes more)", ellipsis, n) }
	keep := max - len(note(len(s)))
	if keep < 0 {
		return cut(s, max)
	}
	kept := cut(s, keep)
	return kept + note(len(s)-len(kept))
}

// Line is Clip applied to the first line of s: for text shown on one line
// (a table cell, a status line), the rest marked with an ellipsis.
func Line(s string, max int) string {
	first, _, more := strings.Cut(s, "\n")
	if more {
		if len(first) > max-len(ellipsis) {
			return Clip(first, max)
		}
		return strings.ToValidUTF8(first, "\uFFFD") + ellipsis
	}
	return Clip(first, max)
}

// List joins at most ListMax items with sep and says how many more there
// were: "a; b; … and 12 more".
func List(items []string, sep string) string {
	if len(items) <= ListMax {
		return strings.Join(items, sep)
	}
	return strings.Join(items[:ListMax], sep) + sep + fmt.Sprintf("and %d more", len(items)-ListMax)
}

// ClipJSON is Clip for a structured field: it measures s as encoding/json
// writes it, escapes included and quotes excluded, so that a string of
// control characters or '<' (six bytes each on the wire) is bounded as
// tightly as a plain one.
func ClipJSON(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if jsonLen(s) <= max {
		return s
	}
	// The note is plain ASCII and "…", which encoding/json writes as is.
	note := func(n int) string { return fmt.Sprintf("%s (%d bytes more)", ellipsis, n) }
	keep := max - len(note(len(s)))
	if keep < 0 {
		return cutJSON(s, max)
	}
	kept := cutJSON(s, keep)
	return kept + note(len(s)-len(kept))
}

// Names lists names derived from untrusted input (tags, platforms) for a
// message: each quoted by Name, at most ListMax, comma-separated, and a
// count of the rest.
func Names(items []string) string {
	shown := items[:min(len(items), ListMax)]
	quoted := make([]string, 0, len(items))
	for _, s := range shown {
		quoted = append(quoted, Name(s))
	}
	return List(append(quoted, items[len(shown):]...), ", ")
}

// Strings bounds a list of strings for a structured field: at most n
// items, each cut by ClipJSON to max bytes of JSON, the last replaced by a
// count of what was left out. Its JSON is thus at most n*(max+3)+2 bytes.
func Strings(items []string, n, max int) []string {
	out := make([]string, 0, min(len(items), n))
	for i, s := range items {
		if i == n-1 && len(items) > n {
			out = append(out, fmt.Sprintf("and %d more", len(items)-i))
			break
		}
		out = append(out, ClipJSON(s, max))
	}
	return out
}

// jsonLen is the length of s as encoding/json writes it (HTML escaping
// on, as json.Marshal does), without the quotes. \b and \f count six
// bytes, as older releases of encoding/json write them: an upper bound.
func jsonLen(s string) int {
	n := 0
	for _, r := range s {
		n += jsonRuneLen(r)
	}
	return n
}

func jsonRuneLen(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029' || r == utf8.RuneError:
		// \u00XX; an invalid byte becomes \ufffd.
		return 6
	}
	return utf8.RuneLen(r)
}

// cutJSON returns the longest prefix of s whose JSON encoding (see
// jsonLen) is at most max bytes.
func cutJSON(s string, max int) string {
	n := 0
	for i, r := range s {
		if n += jsonRuneLen(r); n > max {
			return s[:i]
		}
	}
	return s
}

// cut returns the longest prefix of s of at most max bytes that ends on a
// rune boundary.
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	for max > 0 && !utf8.RuneStart(s[max]) {
		max--
	}
	return s[:max]
}
