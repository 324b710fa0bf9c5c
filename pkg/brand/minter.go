package brand

import (
	"sync"
	"time"
)

// Minter mints strictly increasing ids of one kind. It is safe for concurrent
// use. When the clock steps back, or more ids are minted in a millisecond than
// the clock can tell apart, it keeps the last millisecond and counts the
// sequence up, as Redis does for its own ids.
type Minter struct {
	kind Kind

	// Now is the clock; it defaults to time.Now and exists for tests.
	Now func() time.Time

	mu   sync.Mutex
	last StreamID
}

// NewMinter returns a minter of kind, which must be well formed.
func NewMinter(kind Kind) (*Minter, error) {
	if _, err := ParseKind(string(kind)); err != nil {
		return nil, err
	}
	return &Minter{kind: kind, Now: time.Now}, nil
}

// Kind returns the kind this minter mints.
func (m *Minter) Kind() Kind { return m.kind }

// Mint returns an id strictly greater than every id this minter returned before.
func (m *Minter) Mint() ID {
	now := uint64(m.Now().UnixMilli())
	m.mu.Lock()
	defer m.mu.Unlock()
	if now > m.last.MS && now <= MaxMS {
		m.last = StreamID{MS: now, Seq: 0}
	} else {
		m.last, _ = m.last.Next()
	}
	return ID{Kind: m.kind, StreamID: m.last}
}

// AdvancePast makes every later Mint return an id above top; it is how a
// writer catches up when another writer got ahead of it in the stream.
func (m *Minter) AdvancePast(top StreamID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if top.Compare(m.last) > 0 {
		m.last = top
	}
}
