package safetext

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"ls", 10, `"ls"`},
		{"abcdef", 3, `"abc"…`},
		{"a\nb", 10, `"a\nb"`},
		{"ééé", 3, `"é"…`}, // never cuts a rune in two
		{"", 0, `""`},
	} {
		if got := Quote(tc.in, tc.max); got != tc.want {
			t.Errorf("Quote(%q, %d) = %s, want %s", tc.in, tc.max, got, tc.want)
		}
	}
	long := strings.Repeat("x", 4000)
	if got := Name(long); len(got) > NameMax+len(`""…`) || !strings.HasSuffix(got, `"…`) {
		t.Errorf("Name of 4000 bytes is %d bytes: %.40s…", len(got), got)
	}
}

func TestClip(t *testing.T) {
	if got := Clip("short", 100); got != "short" {
		t.Errorf("Clip(short) = %q", got)
	}
	s := strings.Repeat("é", 10000) // 20000 bytes
	got := Clip(s, MessageMax)
	if len(got) > MessageMax || !utf8.ValidString(got) {
		t.Fatalf("Clip gave %d bytes (valid UTF-8: %v), want at most %d", len(got), utf8.ValidString(got), MessageMax)
	}
	if !strings.Contains(got, "bytes more)") {
		t.Errorf("Clip does not say what it left out: …%s", got[len(got)-40:])
	}
	kept, _, _ := strings.Cut(got, "…")
	if want := 20000 - len(kept); !strings.HasSuffix(got, "("+itoa(want)+" bytes more)") {
		t.Errorf("Clip's count: …%s, want %d bytes more", got[len(got)-30:], want)
	}
	if got := Clip("ab\xffcd", 10); got != "ab\uFFFDcd" {
		t.Errorf("Clip keeps invalid UTF-8: %q", got)
	}
	if got := Clip(strings.Repeat("x", 50), 5); len(got) > 5 {
		t.Errorf("Clip below the note's size gives %d bytes", len(got))
	}
}

func itoa(n int) string {
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

func TestLine(t *testing.T) {
	if got := Line("first\nsecond", 100); got != "first…" {
		t.Errorf("Line = %q", got)
	}
	if got := Line(strings.Repeat("x", 300), 100); len(got) > 100 {
		t.Errorf("Line gives %d bytes", len(got))
	}
}

func TestList(t *testing.T) {
	items := make([]string, 20)
	for i := range items {
		items[i] = "p" + itoa(i+1)
	}
	if got, want := List(items[:3], "; "), "p1; p2; p3"; got != want {
		t.Errorf("List(3) = %q, want %q", got, want)
	}
	if got, want := List(items, "; "), "p1; p2; p3; p4; p5; p6; p7; p8; and 12 more"; got != want {
		t.Errorf("List(20) = %q, want %q", got, want)
	}
	if got, want := Names([]string{"v1", "a\nb"}), `"v1", "a\nb"`; got != want {
		t.Errorf("Names = %s, want %s", got, want)
	}
	if got := Names(append(items, strings.Repeat("x", 5000))); !strings.HasSuffix(got, `"p8", and 13 more`) || len(got) > 200 {
		t.Errorf("Names(21) = %s", got)
	}
	got := Strings(items, 4, 10)
	if want := []string{"p1", "p2", "p3", "and 17 more"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Strings(20, 4) = %q, want %q", got, want)
	}
	if got := Strings(items[:4], 4, 1); strings.Join(got, ",") != "p,p,p,p" {
		t.Errorf("Strings(4, 4, 1) = %q", got)
	}
}

// jsonSize is the length of s as json.Marshal writes it, quotes excluded.
func jsonSize(t testing.TB, s string) int {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return len(b) - 2
}

func TestClipJSON(t *testing.T) {
	if got := ClipJSON("plain", 100); got != "plain" {
		t.Errorf("ClipJSON(plain) = %q", got)
	}
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"Plain", strings.Repeat("x", 3000)},
		{"HTML", strings.Repeat("<&>", 1000)},     // six bytes each on the wire
		{"Control", strings.Repeat("\x01", 3000)}, // \u0001
		{"Quotes", strings.Repeat(`"\`, 1000)},
		{"Invalid", strings.Repeat("\xffa", 3000)}, // each \xff becomes U+FFFD
		{"LineSeparators", strings.Repeat("\u2028", 1000)},
		{"Mixed", strings.Repeat("é<\n\x00", 700)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, max := range []int{0, 5, 40, 256, 1280} {
				got := ClipJSON(tc.in, max)
				if n := jsonSize(t, got); n > max {
					t.Errorf("ClipJSON(%s, %d) encodes to %d bytes", tc.name, max, n)
				}
				if !utf8.ValidString(got) {
					t.Errorf("ClipJSON(%s, %d) is not valid UTF-8", tc.name, max)
				}
				if max >= 40 && !strings.Contains(got, "bytes more)") {
					t.Errorf("ClipJSON(%s, %d) = %q does not say what it left out", tc.name, max, got)
				}
			}
		})
	}
	items := []string{strings.Repeat("<", 500), "ok", strings.Repeat("\x02", 500)}
	got := Strings(items, 4, 100)
	b, _ := json.Marshal(got)
	if len(b) > 4*(100+3)+2 || got[1] != "ok" {
		t.Errorf("Strings = %s (%d bytes), want each item within 100 bytes of JSON", b, len(b))
	}
}

func TestClipError(t *testing.T) {
	err := fmt.Errorf("layer 0: %w: %s", context.Canceled, strings.Repeat("x", 10000))
	got := ClipError(err, MessageMax)
	if len(got.Error()) > MessageMax || !errors.Is(got, context.Canceled) {
		t.Errorf("ClipError = %d bytes (Is Canceled: %v), want at most %d", len(got.Error()), errors.Is(got, context.Canceled), MessageMax)
	}
	var pe *fs.PathError
	if errors.As(ClipError(&fs.PathError{Op: "open", Path: "x", Err: fs.ErrNotExist}, 10), &pe) {
		t.Error("ClipError exposes the raw error to errors.As")
	}
	if ClipError(nil, 10) != nil {
		t.Error("ClipError(nil) is not nil")
	}
}

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`GET https://bucket.s3.example/blob?X-Amz-Signature=abc&X-Amz-Credential=k: 403`,
			`GET https://bucket.s3.example/blob?REDACTED 403`},
		{`post to http://cm:s3cret@master:8089/internal: refused`, `post to http://REDACTED@master:8089/internal: refused`},
		{`fetch "https://u:p@h/a?b=c"`, `fetch "https://REDACTED@h/a?REDACTED"`},
		{`no url here`, `no url here`},
		{`token abc123 leaked`, `token REDACTED leaked`},
	} {
		if got := Redact(tc.in, "abc123"); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got, want := URL("http://user:pw@master:8089/x?sig=1"), "http://REDACTED@master:8089/x?REDACTED"; got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	if got, want := URL("http://master:8089"), "http://master:8089"; got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	err := RedactError(&fs.PathError{Op: "open", Path: "https://h/x?sig=s", Err: fs.ErrNotExist})
	if strings.Contains(err.Error(), "sig=") || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("RedactError = %v (Is ErrNotExist: %v)", err, errors.Is(err, fs.ErrNotExist))
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		t.Error("RedactError exposes the raw error to errors.As")
	}
	if RedactError(nil) != nil {
		t.Error("RedactError(nil) is not nil")
	}
	if err := RedactError(fmt.Errorf("fetch: %w", context.Canceled), "s3cret"); !errors.Is(err, context.Canceled) {
		t.Errorf("RedactError hides errors.Is: %v", err)
	}
}

func FuzzClip(f *testing.F) {
	f.Add("x", 10)
	f.Add(strings.Repeat("é", 100), 7)
	f.Fuzz(func(t *testing.T, s string, max int) {
		max = max % 5000
		if max < 0 {
			max = -max
		}
		got := Clip(s, max)
		if len(got) > max && len(s) > max {
			t.Fatalf("Clip(%d bytes, %d) = %d bytes", len(s), max, len(got))
		}
		if !utf8.ValidString(got) {
			t.Fatalf("Clip gave invalid UTF-8")
		}
		if q, err := strconv.Unquote(strings.TrimSuffix(Quote(s, max), "…")); err != nil || !strings.HasPrefix(s, q) && utf8.ValidString(s) {
			t.Fatalf("Quote(%q, %d) is not a quoted prefix: %q, %v", s, max, q, err)
		}
		if got := ClipJSON(s, max); len(s) > 0 && jsonSize(t, got) > max {
			t.Fatalf("ClipJSON(%q, %d) = %q encodes to %d bytes", s, max, got, jsonSize(t, got))
		}
		_ = Redact(s)
	})
}
