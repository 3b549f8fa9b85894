package blobstore

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
)

// Retry defaults for the S3 backend.
const (
	DefaultAttempts     = 5
	DefaultRetryInitial = 200 * time.Millisecond
	DefaultRetryMax     = 10 * time.Second
)

// retryPolicy retries transient failures with exponential backoff and
// jitter; permanent ones (most 4xx) return at once.
type retryPolicy struct {
	attempts     int
	initial, max time.Duration
}

// do runs op until it succeeds, fails permanently, attempts run out or ctx
// ends; it returns op's last error.
func (p retryPolicy) do(ctx context.Context, op func(ctx context.Context) error) error {
	delay := p.initial
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil || attempt >= p.attempts || ctx.Err() != nil || !classify(err).temporary {
			return err
		}
		// Full jitter over the upper half keeps retries of parallel parts
		// from arriving in lockstep.
		wait := delay/2 + rand.N(delay/2+1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		delay = min(2*delay, p.max)
	}
}

// class is what classify learns from an error.
type class struct {
	kind       error
	code       string
	status     int
	temporary  bool
	contextErr error
}

// classify sorts an S3 client error: network errors, 408, 429 and 5xx are
// temporary; NoSuchBucket, AccessDenied and the other 4xx are permanent.
func classify(err error) class {
	var c class
	if errors.Is(err, errStalled) {
		// Our own cancellation of a request that stopped moving: the
		// next attempt opens a fresh connection.
		return class{kind: ErrUnreachable, temporary: true}
	}
	switch {
	case errors.Is(err, context.Canceled):
		c.contextErr = context.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		c.contextErr = context.DeadlineExceeded
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) && (resp.Code != "" || resp.StatusCode != 0) {
		c.code, c.status = resp.Code, resp.StatusCode
		switch resp.Code {
		case "NoSuchKey", "NoSuchObject":
			c.kind = ErrNotFound
		case "NoSuchBucket":
			c.kind = ErrBucketMissing
		case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
			"ExpiredToken", "AuthorizationHeaderMalformed", "InvalidSecurity",
			"XAdminUserNotFound": // versitygw's answer to an unknown access key
			c.kind = ErrAccessDenied
		case "SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "RequestTimeTooSkewed":
			c.temporary = true
		}
		switch {
		case c.kind != nil:
		case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
			c.kind = ErrAccessDenied
		case resp.StatusCode == http.StatusNotFound && resp.Code == "NotFound":
			c.kind = ErrNotFound
		case resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests ||
			resp.StatusCode >= 500:
			c.temporary = true
		}
		return c
	}
	if c.contextErr != nil {
		return c
	}
	var netErr net.Error
	var urlErr *url.Error
	if errors.As(err, &netErr) || errors.As(err, &urlErr) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF) {
		c.kind, c.temporary = ErrUnreachable, true
	}
	return c
}

// signedParam matches query parameters of signed URLs whose values must not
// be shown.
var signedParam = regexp.MustCompile(`(?i)(X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|Signature|AWSAccessKeyId)=[^&\s"']+`)

// scrub removes the secret and any signature from an error text.
func scrub(text, secret string) string {
	if secret != "" {
		text = strings.ReplaceAll(text, secret, "REDACTED")
	}
	return signedParam.ReplaceAllString(text, "$1=REDACTED")
}
