package registry

import (
	"net/http"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestStartWithAuth(t *testing.T) {
	r := StartForTest(t, Options{Username: "alice", Password: "pa55-word"})

	get := func(user, pass string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+r.Host+"/v2/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET /v2/: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("", ""); got != http.StatusUnauthorized {
		t.Errorf("GET /v2/ anonymous = %d, want 401", got)
	}
	if got := get("alice", "wrong"); got != http.StatusUnauthorized {
		t.Errorf("GET /v2/ wrong password = %d, want 401", got)
	}
	if got := get("alice", "pa55-word"); got != http.StatusOK {
		t.Errorf("GET /v2/ good password = %d, want 200", got)
	}

	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(r.Ref("team/app:v1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(r.Auth())); err != nil {
		t.Fatalf("push: %v", err)
	}
	got, err := remote.Image(ref, remote.WithAuth(r.Auth()))
	if err != nil {
		t.Fatalf("pull: %v", err)
	}
	gd, err := got.Digest()
	if err != nil {
		t.Fatal(err)
	}
	wd, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if gd != wd {
		t.Errorf("pulled digest %s, pushed %s", gd, wd)
	}
}

func TestStartAnonymous(t *testing.T) {
	r := StartForTest(t, Options{})
	resp, err := http.Get("http://" + r.Host + "/v2/")
	if err != nil {
		t.Fatalf("GET /v2/: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v2/ = %d, want 200", resp.StatusCode)
	}
}
