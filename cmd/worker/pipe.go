package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/silt-dev/silt/pkg/stream"
)

// The co-process protocol (docs/pipe.md): silt starts CMD once and writes
// one delivery per line, as JSON, on its stdin; CMD answers one result per
// line on its stdout, in any order, with up to --concurrency deliveries in
// flight:
//
//	{"id":"EVT_...","ok":true}
//	{"id":"EVT_...","ok":false,"error":"why"}                    left pending, retried
//	{"id":"EVT_...","ok":false,"error":"why","permanent":true}   dead-lettered now
//
// A malformed line, a result for an id not in flight, an exit, or no result
// within --handler-timeout ends that co-process: every delivery in flight
// fails (left pending; the attempt counts) and the next delivery starts a new
// one, at most --pipe-restarts times in a run; then the run stops with an
// error rather than fail every entry against a broken handler.

// ErrPipe is wrapped by the error that stops a run whose co-process cannot
// be kept running.
var ErrPipe = errors.New("co-process handler failed")

// pipeResult is one line of the co-process's stdout.
type pipeResult struct {
	ID        string `json:"id"`
	OK        *bool  `json:"ok"`
	Error     string `json:"error,omitempty"`
	Permanent bool   `json:"permanent,omitempty"`
}

// maxResultLine bounds a result line (an error message is plenty below).
const maxResultLine = 64 << 10

// pipeHandler keeps one co-process for the run.
type pipeHandler struct {
	argv    []string
	env     []string
	timeout time.Duration
	// startTimeout is how long a co-process may take to start before its
	// deliveries' timeout runs (--pipe-start-timeout; watch).
	startTimeout time.Duration
	restarts     int
	secrets      masker
	log          *slog.Logger
	stop         func(error) // ends the run when restarts are spent
	inFlight     int         // the most deliveries in flight at once (--concurrency); 0: many

	cur atomic.Pointer[coproc] // the last co-process started: set under mu, read without it

	mu      sync.Mutex
	starts  int
	spent   error
	stopped bool

	gate admission
}

// admission holds the run's workers while the co-process has not answered
// yet: one delivery (the probe) goes to it, the others wait for its first
// answer or its end. A co-process still starting (an interpreter loading
// its libraries: tens of ms for node) only queues what it is sent, and
// each delivery's start is counted as it is sent: a worker killed then
// counted up to --concurrency starts for entries no handler ever read.
type admission struct {
	mu      sync.Mutex
	probing bool          // a delivery is in flight to a co-process that has not answered
	wake    chan struct{} // closed when probing ends
}

// admit is stream.Consumer.Admit: at once while the live co-process has
// answered; otherwise as the probe, or once the probe's co-process
// answered or ended.
func (p *pipeHandler) admit(ctx context.Context) error {
	for {
		if cp := p.cur.Load(); cp != nil && cp.answered() && !cp.over() {
			return nil
		}
		g := &p.gate
		g.mu.Lock()
		if !g.probing {
			g.probing = true
			g.mu.Unlock()
			return nil
		}
		if g.wake == nil {
			g.wake = make(chan struct{})
		}
		wake := g.wake
		g.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// release ends the probe: its co-process answered or ended, or it never
// reached one.
func (g *admission) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing = false
	if g.wake != nil {
		close(g.wake)
		g.wake = nil
	}
}

func newPipeHandler(argv []string, timeout time.Duration, restarts int, env []string, secrets masker, log *slog.Logger, stop func(error)) *pipeHandler {
	return &pipeHandler{argv: argv, env: env, timeout: timeout, restarts: restarts, secrets: secrets, log: log, stop: stop}
}

// coproc is one running co-process.
//
// Its stdout is read by whoever holds the turn: a reader goroutine, for
// the run's life, when more than one delivery can be in flight; with one
// (--concurrency 1), the delivery itself, which writes its line and reads
// its answer with no other goroutine woken between (a reader handing the
// answer over cost about a fifth of that path's time). The reader hands each
// result to its delivery's channel. After the exit, the rest of stdout is
// read by the goroutine that waited for it.
type coproc struct {
	cmd    *exec.Cmd
	in     input
	out    *os.File      // its stdout, read by whoever holds turn; end sets a past deadline on it
	rd     *bufio.Reader // out's lines
	turn   chan struct{} // capacity 1: taking its token gives the right to read
	reader bool          // a goroutine reads stdout: deliveries wait on their channels only

	exited  chan struct{} // closed once Wait returned, exitErr set
	exitErr error

	mu      sync.Mutex
	waiting map[string]pending // taken out by whoever sends its result: a reader, or end
	dead    chan struct{}      // closed once it is over
	why     error

	started     time.Time
	firstLine   atomic.Int64  // when the first line came on its stdout, in ns after started; 0: none yet
	firstAnswer chan struct{} // closed once firstLine is set
	gate        *admission    // its handler's: released at its first answer and at its end
	silent      sync.Once     // the buffering warning, given once
}

// pending is a delivery in flight: where its result goes and when it was
// sent.
type pending struct {
	result chan pipeResult
	sent   time.Time
}

// silenceWarn is how long a co-process may sit on its first delivery
// without a line on stdout before the worker warns that it may be
// buffering its output (the usual cause), instead of waiting out
// --handler-timeout in silence.
var silenceWarn = 3 * time.Second

// handle is the stream.Handler.
func (p *pipeHandler) handle(ctx context.Context, d stream.Delivery) error {
	doc := deliveryDocOf(d)
	doc.Traceparent = traceparentOf(ctx)
	line := appendDelivery(make([]byte, 0, 256), doc)
	cp, err := p.running()
	if err != nil {
		p.gate.release() // sent nothing: the next may try
		return err
	}
	id := doc.ID
	ch := resultChans.Get().(chan pipeResult)
	cp.mu.Lock()
	if cp.why != nil { // ended since running(): its waiters were told already
		cp.mu.Unlock()
		resultChans.Put(ch)
		p.gate.release()
		return fmt.Errorf("co-process: %w", cp.cause())
	}
	if _, dup := cp.waiting[id]; dup {
		cp.mu.Unlock()
		resultChans.Put(ch)
		p.gate.release()
		return fmt.Errorf("co-process: %s is already in flight", id)
	}
	cp.waiting[id] = pending{result: ch, sent: time.Now()}
	cp.mu.Unlock()
	if err := cp.in.send(append(line, '\n')); err != nil {
		cp.end(fmt.Errorf("writing to its stdin: %w", err)) // answers ch below, with no verdict
	}
	if !cp.answered() && (p.timeout <= 0 || p.startTimeout+p.timeout > silenceWarn) {
		// --handler-timeout is kept by cp.watch, one timer for all in flight
		t := time.AfterFunc(silenceWarn, func() { p.warnSilent(cp, id) })
		defer t.Stop()
	}
	var r pipeResult
	if cp.reader {
		select {
		case r = <-ch:
		case <-ctx.Done():
			cp.graceOver(ctx, id) // answers ch
			r = <-ch
		}
	} else {
		// wakes a read of stdout, with its past deadline
		defer context.AfterFunc(ctx, func() { cp.graceOver(ctx, id) })()
		select {
		case r = <-ch:
		case <-cp.turn:
			select {
			case r = <-ch: // the last reader handed it over
			default:
				var ours bool
				r, ours = cp.readUntil(id)
				if !ours {
					ch = nil // end sent on it too, or will: not reused
				}
			}
			cp.turn <- struct{}{}
		}
	}
	if ch != nil {
		// Its sender took it out of waiting: nothing else will send on ch,
		// which serves the next delivery.
		resultChans.Put(ch)
	}
	switch {
	case r.OK == nil: // the co-process is over (end)
		return fmt.Errorf("co-process: %w", cp.cause())
	case *r.OK:
		return nil
	case r.Permanent:
		return stream.Permanent(fmt.Errorf("co-process: %s", p.secrets.mask(r.Error)))
	}
	return fmt.Errorf("co-process: %s", p.secrets.mask(r.Error))
}

// graceOver ends the co-process once the run has stopped waiting for its
// handlers (ctx, a delivery's, is cancelled past the grace the run gives
// them) with what it has in flight, as an exec handler's process group is
// killed.
func (cp *coproc) graceOver(ctx context.Context, id string) {
	cp.end(fmt.Errorf("the run stopped waiting for %s: %w", id, context.Cause(ctx)))
}

// warnSilent warns, once per co-process, that it has answered nothing yet.
func (p *pipeHandler) warnSilent(cp *coproc, id string) {
	if cp.answered() || cp.over() {
		return
	}
	cp.silent.Do(func() {
		p.log.Warn(fmt.Sprintf("the co-process has answered nothing on its stdout %s after its first delivery: if it buffers its output, "+
			"flush each result line (Python: print(..., flush=True) or python3 -u; Node: write each line with process.stdout.write; "+
			"C: fflush or setvbuf); stdout carries result lines only, logs go to stderr. Until its first answer it is sent one delivery: "+
			"answer each line as it is done, not after a batch of several (docs/pipe.md). Waiting up to --pipe-start-timeout %s "+
			"and then --handler-timeout %s", silenceWarn, p.startTimeout, p.timeout), "id", id)
	})
}

// resultChans holds the channels a delivery's result comes on, one per
// delivery in flight, reused once their one result is taken.
var resultChans = sync.Pool{New: func() any { return make(chan pipeResult, 1) }}

// running returns the live co-process, starting one when there is none, at
// most 1 + restarts times in a run.
func (p *pipeHandler) running() (*coproc, error) {
	if cp := p.cur.Load(); cp != nil && !cp.over() {
		return cp, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	last := p.cur.Load()
	if last != nil && !last.over() {
		return last, nil
	}
	if p.spent != nil {
		return nil, p.spent
	}
	if p.stopped {
		return nil, fmt.Errorf("co-process: the run is ending")
	}
	if p.starts > p.restarts {
		p.spent = fmt.Errorf("%w: started %d times in this run (--pipe-restarts %d), the last ended: %v", ErrPipe, p.starts, p.restarts, last.cause())
		p.stop(p.spent)
		return nil, p.spent
	}
	if last != nil {
		p.log.Warn("restarting the co-process handler", "after", last.cause().Error(), "restart", p.starts, "of", p.restarts)
	}
	cp, err := p.start()
	if err != nil {
		p.spent = fmt.Errorf("%w: start %s: %v", ErrPipe, p.argv[0], err)
		p.stop(p.spent)
		return nil, p.spent
	}
	p.starts++
	p.cur.Store(cp)
	return cp, nil
}

func (p *pipeHandler) start() (*coproc, error) {
	cmd := exec.CommandContext(context.Background(), p.argv[0], p.argv[1:]...) // Cancel (ownGroup) is called by end
	cmd.Env = p.env
	cmd.WaitDelay = time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// Its stdout is a pipe of our own, not cmd.StdoutPipe: Wait would close
	// that one at the exit, under a delivery still reading its last lines.
	out, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = w
	stderr, err := cmd.StderrPipe()
	if err != nil {
		out.Close()
		w.Close()
		return nil, err
	}
	started := time.Now()
	release, err := startOwned(cmd)
	w.Close() // the co-process holds the write end now
	if err != nil {
		out.Close()
		return nil, err
	}
	cp := &coproc{
		cmd: cmd, in: input{w: stdin, burst: p.inFlight != 1}, reader: p.inFlight != 1,
		out: out, rd: bufio.NewReaderSize(out, maxResultLine), turn: make(chan struct{}, 1),
		exited: make(chan struct{}), waiting: map[string]pending{}, dead: make(chan struct{}), started: started,
		firstAnswer: make(chan struct{}), gate: &p.gate,
	}
	if cp.reader {
		go func() {
			cp.readUntil("")
			cp.turn <- struct{}{}
		}()
	} else {
		cp.turn <- struct{}{}
	}
	if p.timeout > 0 {
		go cp.watch(p.timeout, p.startTimeout)
	}
	go p.logStderr(stderr)
	go func() {
		err := cmd.Wait()
		if err != nil {
			cp.exitErr = fmt.Errorf("it exited: %v", err)
		} else {
			cp.exitErr = errors.New("it exited (status 0)")
		}
		close(cp.exited)
		release()
		// What it answered before it exited still goes to its deliveries:
		// read the rest of its stdout, then it is over.
		<-cp.turn
		cp.readUntil("")
		cp.end(cp.exitErr)
		cp.turn <- struct{}{}
		out.Close()
	}()
	return cp, nil
}

// readUntil reads result lines, each handed to its delivery, until the
// one for own (ours: true), or until the co-process is over (a result of
// no verdict). Its caller holds the turn; own is "" to read to the end.
func (cp *coproc) readUntil(own string) (r pipeResult, ours bool) {
	for {
		line, err := cp.rd.ReadSlice('\n')
		if len(line) > 0 && (err == nil || err == io.EOF) {
			if !cp.answered() { // only the turn's holder reads: one first line
				cp.firstLine.Store(max(int64(time.Since(cp.started)), 1))
				close(cp.firstAnswer)
				cp.gate.release()
			}
			line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
			r, perr := parseResult(line)
			if perr != nil || r.ID == "" || r.OK == nil {
				cp.end(fmt.Errorf("malformed result line %s: want {\"id\":...,\"ok\":true|false}", quoteShort(string(line))))
				return pipeResult{}, false
			}
			cp.mu.Lock()
			pd, inFlight := cp.waiting[r.ID]
			delete(cp.waiting, r.ID)
			cp.mu.Unlock()
			switch {
			case r.ID == own:
				// Its own answer stands even if the co-process ended since
				// (end has sent its channel a result of no verdict then).
				return r, inFlight
			case !inFlight:
				cp.end(fmt.Errorf("a result for %s, which is not in flight", quoteShort(r.ID)))
				return pipeResult{}, false
			}
			pd.result <- r
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, bufio.ErrBufferFull):
			cp.end(fmt.Errorf("malformed result line: longer than %d bytes, beginning %s", maxResultLine, quoteShort(string(line))))
		case err == io.EOF: // its stdout is closed: it exited, or is exiting
			select {
			case <-cp.exited:
				cp.end(cp.exitErr)
			case <-cp.dead:
			}
		case !cp.over(): // not end's deadline
			cp.end(fmt.Errorf("reading its stdout: %w", err))
		}
		return pipeResult{}, false
	}
}

func (p *pipeHandler) logStderr(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); s != "" {
			p.log.Info("co-process stderr", "stderr", p.secrets.mask(s))
		}
	}
}

// close ends the co-process at the end of the run: stdin closed (its cue to
// exit), then killed after grace.
func (p *pipeHandler) close(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	cp := p.cur.Load()
	p.mu.Unlock()
	if cp == nil || cp.over() {
		return
	}
	cp.in.close()
	select {
	case <-cp.dead:
	case <-time.After(grace):
		cp.end(errors.New("still running after --grace at the end of the run"))
	}
}

// watch ends the co-process once a delivery has waited timeout for its
// result. One timer serves every delivery in flight: it is set to the
// oldest one's deadline (the timeout from now when none is in flight, which
// is no later than any delivery sent after).
//
// The co-process's own start is not its deliveries' time: a delivery
// written before the co-process was ready waits from when it was (ready),
// so an interpreter that takes seconds to load does not spend the first
// deliveries' timeout. One that answers nothing at all is still ended,
// start plus timeout after it started.
func (cp *coproc) watch(timeout, start time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	first := cp.firstAnswer // its first answer brings ready nearer
	for {
		select {
		case <-cp.dead:
			return
		case <-first:
			first = nil
			t.Stop() // no stale tick after Stop (Go 1.23's timers): Reset below
		case <-t.C:
		}
		id, sent := cp.oldest()
		if id == "" {
			t.Reset(timeout)
			continue
		}
		from := sent
		if ready := cp.ready(start); ready.After(from) {
			from = ready
		}
		if waited := time.Since(from); waited < timeout {
			t.Reset(timeout - waited)
			continue
		}
		hint := "hung?"
		if !cp.answered() {
			hint = fmt.Sprintf("it answered nothing in the %s since it started (--pipe-start-timeout %s, then --handler-timeout): "+
				"hung, buffering its stdout, or waiting for more lines than the one it is sent before its first answer? (docs/pipe.md)",
				time.Since(cp.started).Round(time.Millisecond), start)
		}
		cp.end(fmt.Errorf("no result for %s within --handler-timeout %s (%s)", id, timeout, hint))
		return
	}
}

// ready is when the co-process could first take a delivery: its first
// answer, or start after it started if it has not answered by then.
func (cp *coproc) ready(start time.Duration) time.Time {
	if cp.answered() {
		start = min(start, time.Duration(cp.firstLine.Load()))
	}
	return cp.started.Add(start)
}

// answered says whether a line has come on its stdout.
func (cp *coproc) answered() bool { return cp.firstLine.Load() != 0 }

// oldest returns the delivery in flight the longest and when it was sent;
// "" when none is.
func (cp *coproc) oldest() (id string, sent time.Time) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for k, pd := range cp.waiting {
		if id == "" || pd.sent.Before(sent) {
			id, sent = k, pd.sent
		}
	}
	return id, sent
}

// input is the co-process's standard input, written by the handlers
// themselves, with no goroutine between a delivery and its write: the
// first to send while no one writes is the writer, and writes what is
// queued until nothing is, the lines the others queued meanwhile in one
// write. A write that blocks (a co-process that does not read) holds its
// handler until the co-process ends (--handler-timeout, the run's end):
// its process group is killed, and the write fails.
type input struct {
	w     io.WriteCloser
	burst bool // more than one delivery can be in flight

	mu      sync.Mutex
	queued  []byte // lines waiting for the writer
	spare   []byte // the buffer of the last write, for the next queue
	writing bool
	closed  bool
}

// send writes line, or queues it for the handler writing now. An error
// is the write's that carried it.
func (in *input) send(line []byte) error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return os.ErrClosed
	}
	in.queued = append(in.queued, line...)
	if in.writing {
		in.mu.Unlock()
		return nil
	}
	in.writing = true
	if in.burst {
		// The handlers a read batch woke are runnable now: yielding once
		// lets them queue their lines, so one write (and one wake of the
		// co-process) carries the burst rather than a line. With one
		// delivery in flight there is none to wait for (the yield cost
		// about 8% of --concurrency 1's rate).
		in.mu.Unlock()
		runtime.Gosched()
		in.mu.Lock()
	}
	for len(in.queued) > 0 {
		b := in.queued
		in.queued = in.spare[:0]
		in.mu.Unlock()
		_, err := in.w.Write(b)
		in.mu.Lock()
		in.spare = b
		if err != nil {
			in.queued = in.queued[:0] // their co-process is over: their handlers see it end
			in.writing = false
			in.mu.Unlock()
			return err
		}
	}
	in.writing = false
	in.mu.Unlock()
	return nil
}

// close closes stdin (the co-process's cue to exit); a write in progress
// fails.
func (in *input) close() {
	in.mu.Lock()
	in.closed = true
	in.mu.Unlock()
	in.w.Close()
}

// end records why the co-process is over, kills its process group and
// wakes every delivery waiting on it with a result of no verdict. Only the
// first reason is kept.
func (cp *coproc) end(why error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.why != nil {
		return
	}
	cp.why = why
	defer cp.gate.release()
	if cp.cmd.Cancel != nil {
		cp.cmd.Cancel() // the whole group
	}
	close(cp.dead)
	cp.out.SetReadDeadline(time.Unix(1, 0)) // a delivery reading its stdout stops now
	for id, pd := range cp.waiting {
		delete(cp.waiting, id)
		pd.result <- pipeResult{} // no OK: over
	}
}

func (cp *coproc) over() bool {
	select {
	case <-cp.dead:
		return true
	default:
		return false
	}
}

func (cp *coproc) cause() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.why
}

// quoteShort quotes s, cut to 200 bytes.
func quoteShort(s string) string {
	if len(s) > 200 {
		return fmt.Sprintf("%q...", s[:200])
	}
	return fmt.Sprintf("%q", s)
}
