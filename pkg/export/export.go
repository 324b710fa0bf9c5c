package export

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/silt-dev/silt/internal/jsonx"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

// Defaults of Options.
const (
	DefaultMaxRows  = 1 << 20
	DefaultMaxBytes = 64 << 20
)

// Options tune an export. The zero value writes Parquet files of at most
// DefaultMaxRows rows and DefaultMaxBytes payload bytes.
type Options struct {
	Format Format
	// MaxRows and MaxBytes (the payload bytes of the rows, about) close a
	// file early; a file also ends at its partition's hour.
	MaxRows  int
	MaxBytes int64
	// Progress, when set, is called after each file.
	Progress func(Manifest)
}

// Exporter exports one archive's merged history to one target.
type Exporter struct {
	a      *archive.Archive
	store  fence.Store
	opt    Options
	name   string // the stream= partition
	source string // the archive's volume
}

// New returns an exporter of a's merged history into store. The export's
// name (its stream= partition) is the stream's name, or
// <stream>~dead~<group> for a group's dead letters ('~' is not allowed in
// names, so the two never meet).
func New(a *archive.Archive, store fence.Store, opt Options) (*Exporter, error) {
	if opt.Format == "" {
		opt.Format = Parquet
	}
	if _, err := ParseFormat(string(opt.Format)); err != nil {
		return nil, err
	}
	if opt.MaxRows <= 0 {
		opt.MaxRows = DefaultMaxRows
	}
	if opt.MaxBytes <= 0 {
		opt.MaxBytes = DefaultMaxBytes
	}
	l := a.Log()
	name := l.Name()
	if g := l.DeadGroup(); g != "" {
		name += "~dead~" + g
	}
	return &Exporter{a: a, store: store, opt: opt, name: name, source: a.Volume().Name()}, nil
}

// Name is the export's stream= partition.
func (x *Exporter) Name() string { return x.name }

// Result says what a run exported.
type Result struct {
	Files     int   `json:"files"`
	Rows      int64 `json:"rows"`
	Malformed int64 `json:"malformed"`
	Bytes     int64 `json:"bytes"`
	// Resumed is 1 when the run first wrote the file of a manifest a killed
	// run left without it.
	Resumed int `json:"resumed"`
	// UpTo is the last stream id the export covers after the run ("" when
	// nothing was ever exported).
	UpTo string `json:"up_to,omitempty"`
}

// Run exports the merged history from from to to (both included) that the
// target does not hold yet: it resumes the newest manifest's file if a
// killed run left it unwritten, then starts after the newest manifest's
// range (or at from, when that is later). Files end at each hour of mint
// time and at the size bounds; each is announced by its manifest first.
func (x *Exporter) Run(ctx context.Context, from, to brand.StreamID) (Result, error) {
	var res Result
	head, ok, err := Head(ctx, x.store, x.name)
	if err != nil {
		return res, err
	}
	cursor := from
	if ok {
		if err := x.check(head); err != nil {
			return res, err
		}
		if err := x.resume(ctx, head, &res); err != nil {
			return res, err
		}
		_, covered, _ := head.Covered()
		res.UpTo = head.To
		next, more := covered.Next()
		if !more {
			return res, nil
		}
		if next.Compare(cursor) > 0 {
			cursor = next
		}
	}
	if cursor.Compare(to) > 0 {
		return res, nil
	}
	c := x.newChunk(cursor)
	for sid, r := range x.rows(ctx, cursor, to, &err) {
		if c.rows > 0 && (hourOf(sid) != hourOf(c.first) || c.rows >= int64(x.opt.MaxRows) || c.payload >= x.opt.MaxBytes) {
			if head, err = x.flush(ctx, head, c, &res); err != nil {
				return res, err
			}
			c = x.newChunk(c.nextFrom())
		}
		if err = c.add(sid, r); err != nil {
			return res, err
		}
	}
	if err != nil {
		return res, fmt.Errorf("export %s: read after %s: %w", x.name, c.from, err)
	}
	if c.rows > 0 {
		if _, err = x.flush(ctx, head, c, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// check refuses to continue an export of another source, or in another
// format, under the same name.
func (x *Exporter) check(head *Manifest) error {
	id := x.a.Identity()
	switch {
	case head.Source != x.source:
		return fmt.Errorf("the target's export stream=%s comes from %s; this is %s: export to another prefix", x.name, head.Source, x.source)
	case head.Identity != "" && id != "" && head.Identity != id:
		return fmt.Errorf("the target's export stream=%s comes from archive %s; this stream's archive is %s (another Redis sharing the target?): export to another prefix",
			x.name, head.Identity, id)
	case head.Format != x.opt.Format:
		return fmt.Errorf("the target's export stream=%s is in %s; this run asks %s: one format per target", x.name, head.Format, x.opt.Format)
	}
	return nil
}

// chunk is one file in the making.
type chunk struct {
	enc         encoder
	from        brand.StreamID // covered from, included
	first, last brand.StreamID
	rows        int64
	malformed   int64
	payload     int64
	batch       []Row
}

func (x *Exporter) newChunk(from brand.StreamID) *chunk {
	return &chunk{enc: newEncoder(x.opt.Format), from: from, batch: make([]Row, 0, 1024)}
}

func (c *chunk) add(sid brand.StreamID, r Row) error {
	if c.rows == 0 {
		c.first = sid
	}
	c.last = sid
	c.rows++
	if r.Error != nil {
		c.malformed++
	}
	for k, v := range r.Fields {
		c.payload += int64(len(k) + len(v))
	}
	c.batch = append(c.batch, r)
	if len(c.batch) == cap(c.batch) {
		return c.drain()
	}
	return nil
}

func (c *chunk) drain() error {
	err := c.enc.write(c.batch)
	clear(c.batch)
	c.batch = c.batch[:0]
	return err
}

func (c *chunk) bytes() ([]byte, error) {
	if err := c.drain(); err != nil {
		return nil, err
	}
	return c.enc.close()
}

// nextFrom is where the range after this chunk starts.
func (c *chunk) nextFrom() brand.StreamID {
	next, _ := c.last.Next()
	return next
}

// rowBatch is a run of rows of the merged history, or the error that
// ended it.
type rowBatch struct {
	sids []brand.StreamID
	rows []Row
	err  error
}

// rowBatchLen is how many rows the reader hands over at a time.
const rowBatchLen = 1024

// rows yields the rows of the merged history from..to with their stream
// ids. A goroutine reads and builds them while the caller encodes and
// uploads, so a run costs about the larger of the two, not their sum. A
// read error ends the iteration and is stored in *errp.
func (x *Exporter) rows(ctx context.Context, from, to brand.StreamID, errp *error) iter.Seq2[brand.StreamID, Row] {
	return func(yield func(brand.StreamID, Row) bool) {
		ctx, cancel := context.WithCancel(ctx)
		ch := make(chan rowBatch, 4)
		go func() {
			defer close(ch)
			send := func(b rowBatch) bool {
				select {
				case ch <- b:
					return true
				case <-ctx.Done():
					return false
				}
			}
			b := rowBatch{sids: make([]brand.StreamID, 0, rowBatchLen), rows: make([]Row, 0, rowBatchLen)}
			for it, err := range x.a.Read(ctx, from, to) {
				var me *stream.MalformedError
				if err != nil && !errors.As(err, &me) {
					send(rowBatch{err: err})
					return
				}
				sid := it.StreamID
				if me != nil {
					sid = me.StreamID
				}
				b.sids, b.rows = append(b.sids, sid), append(b.rows, x.row(it.Entry, me))
				if len(b.rows) == rowBatchLen {
					if !send(b) {
						return
					}
					b = rowBatch{sids: make([]brand.StreamID, 0, rowBatchLen), rows: make([]Row, 0, rowBatchLen)}
				}
			}
			if len(b.rows) > 0 {
				send(b)
			}
		}()
		defer func() {
			cancel()
			for range ch { // let the reader see the cancel and end
			}
		}()
		for b := range ch {
			if b.err != nil {
				*errp = b.err
				return
			}
			for i := range b.rows {
				if !yield(b.sids[i], b.rows[i]) {
					return
				}
			}
		}
	}
}

// row makes the exported row of an entry (malformed when me is set).
func (x *Exporter) row(e stream.Entry, me *stream.MalformedError) Row {
	l := x.a.Log()
	r := Row{
		ID: e.ID.String(), StreamID: e.StreamID.String(), Time: e.StreamID.Time().UTC(),
		Kind: string(l.Kind()), Queue: l.Keyspace().Queue, Stream: x.name,
	}
	if me != nil {
		r.ID, r.StreamID, r.Time = me.RawID, me.StreamID.String(), me.StreamID.Time().UTC()
		reason := me.Reason
		r.Error = &reason
	}
	r.Fields, r.FieldsBase64 = stream.SplitBinary(e.Fields)
	if r.Fields == nil {
		r.Fields = map[string]string{}
	}
	r.FieldsJSON = string(jsonx.AppendStringMap(make([]byte, 0, 64), r.Fields))
	return r
}

// flush announces c by the manifest after head, then writes its file.
func (x *Exporter) flush(ctx context.Context, head *Manifest, c *chunk, res *Result) (*Manifest, error) {
	body, err := c.bytes()
	if err != nil {
		return nil, fmt.Errorf("export %s: encode %s..%s: %w", x.name, c.first, c.last, err)
	}
	sum := sha256.Sum256(body)
	m := &Manifest{
		Seq: 1, Source: x.source, Identity: x.a.Identity(), Name: x.name, Format: x.opt.Format,
		From: c.from.String(), To: c.last.String(), File: fileKey(x.name, x.opt.Format, c.first, c.last),
		Rows: c.rows, Malformed: c.malformed, Bytes: int64(len(body)), SHA256: hex.EncodeToString(sum[:]),
		Time: time.Now().UTC().Truncate(time.Millisecond),
	}
	if head != nil {
		m.Seq, m.Prev = head.Seq+1, head.Hash()
	}
	if err := m.create(ctx, x.store); err != nil {
		return nil, fmt.Errorf("export %s: %w", x.name, err)
	}
	if err := x.writeFile(ctx, m, body); err != nil {
		return nil, err
	}
	res.Files++
	res.Rows += m.Rows
	res.Malformed += m.Malformed
	res.Bytes += m.Bytes
	res.UpTo = m.To
	if x.opt.Progress != nil {
		x.opt.Progress(*m)
	}
	return m, nil
}

// writeFile creates m's file. A file already there (a racing exporter that
// resumed the same manifest) must hold the same bytes.
func (x *Exporter) writeFile(ctx context.Context, m *Manifest, body []byte) error {
	err := x.store.Create(ctx, m.File, body)
	if errors.Is(err, fence.ErrExists) {
		have, gerr := x.store.Get(ctx, m.File, fence.Range{})
		if gerr != nil {
			return fmt.Errorf("export %s: read back %s: %w", x.name, m.File, gerr)
		}
		if !bytes.Equal(have, body) {
			return fmt.Errorf("export %s: %s exists with other bytes than manifest %d announces: %w", x.name, m.File, m.Seq, ErrCorrupt)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("export %s: write %s: %w", x.name, m.File, err)
	}
	return nil
}

// resume writes the file of head if a killed run announced it and died
// before writing it: the same range read again gives the same rows and the
// same bytes.
func (x *Exporter) resume(ctx context.Context, head *Manifest, res *Result) error {
	_, err := x.store.Get(ctx, head.File, fence.Range{Off: 0, Len: 1})
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, fence.ErrNotFound):
		return fmt.Errorf("export %s: check %s: %w", x.name, head.File, err)
	}
	from, to, err := head.Covered()
	if err != nil {
		return err
	}
	c := x.newChunk(from)
	for sid, r := range x.rows(ctx, from, to, &err) {
		if err = c.add(sid, r); err != nil {
			return err
		}
	}
	if err != nil {
		return fmt.Errorf("export %s: resume manifest %d: read %s..%s: %w", x.name, head.Seq, from, to, err)
	}
	body, err := c.bytes()
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	if c.rows != head.Rows || hex.EncodeToString(sum[:]) != head.SHA256 {
		return fmt.Errorf("export %s: manifest %d announces %s with %d rows (sha256 %s); the range %s..%s now gives %d rows (sha256 %x): "+
			"the history changed under the export (pruned?), or another silt version encodes differently: %w",
			x.name, head.Seq, head.File, head.Rows, head.SHA256, from, to, c.rows, sum, ErrCorrupt)
	}
	if err := x.writeFile(ctx, head, body); err != nil {
		return err
	}
	res.Resumed++
	res.Files++
	res.Rows += head.Rows
	res.Malformed += head.Malformed
	res.Bytes += head.Bytes
	if x.opt.Progress != nil {
		x.opt.Progress(*head)
	}
	return nil
}
