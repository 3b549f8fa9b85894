package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/blobcache"
)

// errNoRanges marks a place answering a Range request with the whole blob
// (200) or refusing it (416) when the caller could not use the whole blob:
// the blob is then fetched by one stream.
var errNoRanges = errors.New("the registry does not serve ranges")

// errRunIncomplete marks a run whose streams ended with bytes of the blob
// nobody fetched (given back by a stream that learnt the place serves no
// ranges after the first stream had passed them).
var errRunIncomplete = errors.New("bytes of the blob were left unfetched")

// rangeSupport is what a place's answers told about Range requests.
type rangeSupport int

const (
	rangesUnknown rangeSupport = iota
	rangesServed
	rangesRefused
)

// blobRun fetches the missing bytes of one blob from one place. Its first
// stream asks for everything from the first missing byte on (the whole
// blob, without a Range header, when nothing is held yet), before the
// blob's turn at the gate, and reads the body once granted, claiming the
// bytes chunk by chunk as it goes. Once it reads, extra streams may join
// while the gate grants them: each claims the next free chunk and asks for
// exactly that range. The first stream ends its request where another's
// claim begins and goes on with ranged requests of its own. Every stream
// writes at the offsets it fetched (Partial.WriteAt); readers follow the
// contiguous prefix. A place that answers a Range request with the whole
// blob, or refuses it, leaves the blob to the first stream, which then
// skips what is held.
type blobRun struct {
	d    *downloader
	p    *blobcache.Partial
	o    blobOpener
	ctx  context.Context
	stop context.CancelCauseFunc

	mu     sync.Mutex
	plan   chunkPlan
	ranges rangeSupport
	// changed is closed, and replaced, when a claim is given back or the
	// ranges verdict comes: a stream waiting on another's claim looks again.
	changed chan struct{}
	// started: the first stream reads (helpers may join); ended: it is
	// done (none may join any more).
	started, ended bool
	// waiting counts the helpers waiting at the gate.
	waiting int
	// streams counts the streams started (their index), running those
	// still running, live those plus the helpers waiting at the gate.
	streams, running, live int
	idle                   chan struct{}
	err                    error
}

// stream is one connection's worth of a blobRun.
type stream struct {
	index int
	// openEnded: the request runs to the end of the blob, the stream
	// claiming chunks as it reads (the first stream's first request).
	openEnded bool
	granted   bool
	// claim is what the stream claimed and has not written yet; chunk
	// is the whole claim, for the span event.
	claim, chunk blobcache.Range
	// resumed tells that the next request continues after a drop.
	resumed bool
}

// walkAction is what a stream does at a byte it has not claimed.
type walkAction int

const (
	walkWrite walkAction = iota // claimed it: write
	walkSkip                    // read past held bytes (a body served whole)
	walkWait                    // another stream's claim, ranges not known yet
	walkStop                    // end the request
)

func (d *downloader) newRun(ctx context.Context, p *blobcache.Partial, o blobOpener) *blobRun {
	ctx, stop := context.WithCancelCause(ctx)
	return &blobRun{d: d, p: p, o: o, ctx: ctx, stop: stop,
		plan: chunkPlan{free: p.Missing()}, changed: make(chan struct{}), idle: make(chan struct{})}
}

// run fetches what p misses from the run's place and returns once every
// stream ended: nil when the blob is complete.
func (r *blobRun) run() error {
	defer r.stop(nil)
	s := r.newStream(true)
	err := r.stream(s)
	if s.granted {
		r.d.gate.release(r.d.lane)
	}
	r.mu.Lock()
	r.ended = true
	r.mu.Unlock()
	r.leave(s, err)
	<-r.idle
	r.mu.Lock()
	err = r.err
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if len(r.p.Missing()) > 0 {
		return errRunIncomplete
	}
	return nil
}

// newStream counts a stream in; the first is open-ended.
func (r *blobRun) newStream(first bool) *stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &stream{index: r.streams, openEnded: first}
	r.streams++
	r.running++
	if first {
		r.live++
	}
	return s
}

// leave counts a stream out: its claim goes back to the plan, its error
// (the first) stops the run.
func (r *blobRun) leave(s *stream, err error) {
	r.mu.Lock()
	if s != nil {
		r.running--
		if s.claim.Len() > 0 {
			r.plan.giveBack(s.claim)
			s.claim = blobcache.Range{}
			r.notifyLocked()
		}
	}
	if err != nil && r.err == nil && r.ctx.Err() == nil {
		r.err = err
		r.stop(err)
	}
	if r.live--; r.live == 0 {
		close(r.idle)
	}
	r.mu.Unlock()
	r.d.gate.poke()
	r.maybeHelp()
}

func (r *blobRun) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// wantsHelper reports whether another stream would help: the first one
// reads, the place may serve ranges, and enough of the blob is unclaimed.
func (r *blobRun) wantsHelper() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wantsHelperLocked()
}

func (r *blobRun) wantsHelperLocked() bool {
	return r.started && !r.ended && r.o.ranged && r.ranges != rangesRefused && r.ctx.Err() == nil &&
		r.d.chunks.helps(r.p.Size(), r.plan.left())
}

// maybeHelp sends helpers to wait at the gate, as many as the blob's
// streams may still grow by, while more are wanted. They wait all at once
// so that a target the gate raises by several goes to this blob before a
// later one: with one waiting at a time, the grants after the first went
// to the next layer while this one's next helper was still on its way.
func (r *blobRun) maybeHelp() {
	r.mu.Lock()
	n := 0
	for r.waiting+r.running < r.d.gate.perBlob && r.wantsHelperLocked() {
		r.waiting++
		r.live++
		n++
	}
	r.mu.Unlock()
	for range n {
		go r.helper()
	}
}

// helper waits for a grant, then fetches chunks until none is left.
func (r *blobRun) helper() {
	ok, _ := r.d.gate.acquire(r.ctx, r.d.lane, r.wantsHelper)
	r.mu.Lock()
	r.waiting--
	r.mu.Unlock()
	if !ok {
		// No work any more, or the run stops: either way, not an error.
		r.leave(nil, nil)
		return
	}
	s := r.newStream(false)
	s.granted = true
	r.maybeHelp() // in its place, one queues behind
	err := r.stream(s)
	r.d.gate.release(r.d.lane)
	r.leave(s, err)
}

// tries counts the attempts at one claim.
type tries struct{ attempt, stalls, resumes int }

// stream runs s until no byte is left to claim: each claim is fetched
// with its own retries (a drop after bytes continues from them up to
// maxResumes times, other transient failures are tried attemptsPerPlace
// times, a stall twice).
func (r *blobRun) stream(s *stream) error {
	t := tries{attempt: 1}
	for {
		if s.claim.Len() == 0 {
			if s.index > 0 && r.d.gate.surplus() {
				return nil // the rule took this stream back
			}
			if !r.claim(s) {
				return nil
			}
			t = tries{attempt: 1}
		}
		got, err := r.request(s)
		if err == nil {
			s.openEnded = false
			continue
		}
		if r.ctx.Err() != nil {
			return context.Cause(r.ctx)
		}
		var se *StallError
		switch {
		case errors.Is(err, errNoRanges):
			r.setRanges(false)
			return nil
		case errors.Is(err, ErrDigestMismatch):
			// More bytes than the manifest says: readers may have
			// used them, so no other place can make this right.
			return err
		case errors.As(err, &se):
			if t.stalls++; t.stalls < 2 && t.attempt < attemptsPerPlace {
				t.attempt++
				continue // a stalled connection is dropped; a new one may move
			}
			return err
		case isTransient(err) && got > 0 && t.resumes < maxResumes:
			t.resumes++
			s.resumed = true
			continue // the connection dropped after bringing bytes: continue from them
		case isTransient(err) && t.attempt < attemptsPerPlace:
			if werr := sleepCtx(r.ctx, time.Duration(t.attempt)*200*time.Millisecond); werr != nil {
				return werr
			}
			t.attempt++
			continue
		}
		return err
	}
}

// claim gives s its next chunk: the first free bytes.
func (r *blobRun) claim(s *stream) bool {
	rate, ttfb := r.d.gate.streamRate()
	r.mu.Lock()
	c, ok := r.plan.claimFirst(r.d.chunks.size(r.plan.left(), r.running, rate, ttfb))
	if ok {
		s.claim, s.chunk = c, c
	}
	r.mu.Unlock()
	r.d.gate.poke()
	return ok
}

// request makes one request for s's claim (to the end of the blob when s
// is open-ended) and writes what it brings; it returns the bytes written.
// The first stream's first request is sent before its turn: the
// connection, authentication and redirect are ready when the turn comes.
func (r *blobRun) request(s *stream) (int64, error) {
	size := r.p.Size()
	off, end := s.claim.Off, s.claim.End
	if s.openEnded {
		end = size
	}
	sent := time.Now()
	body, start, err := r.o.open(r.ctx, off, end, size, s.openEnded)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	firstByte := time.Since(sent)
	if !s.granted {
		ok, err := r.d.gate.acquire(r.ctx, r.d.lane, func() bool { return true })
		if !ok {
			if err == nil {
				err = errors.New("no stream granted")
			}
			return 0, err
		}
		s.granted = true
		r.mu.Lock()
		r.started = true
		r.mu.Unlock()
		r.d.event(r.ctx, EventLayerTurn)
		r.maybeHelp()
	}
	if off > 0 || end < size {
		r.setRanges(start == off)
	}
	if s.resumed {
		s.resumed = false
		r.d.event(r.ctx, EventLayerResume, attribute.Int64("oci.layer.offset", off), attribute.Int64("oci.layer.skipped", off-start),
			attribute.Int("oci.layer.connection", s.index))
	}
	whole := start < off
	bodyEnd := end
	if whole {
		bodyEnd = size
	}
	r.d.gate.flow(1, firstByte)
	defer r.d.gate.flow(-1, 0)
	return r.walk(s, body, start, bodyEnd, whole)
}

// walk writes body, whose first byte is the blob's byte pos and whose end
// is bodyEnd, at the bytes s claims, claiming more as it goes.
func (r *blobRun) walk(s *stream, body io.Reader, pos, bodyEnd int64, whole bool) (int64, error) {
	var wrote int64
	for pos < bodyEnd {
		if s.claim.Len() > 0 && s.claim.Off == pos {
			n, err := r.d.store.FillAt(r.ctx, r.p, body, pos, min(s.claim.End, bodyEnd)-pos, r.d.tracker.add)
			wrote += n
			pos += n
			s.claim.Off = pos
			if err == io.EOF {
				err = r.shortBody(pos, bodyEnd)
			}
			if err != nil {
				return wrote, err
			}
			if s.claim.Len() == 0 {
				r.d.event(r.ctx, EventLayerChunk, attribute.Int64("oci.layer.offset", s.chunk.Off),
					attribute.Int64("oci.layer.length", s.chunk.Len()), attribute.Int("oci.layer.connection", s.index))
			}
			continue
		}
		act, to, wait := r.next(s, pos, bodyEnd, whole)
		switch act {
		case walkWrite:
			continue
		case walkSkip:
			if _, err := io.CopyN(io.Discard, body, to-pos); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return wrote, fmt.Errorf("skip the %d bytes already received: %w", to-pos, err)
			}
			pos = to
		case walkWait:
			select {
			case <-wait:
			case <-r.ctx.Done():
				return wrote, context.Cause(r.ctx)
			}
		case walkStop:
			return wrote, nil
		}
	}
	return wrote, checkBodyEnd(body, bodyEnd == r.p.Size(), r.p.Size())
}

// next decides what s does at byte pos, which it has not claimed: claim
// it when free; else skip to the next free byte (or s's own claim) when
// the body is served whole; wait for the verdict on ranges when another
// stream's first ranged request is out; otherwise end the request.
func (r *blobRun) next(s *stream, pos, bodyEnd int64, whole bool) (walkAction, int64, <-chan struct{}) {
	rate, ttfb := r.d.gate.streamRate()
	r.mu.Lock()
	if c, ok := r.plan.claimAt(pos, r.d.chunks.size(r.plan.left(), r.running, rate, ttfb)); ok {
		if s.claim.Len() > 0 {
			// A body served whole passes free bytes before the claim its
			// request was for: that claim is free again until reached.
			r.plan.giveBack(s.claim)
			r.notifyLocked()
		}
		s.claim, s.chunk = c, c
		r.mu.Unlock()
		r.d.gate.poke()
		return walkWrite, 0, nil
	}
	defer r.mu.Unlock()
	nf, free := r.plan.nextFree(pos)
	switch {
	case whole || r.ranges == rangesRefused:
		to := bodyEnd
		if free {
			to = min(to, nf)
		}
		if s.claim.Len() > 0 && s.claim.Off > pos {
			to = min(to, s.claim.Off)
		}
		if to >= bodyEnd {
			return walkStop, 0, nil
		}
		return walkSkip, to, nil
	case r.ranges == rangesUnknown && r.running > 1:
		return walkWait, 0, r.changed
	}
	return walkStop, 0, nil
}

// shortBody is the error of a body that ended, without an error of its
// own, at pos before bodyEnd: one that should have run to the end of the
// blob brought fewer bytes than the manifest says (a digest mismatch, as
// such a body always was); a chunk is continued from where it stopped.
func (r *blobRun) shortBody(pos, bodyEnd int64) error {
	if bodyEnd == r.p.Size() {
		return fmt.Errorf("%w: expected %d bytes, the body ended after %d", ErrDigestMismatch, r.p.Size(), pos)
	}
	return fmt.Errorf("the body of bytes up to %d ended at %d: %w", bodyEnd-1, pos, io.ErrUnexpectedEOF)
}

// setRanges records what an answer to a Range request told.
func (r *blobRun) setRanges(served bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := rangesServed
	if !served {
		v = rangesRefused
	}
	if r.ranges != v && r.ranges != rangesRefused {
		r.ranges = v
		r.notifyLocked()
	}
}

// checkBodyEnd reads past the bytes a body was asked for: a place sending
// more fails, past the blob's size with ErrDigestMismatch as a body too
// long for the manifest always did.
func checkBodyEnd(body io.Reader, toSize bool, size int64) error {
	var one [1]byte
	n, _ := body.Read(one[:])
	if n == 0 {
		return nil
	}
	if toSize {
		return fmt.Errorf("%w: expected %d bytes, got more", ErrDigestMismatch, size)
	}
	return errors.New("the registry sent more bytes than the range asked for")
}
