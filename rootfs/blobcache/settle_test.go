package blobcache

import (
	"testing"
	"time"
)

// TestTranscodeSettlesAfterABuild checks that the transcoder leaves the
// moments after a build (its BUILT report, a reuse submitted at once) alone:
// a blob a build released is transcoded only once transcodeSettle has
// passed since, and a build released meanwhile starts the wait over.
func TestTranscodeSettlesAfterABuild(t *testing.T) {
	reg, img := servedImage(t, 1, 128<<10)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	now := time.Unix(1_000_000, 0)
	waits, fire := make(chan time.Duration, 4), make(chan time.Time)
	c.tc.mu.Lock()
	c.tc.settle = transcodeSettle
	c.tc.now = func() time.Time { return now }
	c.tc.after = func(d time.Duration) <-chan time.Time { waits <- d; return fire }
	c.tc.mu.Unlock()

	fetchImage(t, c, reg, img).Close() // the build ends: its blob is queued
	waited := func() time.Duration {
		t.Helper()
		select {
		case d := <-waits:
			return d
		case <-time.After(30 * time.Second):
			t.Fatalf("the transcoder did not wait after the build: %+v", c.Stats())
			return 0
		}
	}
	if d := waited(); d != transcodeSettle {
		t.Errorf("waited %v after the build, want %v", d, transcodeSettle)
	}
	if st := c.Stats(); st.ZstdBlobs != 0 || st.TranscodePending != 1 || !st.TranscodePaused {
		t.Errorf("Stats() = %+v right after the build, want the blob pending, untouched, the transcoder paused", st)
	}
	if forms, temps := zstdFiles(t, dir); len(forms)+len(temps) != 0 {
		t.Errorf("zstd forms %v and temps %v right after the build", forms, temps)
	}

	// Another build ends 400 ms into the wait: the wait starts over from
	// its end.
	c.tc.mu.Lock()
	now = now.Add(400 * time.Millisecond)
	c.tc.mu.Unlock()
	c.Release(nil)
	c.tc.mu.Lock()
	now = now.Add(300 * time.Millisecond)
	c.tc.mu.Unlock()
	fire <- now
	if d := waited(); d != transcodeSettle-300*time.Millisecond {
		t.Errorf("waited %v after the second build, want %v", d, transcodeSettle-300*time.Millisecond)
	}
	c.tc.mu.Lock()
	now = now.Add(transcodeSettle)
	c.tc.mu.Unlock()
	fire <- now
	waitTranscodes(t, c)
	if st := c.Stats(); st.ZstdBlobs != 1 || st.TranscodePaused {
		t.Errorf("Stats() = %+v once settled, want the blob transcoded", st)
	}
}
