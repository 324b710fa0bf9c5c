package archive

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/graft"
	"github.com/silt-dev/silt/pkg/stream"
)

// Sources of an Item.
const (
	SourceArchive = "archive"
	SourceLive    = "live"
)

// Item is one entry of the merged history.
type Item struct {
	stream.Entry
	Source string // SourceArchive or SourceLive
}

// PageSize is how many live entries a merged read fetches at a time.
const PageSize = 1000

// Read yields every entry with from <= stream id <= to exactly once, in mint
// order, merging the archive (entries at or below the watermark) and the live
// stream (entries above it). It is safe while an archiver commits and trims:
// each live page is read first, then the archive head is refreshed, so any
// entry missing from the live page was committed before the refresh. A
// malformed entry is yielded with a *stream.MalformedError; a failure ends the
// iteration with its error.
func (a *Archive) Read(ctx context.Context, from, to brand.StreamID) iter.Seq2[Item, error] {
	if a.ArchiveOnly {
		return a.ReadArchived(ctx, from, to)
	}
	return func(yield func(Item, error) bool) {
		r := a.log.FlatReader() // its pages after the first on a connection of their own
		defer r.Close()
		cursor := from
		for cursor.Compare(to) <= 0 {
			live, err := r.Read(ctx, cursor, to, PageSize)
			if err != nil {
				yield(Item{}, err)
				return
			}
			w, archived, err := a.Watermark(ctx)
			if err != nil {
				yield(Item{}, err)
				return
			}
			if archived && w.Compare(cursor) >= 0 {
				hi := w
				if to.Compare(hi) < 0 {
					hi = to
				}
				// Live entries at or below hi are merged with the archive,
				// never hidden: the archive may lack some (another node
				// wrote them, ArchiveRecord's failover cases).
				n := 0
				for n < len(live) && live[n].StreamID.Compare(hi) <= 0 {
					n++
				}
				if n == PageSize { // the page ends inside the archived range: its rest comes with the next page
					hi = live[n-1].StreamID
				}
				if !a.readMerged(ctx, cursor, hi, live[:n], yield) {
					return
				}
				next, ok := hi.Next()
				if !ok {
					return
				}
				cursor = next
			}
			var last brand.StreamID
			for _, raw := range live {
				last = raw.StreamID
				if raw.StreamID.Compare(cursor) < 0 {
					continue // at or below the watermark: yielded from the archive
				}
				e, err := a.log.Decode(stream.RawEntry{StreamID: raw.StreamID, Fields: raw.Fields()})
				if !yield(Item{Entry: e, Source: SourceLive}, err) {
					return
				}
			}
			if len(live) < PageSize {
				return // the live stream holds nothing more in range
			}
			next, ok := last.Next()
			if !ok {
				return
			}
			if next.Compare(cursor) > 0 {
				cursor = next
			}
		}
	}
}

// readMerged yields the archived records with lo <= id <= hi merged, in id
// order, with live, the live entries in that range: a live entry the
// archive lacks is yielded from the live stream, one it holds with the same
// fields once, from the archive, and one it holds with other fields (two
// masters of a split brain wrote one id) after the archive's.
func (a *Archive) readMerged(ctx context.Context, lo, hi brand.StreamID, live []stream.FlatEntry, yield func(Item, error) bool) bool {
	if len(live) == 0 || noCompare {
		return a.readArchive(ctx, lo, hi, yield)
	}
	yieldLive := func(raw stream.FlatEntry) bool {
		e, err := a.log.Decode(stream.RawEntry{StreamID: raw.StreamID, Fields: raw.Fields()})
		return yield(Item{Entry: e, Source: SourceLive}, err)
	}
	i, ok := 0, true
	err := a.walkRecords(ctx, lo, hi, func(rec Record) bool {
		for ; ok && i < len(live) && live[i].StreamID.Compare(rec.StreamID) < 0; i++ {
			ok = yieldLive(live[i])
		}
		if !ok {
			return false
		}
		e, err := a.log.Decode(stream.RawEntry{StreamID: rec.StreamID, Fields: rec.Fields})
		if ok = yield(Item{Entry: e, Source: SourceArchive}, err); !ok {
			return false
		}
		if i < len(live) && live[i].StreamID == rec.StreamID {
			if !sameFields(live[i], rec.Fields) {
				ok = yieldLive(live[i])
			}
			i++
		}
		return ok
	})
	if !ok {
		return false
	}
	if err != nil {
		yield(Item{}, err)
		return false
	}
	for ; i < len(live); i++ {
		if !yieldLive(live[i]) {
			return false
		}
	}
	return true
}

// ReadArchived yields the archived entries with from <= stream id <= to,
// from the archive alone: the live stream is not read and Redis is not
// asked, so nothing proves the archive complete or this stream's (Read
// does this when ArchiveOnly is set: an auditor's read of an archive whose
// Redis is gone).
func (a *Archive) ReadArchived(ctx context.Context, from, to brand.StreamID) iter.Seq2[Item, error] {
	return func(yield func(Item, error) bool) {
		w, archived, err := a.Watermark(ctx)
		if err != nil {
			yield(Item{}, err)
			return
		}
		if !archived || w.Compare(from) < 0 {
			return
		}
		if to.Compare(w) > 0 {
			to = w
		}
		a.readArchive(ctx, from, to, yield)
	}
}

// ReadWindow yields the entries minted from t0 to t1, both milliseconds included.
func (a *Archive) ReadWindow(ctx context.Context, t0, t1 time.Time) iter.Seq2[Item, error] {
	return a.Read(ctx, brand.WindowStart(t0), brand.WindowEnd(t1))
}

// ReadSince yields the entries minted at or after t0.
func (a *Archive) ReadSince(ctx context.Context, t0 time.Time) iter.Seq2[Item, error] {
	return a.Read(ctx, brand.WindowStart(t0), stream.Last)
}

// readArchive yields archived records with lo <= id <= hi, decoded as the
// log decodes a live entry (walkRecords).
func (a *Archive) readArchive(ctx context.Context, lo, hi brand.StreamID, yield func(Item, error) bool) bool {
	ok := true
	err := a.walkRecords(ctx, lo, hi, func(rec Record) bool {
		e, err := a.log.Decode(stream.RawEntry{StreamID: rec.StreamID, Fields: rec.Fields})
		ok = yield(Item{Entry: e, Source: SourceArchive}, err)
		return ok
	})
	if err != nil && ok {
		return yield(Item{}, err)
	}
	return ok
}

// walkRecords calls fn with each archived record with lo <= id <= hi, in
// order, until fn returns false. It finds the first commit whose watermark
// is at or above lo through the volume's checkpoint index (binary
// searches, one leaf fetched), then reads segment by segment, the next
// ones fetched ahead once it walks past the first (graft.Volume.Walk).
func (a *Archive) walkRecords(ctx context.Context, lo, hi brand.StreamID, fn func(Record) bool) error {
	var werr error
	below := func(meta map[string]string) bool {
		w, err := brand.ParseStreamID(meta[metaW])
		if err != nil {
			werr = fmt.Errorf("volume %s: entry watermark %q: %w", a.vol.Name(), meta[metaW], err)
			return false
		}
		return w.Compare(lo) < 0
	}
	for w, err := range a.vol.Walk(ctx, below) {
		if werr != nil {
			err = werr
		}
		if err != nil {
			return err
		}
		done, err := a.segmentRecords(w.Segment, w.Entry, lo, hi, fn)
		if err != nil || done {
			return err
		}
	}
	return nil
}

// segmentRecords calls fn with one segment's records in [lo, hi]; done is
// true once a record above hi was seen or fn returned false.
func (a *Archive) segmentRecords(seg *graft.Segment, c *graft.Commit, lo, hi brand.StreamID, fn func(Record) bool) (done bool, err error) {
	pages := seg.Pages()
	start, err := firstPage(seg, pages, lo)
	if err != nil {
		return true, fmt.Errorf("commit %d: %w", c.LSN, err)
	}
	for _, no := range pages[start:] {
		data, err := seg.Lookup(no)
		if err != nil {
			return true, err
		}
		rec, err := decodeRecord(data)
		if err != nil {
			return true, fmt.Errorf("segment %s: page %d: %w", c.Segment.Key, no, err)
		}
		if rec.StreamID.Compare(hi) > 0 || !fn(rec) {
			return true, nil
		}
	}
	return false, nil
}

// firstPage finds the first record page with stream id >= lo by binary search.
func firstPage(seg *graft.Segment, pages []uint64, lo brand.StreamID) (int, error) {
	var ferr error
	i, _ := slices.BinarySearchFunc(pages, lo, func(no uint64, lo brand.StreamID) int {
		data, err := seg.Lookup(no)
		if err == nil {
			var sid brand.StreamID
			if sid, err = streamIDOf(data); err == nil {
				return sid.Compare(lo)
			}
		}
		ferr = fmt.Errorf("page %d: %w", no, err)
		return 0
	})
	return i, ferr
}

// Get returns the entry with stream id sid from the live stream or the archive.
func (a *Archive) Get(ctx context.Context, sid brand.StreamID) (Item, error) {
	for it, err := range a.Read(ctx, sid, sid) {
		return it, err
	}
	return Item{}, fmt.Errorf("%s: entry %s: %w", a.log.Key(), sid, stream.ErrPayloadNotFound)
}

// Payload implements stream.PayloadSource: it recovers an entry trimmed from
// the live stream from the archive.
func (a *Archive) Payload(ctx context.Context, sid brand.StreamID) (brand.ID, stream.Fields, error) {
	w, archived, err := a.Watermark(ctx)
	if err != nil {
		return brand.ID{}, nil, err
	}
	if !archived || sid.Compare(w) > 0 {
		return brand.ID{}, nil, fmt.Errorf("%s: entry %s is above the watermark: %w", a.log.Key(), sid, stream.ErrPayloadNotFound)
	}
	var found *Item
	var ferr error
	a.readArchive(ctx, sid, sid, func(it Item, err error) bool {
		found, ferr = &it, err
		return false
	})
	switch {
	case found == nil:
		return brand.ID{}, nil, fmt.Errorf("%s: entry %s not archived: %w", a.log.Key(), sid, stream.ErrPayloadNotFound)
	case ferr != nil && !errors.Is(ferr, stream.ErrMalformed):
		return brand.ID{}, nil, ferr
	case found.StreamID != sid:
		return brand.ID{}, nil, fmt.Errorf("%s: entry %s not archived: %w", a.log.Key(), sid, stream.ErrPayloadNotFound)
	}
	return found.ID, found.Fields, ferr
}

var _ stream.PayloadSource = (*Archive)(nil)

// Archived implements stream.History: the archived entries (only those) with
// from <= id <= to, in order.
func (a *Archive) Archived(ctx context.Context, from, to brand.StreamID) iter.Seq2[stream.Entry, error] {
	return func(yield func(stream.Entry, error) bool) {
		if err := a.vol.Refresh(ctx); err != nil {
			yield(stream.Entry{}, err)
			return
		}
		a.readArchive(ctx, from, to, func(it Item, err error) bool { return yield(it.Entry, err) })
	}
}

var _ stream.History = (*Archive)(nil)
