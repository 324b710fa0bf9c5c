package archive

import (
	"context"
	"fmt"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/graft"
)

// WatermarkReport says what VerifyWatermarks checked.
type WatermarkReport struct {
	Entries int    `json:"entries"` // live segments whose watermark was checked
	W       string `json:"w"`       // the newest watermark
}

// VerifyWatermarks checks what a forger of a commit would change and a
// checksum cannot catch (the forger recomputes it): every live entry's
// watermark is the stream id of the last record of its segment, and each is
// above the one before. The error names the commit at fault, and wraps
// graft.ErrCorrupt.
func (a *Archive) VerifyWatermarks(ctx context.Context) (WatermarkReport, error) {
	var rep WatermarkReport
	var prev brand.StreamID
	for w, err := range a.vol.Walk(ctx, nil) {
		if err != nil {
			return rep, err
		}
		c := w.Entry
		if len(c.Ranges) == 0 {
			continue
		}
		last := c.Ranges[len(c.Ranges)-1].Hi
		b, err := w.Segment.Lookup(last)
		if err != nil {
			return rep, fmt.Errorf("volume %s: commit %d, page %d: %w", a.vol.Name(), c.LSN, last, err)
		}
		sid, err := streamIDOf(b)
		if err != nil {
			return rep, fmt.Errorf("volume %s: commit %d, page %d: %w: %w", a.vol.Name(), c.LSN, last, graft.ErrCorrupt, err)
		}
		cw, err := brand.ParseStreamID(c.Meta[metaW])
		switch {
		case err != nil:
			return rep, fmt.Errorf("volume %s: commit %d: %w: watermark %q: %v", a.vol.Name(), c.LSN, graft.ErrCorrupt, c.Meta[metaW], err)
		case cw != sid:
			return rep, fmt.Errorf("volume %s: commit %d says W %s, its segment ends at %s: %w (a rewritten commit: compare it with Redis's record of the archive)",
				a.vol.Name(), c.LSN, cw, sid, graft.ErrCorrupt)
		case cw.Compare(prev) <= 0:
			return rep, fmt.Errorf("volume %s: commit %d says W %s, not above the W %s before it: %w", a.vol.Name(), c.LSN, cw, prev, graft.ErrCorrupt)
		}
		prev = cw
		rep.Entries++
	}
	rep.W = wString(prev)
	return rep, nil
}
