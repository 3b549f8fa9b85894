package api

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// TokenHeader carries the shared secret in both directions.
const TokenHeader = "X-Cube-Template-Callback-Token"

// Environment variables of the shared-token rule, as CubeMaster reads them.
const (
	TokenEnv          = "CUBE_TEMPLATE_CALLBACK_TOKEN"
	LegacyTokenEnv    = "CUBE_TC_CALLBACK_TOKEN"
	InsecureNoToken   = "CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN"
	notConfiguredBody = "CUBE_TEMPLATE_CALLBACK_TOKEN is not configured on template center"
)

// TokenPolicy decides whether a request carries the shared secret.
type TokenPolicy struct {
	// Token is the expected secret; empty means not configured.
	Token string
	// Insecure allows requests without a token when none is configured
	// (single-host development only).
	Insecure bool
}

// Check answers 0 when the request may proceed, else the HTTP status and
// error message to refuse it with. Both values are whitespace-trimmed and
// compared in constant time.
func (p TokenPolicy) Check(r *http.Request) (int, string) {
	want := strings.TrimSpace(p.Token)
	if want == "" {
		if p.Insecure {
			return 0, ""
		}
		return http.StatusServiceUnavailable, notConfiguredBody
	}
	got := strings.TrimSpace(r.Header.Get(TokenHeader))
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return http.StatusUnauthorized, "invalid or missing shared token"
	}
	return 0, ""
}
