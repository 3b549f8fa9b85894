package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// marker stands for whatever an internal service behind a registry address
// would answer: it must never reach an error message.
const marker = "SECRET-MARKER-7f3a"

// hostileBody is a large HTML page carrying the marker.
var hostileBody = "<html><body>" + strings.Repeat("internal admin page "+marker+" ", 3000) + "</body></html>"

func wantNoMarker(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	if strings.Contains(err.Error(), marker) {
		t.Errorf("error shows the response body: %.300s…", err)
	}
	if len(err.Error()) > 1000 {
		t.Errorf("error is %d bytes long", len(err.Error()))
	}
}

func TestErrorsCarryNoBody(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"HTML404", http.StatusNotFound, hostileBody, "unexpected status 404 (not found)"},
		{"HTML500", http.StatusInternalServerError, hostileBody, "unexpected status 500 (internal server error)"},
		{"HTML403", http.StatusForbidden, hostileBody, "access denied by"},
		{"RegistryJSON", http.StatusNotFound,
			`{"errors":[{"code":"MANIFEST_UNKNOWN","message":"` + marker + `","detail":"` + marker + `"},{"code":"<b>` + marker + `</b>"}]}`,
			"unexpected status 404 (not found), registry error MANIFEST_UNKNOWN"},
	} {
		t.Run("Manifest"+tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v2/" {
					return // the ping: 200, no auth
				}
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			}))
			t.Cleanup(srv.Close)
			p := newTestPuller(t, Options{})
			_, err := p.Resolve(ctx, Source{Ref: strings.TrimPrefix(srv.URL, "http://") + "/internal/admin:latest"})
			t.Logf("Resolve: %v", err)
			wantNoMarker(t, err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}

	t.Run("Ping", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprint(w, hostileBody)
		}))
		t.Cleanup(srv.Close)
		p := newTestPuller(t, Options{})
		_, err := p.Resolve(ctx, Source{Ref: "http://" + strings.TrimPrefix(srv.URL, "http://") + "/x:y"})
		t.Logf("Resolve: %v", err)
		wantNoMarker(t, err)
	})

	t.Run("TokenEndpoint", func(t *testing.T) {
		for name, answer := range map[string]func(w http.ResponseWriter){
			"NoToken": func(w http.ResponseWriter) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"note":%q}`, hostileBody)
			},
			"HTML403": func(w http.ResponseWriter) {
				w.WriteHeader(http.StatusForbidden)
				fmt.Fprint(w, hostileBody)
			},
		} {
			t.Run(name, func(t *testing.T) {
				var srv *httptest.Server
				srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == "/token" {
						answer(w)
						return
					}
					w.Header().Set("WWW-Authenticate", `Bearer realm="`+srv.URL+`/token",service="test"`)
					w.WriteHeader(http.StatusUnauthorized)
				}))
				t.Cleanup(srv.Close)
				p := newTestPuller(t, Options{})
				_, err := p.Resolve(ctx, Source{Ref: "http://" + strings.TrimPrefix(srv.URL, "http://") + "/x:y"})
				t.Logf("Resolve: %v", err)
				wantNoMarker(t, err)
			})
		}
	})

	t.Run("Blob", func(t *testing.T) {
		img := testImage(t, 1, 1024)
		d := layerDigests(t, img)[0]
		reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, func(w http.ResponseWriter, r *http.Request, _ http.Handler) {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, hostileBody)
		}))
		push(t, reg.host+"/app:v1", img)
		p := newTestPuller(t, Options{})
		resolved, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:v1"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Fetch(ctx, resolved, nil)
		t.Logf("Fetch: %v", err)
		wantNoMarker(t, err)
		if !strings.Contains(err.Error(), "unexpected status 500") {
			t.Errorf("error %q does not give the status", err)
		}
	})
}

func TestManifestCap(t *testing.T) {
	img := testImage(t, 1, 256)
	// A manifest padded past the cap: valid JSON, one annotation of 4 MiB.
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["annotations"] = map[string]string{"pad": strings.Repeat("x", MaxManifestBytes)}
	big, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	mt, _ := img.MediaType()
	for name, chunked := range map[string]bool{"ContentLength": false, "Chunked": true} {
		t.Run(name, func(t *testing.T) {
			reg := newTestRegistry(t, func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
						w.Header().Set("Content-Type", string(mt))
						if !chunked {
							w.Header().Set("Content-Length", fmt.Sprint(len(big)))
						}
						w.Write(big[:1024])
						w.(http.Flusher).Flush()
						w.Write(big[1024:])
						return
					}
					h.ServeHTTP(w, r)
				})
			})
			push(t, reg.host+"/app:v1", img)
			p := newTestPuller(t, Options{})
			_, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/app:v1"})
			t.Logf("Resolve: %v", err)
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "manifest: too large: larger than the 4 MiB cap") {
				t.Fatalf("Resolve error = %v, want ErrTooLarge naming the manifest cap", err)
			}
		})
	}
}

func TestConfigCap(t *testing.T) {
	img := testImage(t, 1, 256)
	cfgDigest, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	mt, _ := img.MediaType()

	t.Run("Declared", func(t *testing.T) {
		// The manifest declares a config past the cap: refused unread.
		m := mf.DeepCopy()
		m.Config.Size = MaxConfigBytes + 1
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		reg := newTestRegistry(t, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
					w.Header().Set("Content-Type", string(mt))
					w.Write(raw)
					return
				}
				h.ServeHTTP(w, r)
			})
		})
		push(t, reg.host+"/app:v1", img)
		reg.reset()
		p := newTestPuller(t, Options{})
		_, err = p.Resolve(context.Background(), Source{Ref: reg.host + "/app:v1"})
		t.Logf("Resolve: %v", err)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "image config: too large: larger than the 8 MiB cap") {
			t.Fatalf("Resolve error = %v, want ErrTooLarge naming the config cap", err)
		}
		if n := reg.blobGets(cfgDigest); n != 0 {
			t.Errorf("the oversized config was requested %d times", n)
		}
	})
	t.Run("Served", func(t *testing.T) {
		// The manifest declares the real size; the registry sends more
		// than the cap: the read stops at the declared size plus one.
		reg := newTestRegistry(t, blobWrapper([]v1.Hash{cfgDigest}, func(w http.ResponseWriter, r *http.Request, _ http.Handler) {
			w.Write(rawCfg)
			w.Write(bytes.Repeat([]byte(" "), MaxConfigBytes+1))
		}))
		push(t, reg.host+"/app:v1", img)
		p := newTestPuller(t, Options{})
		_, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/app:v1"})
		t.Logf("Resolve: %v", err)
		if !errors.Is(err, ErrDigestMismatch) && !errors.Is(err, ErrTooLarge) {
			t.Fatalf("Resolve error = %v, want ErrDigestMismatch or ErrTooLarge", err)
		}
	})
}
