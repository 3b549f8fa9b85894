package blobstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
)

func TestArtifactKey(t *testing.T) {
	for _, c := range []struct{ prefix, id, want string }{
		{"", "abc", "abc.ext4"},
		{"tc", "abc", "tc/abc.ext4"},
		{"/tc/artifacts/", "abc", "tc/artifacts/abc.ext4"},
		{"//", "abc", "abc.ext4"},
	} {
		if got := ArtifactKey(c.prefix, c.id); got != c.want {
			t.Errorf("ArtifactKey(%q, %q) = %q; want %q", c.prefix, c.id, got, c.want)
		}
	}
}

func TestCheckKey(t *testing.T) {
	for _, ok := range []string{"a.ext4", "p/q/a.ext4", "a..b"} {
		if err := checkKey(ok); err != nil {
			t.Errorf("checkKey(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/a", "../a", "..", "a/../../b", "a/./b", "a//b", "a/", "./a", "a\\b", "a\x00b"} {
		if err := checkKey(bad); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("checkKey(%q) = %v; want ErrInvalidKey", bad, err)
		}
	}
}

func TestParseEndpoint(t *testing.T) {
	for _, c := range []struct {
		in         string
		useSSL     bool
		host       string
		secure, ok bool
	}{
		{"minio:9000", false, "minio:9000", false, true},
		{"minio:9000", true, "minio:9000", true, true},
		{"http://minio:9000", true, "minio:9000", false, true},
		{"https://s3.example.com/", false, "s3.example.com", true, true},
		{"https://s3.example.com/bucket", false, "", false, false},
		{"ftp://host", false, "", false, false},
		{"host/path", false, "", false, false},
		{"", false, "", false, false},
		{"http://user:pw@host", false, "", false, false},
	} {
		host, secure, err := parseEndpoint(c.in, c.useSSL)
		if (err == nil) != c.ok || host != c.host || secure != c.secure {
			t.Errorf("parseEndpoint(%q, %v) = %q, %v, %v; want %q, %v, ok=%v", c.in, c.useSSL, host, secure, err, c.host, c.secure, c.ok)
		}
	}
}

func TestClassify(t *testing.T) {
	resp := func(code string, status int) error { return minio.ErrorResponse{Code: code, StatusCode: status} }
	for _, c := range []struct {
		name      string
		err       error
		kind      error
		temporary bool
	}{
		{"NoSuchKey", resp("NoSuchKey", 404), ErrNotFound, false},
		{"NoSuchBucket", resp("NoSuchBucket", 404), ErrBucketMissing, false},
		{"AccessDenied", resp("AccessDenied", 403), ErrAccessDenied, false},
		{"InvalidAccessKeyId", resp("InvalidAccessKeyId", 403), ErrAccessDenied, false},
		{"SignatureDoesNotMatch", resp("SignatureDoesNotMatch", 403), ErrAccessDenied, false},
		{"Bare403", resp("", 403), ErrAccessDenied, false},
		{"SlowDown", resp("SlowDown", 503), nil, true},
		{"InternalError", resp("InternalError", 500), nil, true},
		{"TooManyRequests", resp("", 429), nil, true},
		{"BadGateway", resp("", 502), nil, true},
		{"InvalidArgument", resp("InvalidArgument", 400), nil, false},
		{"Wrapped", fmt.Errorf("put: %w", resp("NoSuchBucket", 404)), ErrBucketMissing, false},
		{"Refused", &url.Error{Op: "Put", URL: "http://h/b/k", Err: syscall.ECONNREFUSED}, ErrUnreachable, true},
		{"Reset", syscall.ECONNRESET, ErrUnreachable, true},
		{"Canceled", &url.Error{Op: "Put", URL: "http://h/b/k", Err: context.Canceled}, nil, false},
		{"Local", ErrChecksumMismatch, nil, false},
	} {
		got := classify(c.err)
		if got.kind != c.kind || got.temporary != c.temporary {
			t.Errorf("classify(%s) = kind %v, temporary %v; want %v, %v", c.name, got.kind, got.temporary, c.kind, c.temporary)
		}
	}
}

func TestRetryPolicy(t *testing.T) {
	p := retryPolicy{attempts: 4, initial: time.Millisecond, max: 2 * time.Millisecond}
	calls := 0
	err := p.do(context.Background(), func(context.Context) error { calls++; return minio.ErrorResponse{Code: "SlowDown", StatusCode: 503} })
	if err == nil || calls != 4 {
		t.Errorf("transient: %d calls, %v; want 4 calls and the error", calls, err)
	}
	calls = 0
	p.do(context.Background(), func(context.Context) error {
		calls++
		return minio.ErrorResponse{Code: "AccessDenied", StatusCode: 403}
	})
	if calls != 1 {
		t.Errorf("permanent: %d calls; want 1", calls)
	}
	calls = 0
	err = p.do(context.Background(), func(context.Context) error {
		if calls++; calls < 3 {
			return syscall.ECONNRESET
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("recovering: %d calls, %v; want success on the 3rd", calls, err)
	}
}

func TestErrorsAreScrubbed(t *testing.T) {
	const secret = "s3cr3t-value-that-must-not-show"
	s := &S3{secret: secret}
	presigned := "http://h/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AK%2F20260101&X-Amz-Signature=abcdef0123&X-Amz-Expires=60"
	for _, raw := range []error{
		&url.Error{Op: "Get", URL: presigned, Err: syscall.ECONNREFUSED},
		errors.New("signing with " + secret + " failed"),
		minio.ErrorResponse{Code: "SignatureDoesNotMatch", StatusCode: 403, Message: "key " + secret},
	} {
		msg := s.fail("stat", "k", raw).Error()
		for _, leak := range []string{secret, "abcdef0123", "AK%2F20260101"} {
			if strings.Contains(msg, leak) {
				t.Errorf("error %q shows %q", msg, leak)
			}
		}
	}
}
