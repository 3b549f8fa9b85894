package blobstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
)

// backend is one Store implementation the conformance suite runs: its
// name as Backend returns it, the abilities it must declare, and open,
// which returns a fresh, empty store of it with the probe that looks
// behind its back.
type backend struct {
	name      string
	abilities blobstore.Abilities
	open      func(tb testing.TB) *harness
}

// backends are every Store the package offers.
var backends = []backend{
	{blobstore.BackendFS, blobstore.Abilities{LinkFiles: true}, openFS},
	{blobstore.BackendS3, blobstore.Abilities{Presign: true, LocalFallback: true}, openS3},
}

// harness is a store under test and what a case needs to check it around
// the interface: what it holds, and the traces of Puts it did not make.
type harness struct {
	blobstore.Store
	// objects lists the keys of the published objects, sorted.
	objects func(tb testing.TB) []string
	// leftovers lists, sorted, what the store holds besides published
	// objects: fs temporary files, sidecars without an object and files
	// outside the root; S3 incomplete multipart uploads.
	leftovers func(tb testing.TB) []string
	// interrupt leaves what a Put of data to key that stopped before
	// publishing leaves, as another process (a replica, or this one
	// before a crash) would, and returns its traces as leftovers lists
	// them and a func that publishes it, as its owner would go on to.
	interrupt func(tb testing.TB, key string, data []byte, sum string) (traces []string, complete func(testing.TB))
	// corrupt changes a stored object's bytes, keeping its recorded sha256.
	corrupt func(tb testing.TB, key string)
	// missing returns a store of the same backend whose bucket (fs: root)
	// does not exist, and that bucket's name.
	missing func(tb testing.TB) (blobstore.Store, string)
}

// conformanceCases are the behaviours every backend shares. A case that
// needs an ability skips by asking the store, never by its name.
var conformanceCases = []struct {
	name string
	run  func(t *testing.T, h *harness)
}{
	{"RoundTrip", testRoundTrip},
	{"Get", testGet},
	{"Missing", testMissing},
	{"Overwrite", testOverwrite},
	{"WrongContent", testWrongContent},
	{"BadArguments", testBadArguments},
	{"InvalidKeys", testInvalidKeys},
	{"PutFile", testPutFile},
	{"CancelMidPut", testCancelMidPut},
	{"AbortOnlyItsKey", testAbortOnlyItsKey},
	{"AbortSparesYounger", testAbortSparesYounger},
	{"Presign", testPresign},
	{"PresignUnsupported", testPresignUnsupported},
	{"Check", testCheck},
	{"CheckMissingBucket", testCheckMissingBucket},
}

// TestConformance runs every backend through every case, each on a fresh
// store, as TestConformance/<backend>/<case>.
func TestConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Run("Identity", func(t *testing.T) {
				h := b.open(t)
				if got := h.Backend(); got != b.name {
					t.Errorf("Backend() = %q; want %q", got, b.name)
				}
				if got := h.Abilities(); got != b.abilities {
					t.Errorf("Abilities() = %+v; want %+v", got, b.abilities)
				}
			})
			for _, c := range conformanceCases {
				t.Run(c.name, func(t *testing.T) { c.run(t, b.open(t)) })
			}
		})
	}
}

// putSizes are the object sizes round trips use: nothing, one request,
// and (S3) a multipart upload whose last part is short.
var putSizes = []struct {
	name string
	size int
}{{"Empty", 0}, {"Small", 1000}, {"Multipart", 2*blobstore.MinPartSize + 12345}}

// wantHeld fails unless the store holds exactly the objects given and no
// leftovers.
func (h *harness) wantHeld(tb testing.TB, when string, objects ...string) {
	tb.Helper()
	if got := h.objects(tb); !slices.Equal(got, objects) {
		tb.Errorf("objects %s = %q; want %q", when, got, objects)
	}
	if got := h.leftovers(tb); len(got) != 0 {
		tb.Errorf("leftovers %s = %q; want none", when, got)
	}
}

// mustPut puts data to key, failing the test on error.
func (h *harness) mustPut(tb testing.TB, key string, data []byte, sum string) {
	tb.Helper()
	if err := h.Put(context.Background(), key, bytes.NewReader(data), int64(len(data)), sum); err != nil {
		tb.Fatalf("Put(%s): %v", key, err)
	}
}

// wantEmpty fails unless Stat and Get of key answer ErrNotFound and the
// store holds nothing at all.
func (h *harness) wantEmpty(tb testing.TB, key, when string) {
	tb.Helper()
	ctx := context.Background()
	if _, err := h.Stat(ctx, key); !errors.Is(err, blobstore.ErrNotFound) {
		tb.Errorf("Stat(%s) %s = %v; want ErrNotFound", key, when, err)
	}
	if _, err := h.Get(ctx, key, 1<<30); !errors.Is(err, blobstore.ErrNotFound) {
		tb.Errorf("Get(%s) %s = %v; want ErrNotFound", key, when, err)
	}
	h.wantHeld(tb, when)
}

// wantStored fails unless Stat and Get of key answer data.
func (h *harness) wantStored(tb testing.TB, key string, data []byte, sum string) {
	tb.Helper()
	ctx := context.Background()
	info, err := h.Stat(ctx, key)
	if err != nil || info.Key != key || info.Size != int64(len(data)) || info.SHA256 != sum {
		tb.Errorf("Stat(%s) = %+v, %v; want size %d sha256 %s", key, info, err, len(data), sum)
	}
	got, err := h.Get(ctx, key, int64(len(data)))
	if err != nil || !bytes.Equal(got, data) {
		tb.Errorf("Get(%s) = %d bytes sha256 %s, %v; want the %d bytes put (%s)", key, len(got), sha256Hex(got), err, len(data), sum)
	}
}

// wantError fails unless err is an *blobstore.Error of h's backend and op
// matching want (any failure when want is nil), and returns it.
func (h *harness) wantError(tb testing.TB, call string, err error, op string, want error) *blobstore.Error {
	tb.Helper()
	var e *blobstore.Error
	if (want != nil && !errors.Is(err, want)) || !errors.As(err, &e) || e.Backend != h.Backend() || e.Op != op {
		tb.Errorf("%s = %#v (%v); want a %s %s *blobstore.Error matching %v", call, err, err, h.Backend(), op, want)
		return nil
	}
	return e
}

// testRoundTrip: an object put is there for Stat and Get, stamped with the
// time it was put, until Delete, which succeeds again once it is gone.
func testRoundTrip(t *testing.T, h *harness) {
	ctx := context.Background()
	for _, c := range putSizes {
		t.Run(c.name, func(t *testing.T) {
			data, sum := randomBytes(c.size, uint64(c.size)+1)
			key := blobstore.ArtifactKey("/tc/artifacts/", "art-"+strings.ToLower(c.name))
			began := time.Now()
			h.mustPut(t, key, data, sum)
			h.wantStored(t, key, data, sum)
			info, err := h.Stat(ctx, key)
			if err == nil && (info.ModTime.Before(began.Add(-time.Minute)) || info.ModTime.After(time.Now().Add(time.Minute))) {
				t.Errorf("Stat ModTime = %s; want about %s", info.ModTime, began)
			}
			h.wantHeld(t, "after Put", key)
			for i := range 2 {
				if err := h.Delete(ctx, key); err != nil {
					t.Fatalf("Delete #%d: %v", i+1, err)
				}
			}
			h.wantEmpty(t, key, "after Delete")
		})
	}
}

// testGet: Get returns the bytes put up to its limit, refuses an object
// over it, and refuses bytes that no longer match the recorded sha256.
func testGet(t *testing.T, h *harness) {
	ctx := context.Background()
	data, sum := randomBytes(3000, 7)
	const key = "get/object.json"
	h.mustPut(t, key, data, sum)
	for _, limit := range []int64{3000, 4096} {
		if got, err := h.Get(ctx, key, limit); err != nil || !bytes.Equal(got, data) {
			t.Errorf("Get(limit %d) = %d bytes, %v; want the %d put", limit, len(got), err, len(data))
		}
	}
	_, err := h.Get(ctx, key, 2999)
	h.wantError(t, "Get over the limit", err, "get", blobstore.ErrSizeMismatch)
	h.corrupt(t, key)
	_, err = h.Get(ctx, key, 4096)
	h.wantError(t, "Get of altered bytes", err, "get", blobstore.ErrChecksumMismatch)
}

// testMissing: a missing object is ErrNotFound for Stat and Get, as the
// error's Kind and permanent, and deleting it is success.
func testMissing(t *testing.T, h *harness) {
	ctx := context.Background()
	for _, key := range []string{"missing.ext4", "no/such/dir/missing.ext4"} {
		_, statErr := h.Stat(ctx, key)
		_, getErr := h.Get(ctx, key, 4096)
		for op, err := range map[string]error{"stat": statErr, "get": getErr} {
			e := h.wantError(t, op+" "+key, err, op, blobstore.ErrNotFound)
			if e == nil {
				continue
			}
			if e.Kind != blobstore.ErrNotFound || e.Key != key || e.Temporary() {
				t.Errorf("%s %s = %#v; want Kind ErrNotFound, the key, permanent", op, key, e)
			}
			if prefix := h.Backend() + " " + op + " " + key + ": "; !strings.HasPrefix(err.Error(), prefix) {
				t.Errorf("%s %s = %q; want it to begin %q", op, key, err, prefix)
			}
		}
		if err := h.Delete(ctx, key); err != nil {
			t.Errorf("Delete of missing %s = %v; want success", key, err)
		}
	}
	h.wantHeld(t, "after looking for missing objects")
}

// testOverwrite: a Put replaces an object; a refused Put leaves the object
// it would have replaced as it was.
func testOverwrite(t *testing.T, h *harness) {
	ctx := context.Background()
	const key = "overwrite.ext4"
	first, firstSum := randomBytes(1000, 31)
	second, secondSum := randomBytes(1500, 32)
	h.mustPut(t, key, first, firstSum)
	err := h.Put(ctx, key, bytes.NewReader(second), 1500, firstSum)
	h.wantError(t, "Put with a wrong sha256 over an object", err, "put", blobstore.ErrChecksumMismatch)
	h.wantStored(t, key, first, firstSum)
	h.mustPut(t, key, second, secondSum)
	h.wantStored(t, key, second, secondSum)
	h.wantHeld(t, "after overwriting", key)
}

// testWrongContent: a Put whose bytes differ from the size or sha256 given
// is refused and leaves nothing, whether it fits one request or not.
func testWrongContent(t *testing.T, h *harness) {
	ctx := context.Background()
	for _, s := range []struct {
		name string
		size int
	}{{"Single", 1000}, {"Multipart", 2*blobstore.MinPartSize + 1}} {
		data, sum := randomBytes(s.size, 7)
		_, other := randomBytes(s.size, 8)
		for _, c := range []struct {
			name string
			r    io.Reader
			sha  string
			want error
		}{
			{"Checksum", bytes.NewReader(data), other, blobstore.ErrChecksumMismatch},
			{"Short", bytes.NewReader(data[:s.size-1]), sum, blobstore.ErrSizeMismatch},
			{"Long", io.MultiReader(bytes.NewReader(data), strings.NewReader("x")), sum, blobstore.ErrSizeMismatch},
		} {
			t.Run(s.name+c.name, func(t *testing.T) {
				key := "wrong-" + strings.ToLower(s.name) + ".ext4"
				err := h.Put(ctx, key, c.r, int64(s.size), c.sha)
				h.wantError(t, "Put", err, "put", c.want)
				h.wantEmpty(t, key, "after a refused Put")
			})
		}
	}
}

// testBadArguments: a Put with a malformed sha256 or a negative size is
// refused before it reads anything.
func testBadArguments(t *testing.T, h *harness) {
	ctx := context.Background()
	for name, c := range map[string]struct {
		size int64
		sha  string
	}{
		"NotHex":       {0, "nothex"},
		"ShortHex":     {0, sha256Hex(nil)[:63]},
		"NonHexDigit":  {0, "g" + sha256Hex(nil)[1:]},
		"NegativeSize": {-1, sha256Hex(nil)},
	} {
		r := &countingReader{}
		err := h.Put(ctx, "bad-args.ext4", r, c.size, c.sha)
		h.wantError(t, fmt.Sprintf("%s: Put(size %d, sha256 %q)", name, c.size, c.sha), err, "put", nil)
		if r.reads != 0 {
			t.Errorf("%s: Put read its source %d times before refusing its arguments", name, r.reads)
		}
	}
	h.wantHeld(t, "after refused Puts")
}

// countingReader is an empty source that counts its reads.
type countingReader struct{ reads int }

func (c *countingReader) Read([]byte) (int, error) { c.reads++; return 0, io.EOF }

// testInvalidKeys: keys that are empty, absolute, not clean or that climb
// out are refused by every method that takes a key, and nothing appears
// (fs: neither in nor beside the root).
func testInvalidKeys(t *testing.T, h *harness) {
	ctx := context.Background()
	data, sum := randomBytes(10, 1)
	src := filepath.Join(t.TempDir(), "src.ext4")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"", "../escape.ext4", "/etc/escape.ext4", "a/../../escape.ext4", "a/./b.ext4",
		"a//b.ext4", "a/", "./a.ext4", `a\..\b.ext4`, "a\x00b.ext4", strings.Repeat("k", 1025)} {
		_, statErr := h.Stat(ctx, key)
		_, getErr := h.Get(ctx, key, 4096)
		for _, c := range []struct {
			call, op string
			err      error
		}{
			{"Put", "put", h.Put(ctx, key, bytes.NewReader(data), 10, sum)},
			{"PutFile", "put", h.PutFile(ctx, key, src, 10, sum)},
			{"Stat", "stat", statErr},
			{"Get", "get", getErr},
			{"Delete", "delete", h.Delete(ctx, key)},
			{"AbortIncomplete", "abort", h.AbortIncomplete(ctx, key, time.Now())},
		} {
			h.wantError(t, fmt.Sprintf("%s(%.40q)", c.call, key), c.err, c.op, blobstore.ErrInvalidKey)
		}
		if h.Abilities().Presign {
			_, err := h.PresignGet(ctx, key, time.Hour)
			h.wantError(t, fmt.Sprintf("PresignGet(%.40q)", key), err, "presign", blobstore.ErrInvalidKey)
		}
	}
	h.wantHeld(t, "after invalid keys")
}

// testPutFile: PutFile stores a local file as Put stores its bytes, and
// refuses one whose size differs.
func testPutFile(t *testing.T, h *harness) {
	ctx := context.Background()
	data, sum := randomBytes(blobstore.MinPartSize+7, 3)
	src := filepath.Join(t.TempDir(), "published.ext4")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.PutFile(ctx, "putfile.ext4", src, int64(len(data)), sum); err != nil {
		t.Fatalf("PutFile: %v", err)
	}
	h.wantStored(t, "putfile.ext4", data, sum)
	if got, err := os.ReadFile(src); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the source changed under PutFile (%v)", err)
	}

	err := h.PutFile(ctx, "short.ext4", src, int64(len(data))-1, sum)
	h.wantError(t, "PutFile with a short size", err, "put", blobstore.ErrSizeMismatch)
	err = h.PutFile(ctx, "long.ext4", src, int64(len(data))+1, sum)
	h.wantError(t, "PutFile with a long size", err, "put", blobstore.ErrSizeMismatch)
	if !h.Abilities().LinkFiles {
		// A linked file is not read, so its sha256 is the caller's word
		// (FS.PutFile); fs_test checks the copying path refuses a wrong one.
		_, other := randomBytes(len(data), 4)
		err = h.PutFile(ctx, "checksum.ext4", src, int64(len(data)), other)
		h.wantError(t, "PutFile with a wrong sha256", err, "put", blobstore.ErrChecksumMismatch)
	}
	err = h.PutFile(ctx, "nosource.ext4", filepath.Join(t.TempDir(), "absent.ext4"), 10, sum)
	if e := h.wantError(t, "PutFile of a missing file", err, "put", fs.ErrNotExist); e != nil && errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("PutFile of a missing file = %v; want no ErrNotFound, which says the object is missing", err)
	}
	h.wantHeld(t, "after PutFile", "putfile.ext4")
}

// testCancelMidPut: a Put whose ctx ends partway returns the ctx's error
// and publishes nothing, and leaves nothing once aborted.
func testCancelMidPut(t *testing.T, h *harness) {
	const key = "cancelled.ext4"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	size := int64(3*blobstore.MinPartSize + 1)
	r := newStreamReader(size, 5)
	r.onRead = func(total int64) {
		if total >= 2*blobstore.MinPartSize+1 {
			cancel()
		}
	}
	if err := h.Put(ctx, key, r, size, streamSHA256(t, size, 5)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Put = %v; want context.Canceled", err)
	}
	h.wantEmpty(t, key, "after a cancelled Put")
	if err := h.AbortIncomplete(context.Background(), key, time.Now()); err != nil {
		t.Fatalf("AbortIncomplete: %v", err)
	}
	h.wantHeld(t, "after a cancelled Put and AbortIncomplete")
}

// testAbortOnlyItsKey: AbortIncomplete removes what interrupted Puts of
// its key left, and nothing of other keys, even those it prefixes; with
// nothing to abort it succeeds.
func testAbortOnlyItsKey(t *testing.T, h *harness) {
	ctx := context.Background()
	const key = "dir/a.ext4"
	data, sum := randomBytes(1000, 1)
	h.mustPut(t, key, data, sum)
	h.interrupt(t, key, data, sum)
	h.interrupt(t, key, data, sum)
	var others []string
	for _, other := range []string{"dir/a.ext4.other", "dir/a.ext4.tmp-1", "dir/xa.ext4", "a.ext4", "dir/a/b.ext4"} {
		traces, _ := h.interrupt(t, other, data, sum)
		others = append(others, traces...)
	}
	slices.Sort(others)
	if err := h.AbortIncomplete(ctx, key, time.Now().Add(2*time.Second)); err != nil {
		t.Fatalf("AbortIncomplete: %v", err)
	}
	if got := h.leftovers(t); !slices.Equal(got, others) {
		t.Errorf("leftovers after AbortIncomplete(%s) = %q; want the other keys' %q", key, got, others)
	}
	if got := h.objects(t); !slices.Equal(got, []string{key}) {
		t.Errorf("objects after AbortIncomplete(%s) = %q; want the key's own", key, got)
	}
	h.wantStored(t, key, data, sum)
	for _, k := range []string{key, "never/put.ext4"} {
		if err := h.AbortIncomplete(ctx, k, time.Now()); err != nil {
			t.Errorf("AbortIncomplete(%s) with nothing to abort: %v", k, err)
		}
	}
}

// testAbortSparesYounger: what a Put started after the cutoff left may be
// another replica's Put in progress: AbortIncomplete leaves it, and its
// owner can still publish it. One started before the cutoff goes.
func testAbortSparesYounger(t *testing.T, h *harness) {
	ctx := context.Background()
	const key = "two-uploaders.ext4"
	data, sum := randomBytes(1000, 2)
	theirs, complete := h.interrupt(t, key, data, sum)
	if err := h.AbortIncomplete(ctx, key, time.Now().Add(-time.Hour)); err != nil {
		t.Fatalf("AbortIncomplete: %v", err)
	}
	if got := h.leftovers(t); !slices.Equal(got, theirs) {
		t.Fatalf("leftovers after AbortIncomplete with an hour's cutoff = %q; want the younger Put's %q kept", got, theirs)
	}
	complete(t)
	h.wantStored(t, key, data, sum)
	h.wantHeld(t, "after the other uploader published", key)

	stale, _ := h.interrupt(t, key, data, sum)
	if err := h.AbortIncomplete(ctx, key, time.Now().Add(2*time.Second)); err != nil {
		t.Fatalf("AbortIncomplete: %v", err)
	}
	if got := h.leftovers(t); len(got) != 0 {
		t.Errorf("leftovers after AbortIncomplete = %q; want %q, started before the cutoff, removed", got, stale)
	}
	h.wantStored(t, key, data, sum)
}

// testPresign: a presigned URL downloads the object as an attachment named
// after the key's base name; a ttl outside (0, 7 days] is refused.
func testPresign(t *testing.T, h *harness) {
	if !h.Abilities().Presign {
		t.Skip("the backend does not presign")
	}
	ctx := context.Background()
	for _, c := range putSizes {
		t.Run(c.name, func(t *testing.T) {
			data, sum := randomBytes(c.size, uint64(c.size)+1)
			id := "art-" + strings.ToLower(c.name)
			key := blobstore.ArtifactKey("/tc/artifacts/", id)
			h.mustPut(t, key, data, sum)
			u, err := h.PresignGet(ctx, key, blobstore.MaxPresignTTL)
			if err != nil {
				t.Fatalf("PresignGet: %v", err)
			}
			resp, err := http.Get(u)
			if err != nil {
				t.Fatalf("GET presigned URL: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET presigned URL: %s, %v", resp.Status, err)
			}
			if !bytes.Equal(body, data) {
				t.Errorf("downloaded %d bytes, sha256 %s; want the %d bytes put (%s)", len(body), sha256Hex(body), c.size, sum)
			}
			if got, want := resp.Header.Get("Content-Disposition"), `attachment; filename="`+id+`.ext4"`; got != want {
				t.Errorf("Content-Disposition = %q; want %q", got, want)
			}
		})
	}
	for _, ttl := range []time.Duration{0, -time.Second, blobstore.MaxPresignTTL + time.Second} {
		u, err := h.PresignGet(ctx, "k.ext4", ttl)
		if e := h.wantError(t, fmt.Sprintf("PresignGet(ttl %s)", ttl), err, "presign", nil); e != nil && u != "" {
			t.Errorf("PresignGet(ttl %s) = %q; want no URL", ttl, u)
		}
	}
}

// testPresignUnsupported: a backend that cannot presign says so.
func testPresignUnsupported(t *testing.T, h *harness) {
	if h.Abilities().Presign {
		t.Skip("the backend presigns")
	}
	ctx := context.Background()
	data, sum := randomBytes(10, 1)
	h.mustPut(t, "k.ext4", data, sum)
	u, err := h.PresignGet(ctx, "k.ext4", time.Hour)
	if e := h.wantError(t, "PresignGet", err, "presign", blobstore.ErrNotSupported); e != nil && (u != "" || e.Kind != blobstore.ErrNotSupported) {
		t.Errorf("PresignGet = %q, %#v; want \"\" and Kind ErrNotSupported", u, e)
	}
}

// testCheck: a usable store passes Check, which leaves nothing behind.
func testCheck(t *testing.T, h *harness) {
	if err := h.Check(context.Background()); err != nil {
		t.Fatalf("Check: %v", err)
	}
	h.wantHeld(t, "after Check")
}

// testCheckMissingBucket: Check of a store whose bucket (fs: root) is
// missing says so, naming it.
func testCheckMissingBucket(t *testing.T, h *harness) {
	s, name := h.missing(t)
	err := s.Check(context.Background())
	e := h.wantError(t, "Check", err, "check", blobstore.ErrBucketMissing)
	if e != nil && (e.Kind != blobstore.ErrBucketMissing || e.Temporary() || !strings.Contains(err.Error(), name)) {
		t.Errorf("Check = %#v (%v); want Kind ErrBucketMissing, permanent, naming %s", e, err, name)
	}
}
