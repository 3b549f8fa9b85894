package safetext

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// Redacted replaces what redaction removes.
const Redacted = "REDACTED"

// urlInText matches a URL inside a message up to its first blank or
// quote: its userinfo and its query string are secrets (a password, a
// signed blob URL's X-Amz-Signature, a token endpoint's parameters).
var urlInText = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#"'<>@]*@)?([^\s?#"'<>]*)(\?[^\s#"'<>]*)?`)

// Redact removes userinfo and query strings from every URL in msg, and
// every occurrence of the given secrets.
func Redact(msg string, secrets ...string) string {
	msg = urlInText.ReplaceAllStringFunc(msg, func(m string) string {
		sub := urlInText.FindStringSubmatch(m)
		out := sub[1]
		if sub[2] != "" {
			out += Redacted + "@"
		}
		out += sub[3]
		if sub[4] != "" {
			out += "?" + Redacted
		}
		return out
	})
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, Redacted)
		}
	}
	return msg
}

// URL shows a URL without its userinfo and query string, for messages
// and listings: "http://REDACTED@host/path?REDACTED". Text that does not
// parse as a URL is redacted as a message.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return Redact(raw)
	}
	if u.User != nil {
		u.User = url.User(Redacted)
	}
	if u.RawQuery != "" {
		u.RawQuery = Redacted
	}
	u.ForceQuery = false
	return u.String()
}

// Error is an error whose message was redacted or cut. It answers
// errors.Is for the chain it wraps but does not expose it to errors.As, so
// the raw text cannot be reached by accident.
type Error struct {
	msg string
	err error
}

// Error returns the redacted or cut message.
func (e *Error) Error() string { return e.msg }

// Is reports whether the wrapped chain matches target.
func (e *Error) Is(target error) bool { return errors.Is(e.err, target) }

// RedactError returns err with its message redacted (see Redact); nil
// stays nil.
func RedactError(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	return &Error{msg: Redact(err.Error(), secrets...), err: err}
}

// ClipError returns err with its message cut to max bytes (see Clip), for
// a span or a log line that records an error whose text an image shaped;
// nil stays nil.
func ClipError(err error, max int) error {
	if err == nil {
		return nil
	}
	return &Error{msg: Clip(err.Error(), max), err: err}
}
