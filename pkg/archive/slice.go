package archive

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/graft"
	"github.com/silt-dev/silt/pkg/stream"
)

// Policy is the retention boundary: what stays live. At least one is set;
// with both, an entry is archived only when both allow it.
type Policy struct {
	KeepLast int64         // keep the newest N entries live (0: not set)
	KeepFor  time.Duration // keep entries younger than D live (0: not set)
}

// ErrNoPolicy: a run needs a retention policy.
var ErrNoPolicy = errors.New("no retention policy: set Policy.KeepLast or Policy.KeepFor")

// Result is what one Run did.
type Result struct {
	Archived  int64  `json:"archived"`  // records committed by this run
	Commits   int64  `json:"commits"`   // commits this run created
	Bytes     int64  `json:"bytes"`     // record bytes committed by this run
	Malformed int64  `json:"malformed"` // of Archived, entries with a bad id, archived as they are
	Trimmed   int64  `json:"trimmed"`   // entries XTRIM removed
	LostRaces int64  `json:"lost_races"`
	W         string `json:"w"` // the watermark after the run
	LSN       uint64 `json:"lsn"`
	// Pruned counts the archived segments the run's history retention
	// dropped (Archive.HistoryKeepFor).
	Pruned int `json:"pruned,omitempty"`
	// KeptUnarchived counts the live entries at or below the watermark
	// that the archive lacks (or holds with other fields), which the run
	// kept live instead of trimming: written on another Redis node than
	// the one that committed (a failover, a split brain) or below a
	// restored or forged record. FirstKept is the lowest; no trim of the
	// run reached it. The run's error then wraps ErrKeptUnarchived.
	KeptUnarchived int64  `json:"kept_unarchived,omitempty"`
	FirstKept      string `json:"first_kept,omitempty"`
	// RetriedForgotten counts, in an archive of dead letters, the records
	// of dead letters retried with success forgotten because the history
	// retention dropped them (stream.Log.ForgetRetried).
	RetriedForgotten int `json:"retried_forgotten,omitempty"`
	// Compacted is what the run's compaction did (nil: none was due).
	Compacted  *graft.CompactResult `json:"compacted,omitempty"`
	Elapsed    time.Duration        `json:"-"`
	ElapsedSec float64              `json:"elapsed_seconds"`
}

// Progress, when set, is called after each commit with the run's result so far.
type Progress func(Result)

// Run archives what the policy says need not stay live, slice by slice:
// fold, commit behind the fence, then trim below the new watermark. It
// never trims above what is committed. A lost commit race adopts the
// winner's watermark and goes on from there.
func (a *Archive) Run(ctx context.Context, p Policy, progress Progress) (res Result, err error) {
	start := time.Now()
	defer func() { res.Elapsed = time.Since(start); res.ElapsedSec = res.Elapsed.Seconds() }()
	if p.KeepLast <= 0 && p.KeepFor <= 0 {
		return res, ErrNoPolicy
	}
	looked := a.justOpened()
	a.holds = holds{node: a.log.Node(ctx)}
	defer func() {
		res.KeptUnarchived, res.FirstKept = a.holds.kept, a.holds.first()
		if err == nil && res.KeptUnarchived > 0 {
			err = fmt.Errorf("archive %s: %d live entries at or below W %s are not in the archive (the lowest %s): %w, and no trim reached them; "+
				"another Redis node wrote them (a failover, a split brain) or Redis's record of the archive was restored or forged (docs/operations.md, \"After a failover\")",
				a.log.Key(), res.KeptUnarchived, a.proven, res.FirstKept, ErrKeptUnarchived)
		}
	}()
	// One run archives up to the stream's top as it is now; what producers
	// append meanwhile waits for the next run, so a run always ends.
	info, err := a.log.Info(ctx)
	if err != nil {
		return res, err
	}
	top, err := brand.ParseStreamID(info.LastGeneratedID)
	if err != nil && info.LastGeneratedID != "" {
		return res, fmt.Errorf("archive %s: last-generated-id: %w", a.log.Key(), err)
	}
	// One fold reads at a time: the run's folds share a reader.
	a.flat = a.log.FlatReader()
	defer func() { a.flat.Close(); a.flat = nil }()
	// The first slice is folded while the remote is refreshed and proven
	// (a round trip to the remote, unless the open has just made it, and
	// reads of Redis's record), from the state this volume held before:
	// the refresh rarely moves it. It only reads the stream;
	// if the remote is refused, it is dropped, and if the refresh found
	// commits this volume had not seen (a peer's), it is folded again
	// after them.
	early := a.foldEarly(ctx, p, top)
	defer early.stop()
	if !looked {
		if err := a.vol.Refresh(ctx); err != nil {
			return res, err
		}
	}
	if err := a.checkIdentity(ctx); err != nil {
		return res, err
	}
	var st state
	if st, err = stateOf(a.vol.Latest()); err != nil {
		return res, err
	}
	// The early fold is done before anything is trimmed: a fold never
	// counts live entries while a trim removes them.
	f, foldedEarly := early.take(st)
	// A crash between commit and trim leaves archived entries live: trim
	// them, up to what the proof reached.
	trimmed, err := a.trim(ctx, &res)
	if err != nil {
		a.arenas.put(f.blocks)
		return res, err
	}
	// A volume written before checkpoints gets its first one here.
	if _, err := a.vol.Checkpoint(ctx, false); err != nil {
		a.arenas.put(f.blocks)
		return res, fmt.Errorf("archive %s: %w", a.log.Key(), err)
	}
	// Three slices are in the works at once: the next one is read and
	// encoded while this one is created on the remote, and the one before
	// is proven (read back from the remote and recorded in Redis) beside
	// both. A fold (Redis reads, encoding), a create (hashing, the remote's
	// round trips, local copies) and a proof overlap; creates and proofs
	// keep LSN order. A slice is trimmed once proven, after the fold and
	// the create beside its proof and before the next fold starts, so a
	// fold never counts live entries while a trim removes them. Under
	// KeepLast, a slice carries the count of live entries at or below its
	// watermark (folded.live) to the fold after it, which would otherwise
	// read them all again: each fold adds its entries, each trim takes off
	// what it removed. The count is trusted while the stream says no one
	// else removed an entry since it was taken (archivable).
	var proving *proof // the slice created last, being proven
	defer func() {     // no proof outlives its run
		if proving != nil {
			<-proving.done
		}
	}()
	if foldedEarly {
		err = f.err
		f.live = f.live.trimmed(trimmed)
	} else {
		f, err = a.fold(ctx, p, st, top, uncounted)
	}
	for err == nil && ctx.Err() == nil && len(f.pages) > 0 {
		ahead := make(chan folded, 1)
		go func(after state, live liveBelow) {
			nf, err := a.fold(ctx, p, after, top, live)
			nf.err = err
			ahead <- nf
		}(f.next, f.live)
		c, next, cerr := a.create(ctx, st, f, &res)
		nf := <-ahead // no fold outlives its run
		// The create copied f's pages out: the fold after next cuts its
		// pages from f's blocks.
		a.arenas.put(f.blocks)
		trimmed, serr := a.settle(ctx, proving, &res, progress)
		proving = nil
		if err := cmp.Or(serr, cerr); err != nil {
			return res, err
		}
		if c != nil {
			proving = a.startProof(ctx, c, st, f)
		}
		won := next == f.next
		st = next
		if !won { // the slice folded ahead assumed our commit: fold after the winner's
			a.arenas.put(nf.blocks)
			f, err = a.fold(ctx, p, st, top, uncounted)
			continue
		}
		f, err = nf, nf.err
		f.live = f.live.trimmed(trimmed)
	}
	a.arenas.drop() // what follows (compaction, the next run) keeps no slice's blocks
	_, serr := a.settle(ctx, proving, &res, progress)
	proving = nil
	if err := cmp.Or(err, ctx.Err(), serr); err != nil {
		return res, err
	}
	if err := a.compact(ctx, &res); err != nil {
		return res, err
	}
	return res, a.prune(ctx, &res)
}

// earlyFold is the run's first slice, folded while the remote is refreshed
// and proven, from the state the volume held before (foldEarly).
type earlyFold struct {
	a        *Archive
	from     state       // the state the fold started from
	cancel   func()      // stops the fold
	out      chan folded // the fold, once done; nil: none was started
	f        folded      // the fold, once received
	received bool
}

// foldEarly starts folding the run's first slice from the state the
// volume holds now, before the refresh. No fold is started when the
// volume's newest commit does not parse (the run's proof says why).
func (a *Archive) foldEarly(ctx context.Context, p Policy, top brand.StreamID) *earlyFold {
	e := &earlyFold{a: a, cancel: func() {}}
	from, err := stateOf(a.vol.Latest())
	if err != nil {
		return e
	}
	ctx, e.cancel = context.WithCancel(ctx)
	e.from, e.out = from, make(chan folded, 1)
	go func() {
		f, err := a.fold(ctx, p, from, top, uncounted)
		f.err = err
		e.out <- f
	}()
	return e
}

// receive waits for the fold, once.
func (e *earlyFold) receive() {
	if !e.received {
		e.f, e.received = <-e.out, true
	}
}

// take waits for the fold and returns it if st, the state the run proved,
// is the one it started from. Otherwise, or when no fold was started, it
// returns false, with the fold's blocks given back.
func (e *earlyFold) take(st state) (folded, bool) {
	if e.out == nil {
		return folded{}, false
	}
	e.receive()
	if st != e.from {
		e.a.arenas.put(e.f.blocks)
		return folded{}, false
	}
	return e.f, true
}

// stop cancels a fold not taken and waits for it: no fold outlives its run.
func (e *earlyFold) stop() {
	e.cancel()
	if e.out != nil && !e.received {
		e.receive()
		e.a.arenas.put(e.f.blocks)
	}
}

// compact merges small segments after a run's slices, a bounded amount
// per run (Archive.Compaction).
func (a *Archive) compact(ctx context.Context, res *Result) error {
	if a.NoCompact {
		return nil
	}
	opt := a.Compaction
	opt.Current = true // refreshed when the run began, moved on by its commits
	c, err := a.vol.Compact(ctx, opt)
	if err != nil {
		return fmt.Errorf("archive %s: %w", a.log.Key(), err)
	}
	if c.Segments > 0 {
		res.Compacted, res.LSN = &c, a.vol.Head()
	}
	return a.recordHead(ctx)
}

// prune drops the archived segments whose entries are all older than
// HistoryKeepFor: everything below the first segment whose watermark is at
// or after the cutoff.
func (a *Archive) prune(ctx context.Context, res *Result) error {
	if a.HistoryKeepFor <= 0 {
		return nil
	}
	cutoff := brand.WindowStart(time.Now().Add(-a.HistoryKeepFor))
	below := uint64(0)
	var werr error
	for c, err := range a.vol.Entries(ctx, func(meta map[string]string) bool {
		w, err := brand.ParseStreamID(meta[metaW])
		if err != nil {
			werr = err
			return false
		}
		return w.Compare(cutoff) < 0
	}) {
		if err == nil {
			err = werr
		}
		if err != nil {
			return fmt.Errorf("archive %s: history retention: %w", a.log.Key(), err)
		}
		below = c.Ranges[0].Lo
		break
	}
	if below == 0 { // every segment is older: all of them go
		st, err := stateOf(a.vol.Latest())
		if err != nil {
			return err
		}
		below = RecordBase + st.NextPage
	}
	n, err := a.vol.Prune(ctx, below)
	if graft.IsConflict(err) {
		return nil // another writer moved on; the next run prunes
	}
	if err != nil {
		return fmt.Errorf("archive %s: history retention: %w", a.log.Key(), err)
	}
	res.Pruned = n
	if err := a.recordHead(ctx); err != nil {
		return err
	}
	return a.forgetRetried(ctx, res)
}

// forgetRetried removes, for an archive of dead letters, the record of
// those retried with success that its history retention has dropped
// (stream.Log.ForgetRetried): the record guards a dead letter the archive
// still holds, and grows by one each retry. It runs each time the history
// retention does, so a run that failed here is made good by the next.
func (a *Archive) forgetRetried(ctx context.Context, res *Result) error {
	if a.log.DeadGroup() == "" {
		return nil
	}
	n, err := a.log.ForgetRetried(ctx, func(ctx context.Context) (brand.StreamID, error) {
		for item, err := range a.Read(ctx, stream.First, stream.Last) {
			if err != nil && !errors.Is(err, stream.ErrMalformed) { // a malformed one is kept all the same
				return brand.StreamID{}, fmt.Errorf("the oldest dead letter kept: %w", err)
			}
			return item.StreamID, nil
		}
		return stream.Last, nil // none is kept: none can be asked for again
	})
	res.RetriedForgotten = n
	if err != nil {
		return fmt.Errorf("archive %s: history retention: %w", a.log.Key(), err)
	}
	return nil
}

// Compact merges small segments of the archive (see graft.Volume.Compact):
// `archiver compact`. After CheckRemote, the compaction's commit is
// recorded in Redis as the anchor.
func (a *Archive) Compact(ctx context.Context, opt graft.CompactOptions) (graft.CompactResult, error) {
	c, err := a.vol.Compact(ctx, opt)
	if err != nil {
		return c, err
	}
	return c, a.recordHead(ctx)
}

// readChunk is how many entries one XRANGE of a fold asks for. A slice is
// read chunk by chunk, each chunk encoded into record pages while the next
// is read, so a run holds two chunks of decoded entries, not a slice.
const readChunk = 1000

// folded is one slice, encoded: the record pages of the entries after W
// that the policy lets go, at most SliceEntries and about SliceBytes.
type folded struct {
	pages []graft.Page
	first brand.StreamID // the stream id of pages[0]
	next  state          // the state once committed
	bytes int64          // record bytes
	live  liveBelow      // live entries at or below next.W when folded
	err   error          // of a fold run ahead

	arena  []byte   // the block the next record pages are cut from
	blocks [][]byte // every block its pages are cut from, arena's too
	order  []int    // scratch for appendRecord
}

// arenaBlock is the size of the blocks record pages are cut from: one
// allocation per block instead of one per record.
const arenaBlock = 256 << 10

// arenas keeps the arena blocks of a created slice for a later fold. A
// run's folds then cut their pages from memory already in use, not from
// memory new to the process, which the kernel faults in page by page as
// it is first written (laying out the 570 KB segment of 5,000 entries
// took 1.7-2.8 ms into new memory on a two-core VM, 0.15 ms into memory in
// use; the records' blocks are as large). The blocks of at most one slice
// are kept, and only while a run's slices are folded: a compaction after
// them has the memory. A record too large for a block gets a block of its
// own, which is not kept.
type arenas struct {
	mu        sync.Mutex
	free      [][]byte
	got, made int // blocks handed out, and of those made new
}

// get returns an empty block of arenaBlock bytes, or of need bytes when
// need is larger.
func (p *arenas) get(need int) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got++
	if n := len(p.free); n > 0 && need <= arenaBlock {
		b := p.free[n-1]
		p.free = p.free[:n-1]
		return b[:0]
	}
	p.made++
	return make([]byte, 0, max(arenaBlock, need))
}

// put keeps blocks for a later get. Nothing cut from them may be in use:
// the slice they hold was created (or its create failed).
func (p *arenas) put(blocks [][]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range blocks {
		if cap(b) == arenaBlock && len(p.free) < maxKeptBlocks {
			p.free = append(p.free, b)
		}
	}
}

// drop lets the kept blocks go: a run's slices are done.
func (p *arenas) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = nil
}

// maxKeptBlocks bounds what arenas keeps: a slice of the default 4 MiB.
const maxKeptBlocks = 4 << 20 / arenaBlock

// fold reads and encodes the next slice. No pages means nothing to archive.
// live is what the run knows of the live entries at or below st.W.
func (a *Archive) fold(ctx context.Context, p Policy, st state, top brand.StreamID, live liveBelow) (f folded, err error) {
	f = folded{next: st, live: uncounted}
	defer func() { // the slice's entries are live at or below its watermark too
		if f.live.n >= 0 {
			f.live.n += int64(len(f.pages))
		}
	}()
	from, ok := st.W.Next()
	if !ok {
		return f, nil
	}
	to := top
	if p.KeepFor > 0 {
		if to, ok = brand.WindowStart(time.Now().Add(-p.KeepFor)).Prev(); !ok {
			return f, nil
		}
	}
	count := a.SliceEntries
	if p.KeepLast > 0 {
		n, below, err := a.archivable(ctx, st, p.KeepLast, live)
		if err != nil {
			return f, err
		}
		count, f.live = min(count, n), below
	}
	f.pages = make([]graft.Page, 0, min(max(count, 0), 1<<14))
	chunks, stop := a.readAhead(ctx, from, to, count)
	defer stop()
	var payload int64 // field bytes, against SliceBytes
	for c := range chunks {
		if c.err != nil {
			return f, c.err
		}
		for _, e := range c.entries {
			n := int64(e.Bytes())
			if payload+n > a.SliceBytes && len(f.pages) > 0 {
				return f, nil
			}
			payload += n
			if err := f.add(a, e, n); err != nil {
				return f, err
			}
		}
	}
	return f, nil
}

// chunk is one XRANGE of a fold's reader.
type chunk struct {
	entries []stream.FlatEntry
	err     error
}

// readAhead reads count entries from..to chunk by chunk on a goroutine of
// its own, one chunk ahead of the caller: the server answers the next
// XRANGE while the caller encodes this one. stop ends the reader (a fold
// that reached SliceBytes) and waits for it.
func (a *Archive) readAhead(ctx context.Context, from, to brand.StreamID, count int64) (<-chan chunk, func()) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan chunk, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for left := count; left > 0 && from.Compare(to) <= 0; {
			ask := min(left, readChunk)
			entries, err := a.read(ctx, from, to, ask)
			select {
			case out <- chunk{entries, err}:
			case <-ctx.Done():
				return
			}
			if err != nil || int64(len(entries)) < ask {
				return
			}
			left -= ask
			var ok bool
			if from, ok = entries[len(entries)-1].StreamID.Next(); !ok {
				return
			}
		}
	}()
	return out, func() { cancel(); <-done }
}

// read reads a chunk of a fold: on the run's reader, if it has one.
func (a *Archive) read(ctx context.Context, from, to brand.StreamID, count int64) ([]stream.FlatEntry, error) {
	if a.flat != nil {
		return a.flat.Read(ctx, from, to, count)
	}
	return a.log.ReadFlat(ctx, from, to, count)
}

// add encodes one entry as the slice's next record page.
func (f *folded) add(a *Archive, e stream.FlatEntry, size int64) error {
	if a.MaxEntryBytes > 0 && size > int64(a.MaxEntryBytes) {
		return fmt.Errorf("entry %s of %s is %d bytes, over the limit of %d (raise Archive.MaxEntryBytes, or remove the entry): %w",
			e.StreamID, a.log.Key(), size, a.MaxEntryBytes, stream.ErrOversized)
	}
	malformed := errors.Is(a.log.CheckFlat(e), stream.ErrMalformed)
	if malformed {
		f.next.Malformed++
	}
	if need := maxRecordSize(e.Pairs); cap(f.arena)-len(f.arena) < need {
		f.arena = a.arenas.get(need)
		f.blocks = append(f.blocks, f.arena)
	}
	start := len(f.arena)
	f.arena, f.order = appendRecord(f.arena, e.StreamID, malformed, e.Pairs, f.order)
	data := f.arena[start:len(f.arena):len(f.arena)]
	if len(f.pages) == 0 {
		f.first = e.StreamID
	}
	f.pages = append(f.pages, graft.Page{No: RecordBase + f.next.NextPage, Data: data})
	f.next.W = e.StreamID
	f.next.Archived++
	f.next.Bytes += int64(len(data))
	f.next.NextPage++
	f.bytes += int64(len(data))
	return nil
}

// liveBelow is what a run knows of the live entries at or below its
// watermark, carried from fold to fold so that a fold need not count them
// again: n of them (-1: not counted), and the stream's entries-added minus
// its length (every entry ever removed from it, by anyone) when they were
// counted, plus what the run has trimmed since.
type liveBelow struct {
	n, removed int64
}

var uncounted = liveBelow{n: -1}

// trimmed is the count after the run's own trim removed k entries at or
// below the watermark.
func (l liveBelow) trimmed(k int64) liveBelow {
	if l.n < 0 {
		return l
	}
	return liveBelow{n: max(l.n-k, 0), removed: l.removed + k}
}

// archivable counts how many entries after W may go while keeping the
// newest keep live: the stream's length minus keep minus what is still
// live at or below W. That last count is carried from the fold before
// (below) while the stream's own counters say that no one else removed an
// entry since it was taken: its entries-added minus its length has grown
// by exactly what the run trimmed. The length and both counters are read at
// one instant (XINFO STREAM), and entries at or below W are never added, so
// the count then is exact. Otherwise (an entry deleted, a producer's MAXLEN,
// another archiver's trim) it is taken again, with the length, at one
// instant (stream.CountLive), which reads every live entry at or below W on
// the server: a run's two slices in flight, 10,000 entries of the default
// size, blocking Redis for milliseconds.
func (a *Archive) archivable(ctx context.Context, st state, keep int64, below liveBelow) (int64, liveBelow, error) {
	if below.n >= 0 {
		info, err := a.log.Info(ctx)
		if err != nil {
			return 0, below, err
		}
		if info.EntriesAdded-info.Length == below.removed {
			return info.Length - below.n - keep, below, nil
		}
	}
	c, err := a.log.CountLive(ctx, st.W)
	if err != nil {
		return 0, below, err
	}
	return c.Length - c.Below - keep, liveBelow{n: c.Below, removed: c.EntriesAdded - c.Length}, nil
}

// create commits a folded slice behind the fence and returns the commit
// and the state after it. A lost race returns no commit and the winner's
// state instead.
func (a *Archive) create(ctx context.Context, st state, f folded, res *Result) (*graft.Commit, state, error) {
	a.failpoint(failpoint.AfterFold)
	c, err := a.vol.Commit(ctx, f.pages, f.next.meta(f.first, a.identity))
	var ce *graft.ConflictError
	if errors.As(err, &ce) {
		res.LostRaces++
		won, serr := stateOf(a.vol.Latest())
		return nil, won, serr
	}
	if err != nil {
		return nil, st, fmt.Errorf("archive %s: %w", a.log.Key(), err)
	}
	a.failpoint(failpoint.AfterCommit)
	return c, f.next, nil
}

// proof is a created slice being proven on a goroutine of its own. It
// keeps what settle counts, not the slice's pages: the create is done with
// them.
type proof struct {
	c           *graft.Commit
	from, next  state // the states before and after the slice
	pages, size int64 // records and record bytes
	done        chan error
}

// startProof reads commit c, slice f's, back from the remote and records it in
// Redis on a goroutine; settle waits for it.
func (a *Archive) startProof(ctx context.Context, c *graft.Commit, from state, f folded) *proof {
	pr := &proof{c: c, from: from, next: f.next, pages: int64(len(f.pages)), size: f.bytes, done: make(chan error, 1)}
	go func() {
		err := a.readBack(ctx, c)
		if err == nil {
			err = a.record(ctx, c, pr.next.W)
		}
		pr.done <- err
	}()
	return pr
}

// settle waits for the slice being proven, counts it in res and trims up
// to its watermark; with none in flight it does nothing. It returns how
// many entries the trim removed.
func (a *Archive) settle(ctx context.Context, pr *proof, res *Result, progress Progress) (int64, error) {
	if pr == nil {
		return 0, nil
	}
	if err := <-pr.done; err != nil {
		return 0, err
	}
	a.holds.own.add(pr.from.W, pr.next.W)
	res.Archived += pr.pages
	res.Commits++
	res.Bytes += pr.size
	res.Malformed += pr.next.Malformed - pr.from.Malformed
	res.W, res.LSN = pr.next.W.String(), pr.c.LSN
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	trimmed, err := a.trim(ctx, res)
	if err != nil {
		return 0, err
	}
	if progress != nil {
		progress(*res)
	}
	return trimmed, nil
}

// trim removes live entries at or below the proven watermark (a commit
// read back from the remote and recorded in Redis), never above, and
// returns how many it removed.
func (a *Archive) trim(ctx context.Context, res *Result) (int64, error) {
	w := a.proven
	if w.IsZero() {
		return 0, nil
	}
	if err := a.provenTrim(ctx, w); err != nil {
		return 0, err
	}
	min, err := a.trimBound(ctx, w)
	if err != nil {
		return 0, err
	}
	if negativeTrim {
		min, _ = min.Next() // the negative control: one entry above W goes too
	}
	n, err := a.log.TrimMinID(ctx, min, a.Exact)
	if err != nil {
		return 0, err
	}
	res.Trimmed += n
	res.W = w.String()
	res.LSN = a.vol.Head()
	a.failpoint(failpoint.AfterTrim)
	return n, nil
}
