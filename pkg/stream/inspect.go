package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
)

// StreamStatus is the capacity view of one stream: how long it is, and how
// long its pending lists are (a short stream can have a long PEL).
type StreamStatus struct {
	Key             string        `json:"key"`
	Length          int64         `json:"length"`
	EntriesAdded    int64         `json:"entries_added"`
	FirstID         string        `json:"first_id,omitempty"`
	LastID          string        `json:"last_id,omitempty"`
	LastGeneratedID string        `json:"last_generated_id"`
	Groups          []GroupStatus `json:"groups"`
}

// GroupStatus is one consumer group of a stream.
type GroupStatus struct {
	Name             string  `json:"name"`
	LastDeliveredID  string  `json:"last_delivered_id"`
	Pending          int64   `json:"pending"`
	OldestPendingID  string  `json:"oldest_pending_id,omitempty"`
	OldestPendingAge float64 `json:"oldest_pending_age_seconds,omitempty"`
	PendingTrimmed   int64   `json:"pending_payload_gone"` // pending entries below the first live entry
	Lag              *int64  `json:"lag"`                  // nil: Redis cannot tell
	DeadLetters      int64   `json:"dead_letters"`
	// CatchUpGaps counts the group's recorded gaps: entries trimmed before
	// it read them, to catch up from the archive; TrimmedUnread is how many
	// entries they held when found (-1 in a gap: unknown, counted as 0).
	CatchUpGaps   int64 `json:"catch_up_gaps"`
	TrimmedUnread int64 `json:"trimmed_unread"`
	// StartsRecorded counts entries with a handler start recorded and not
	// yet settled (Keyspace.Attempts): running, failed, or their worker died.
	StartsRecorded int64            `json:"starts_recorded"`
	Consumers      []ConsumerStatus `json:"consumers"`
}

// ConsumerStatus is one consumer of a group.
type ConsumerStatus struct {
	Name        string  `json:"name"`
	Pending     int64   `json:"pending"`
	IdleSeconds float64 `json:"idle_seconds"`
}

// Info is what XINFO STREAM says of a stream's size.
type Info struct {
	Length          int64
	EntriesAdded    int64
	FirstID, LastID string
	LastGeneratedID string
}

// Info returns the stream's length and counters; a missing stream has zeros.
func (l *Log) Info(ctx context.Context) (Info, error) {
	info, err := l.rdb.XInfoStream(ctx, l.key).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return Info{}, nil
		}
		return Info{}, fmt.Errorf("xinfo stream %s: %w", l.key, err)
	}
	return Info{Length: info.Length, EntriesAdded: info.EntriesAdded, FirstID: info.FirstEntry.ID,
		LastID: info.LastEntry.ID, LastGeneratedID: info.LastGeneratedID}, nil
}

// LiveCount is a stream's size at one instant: its length and entries-added,
// and how many of its live entries lie at or below a stream id.
type LiveCount struct {
	Length, EntriesAdded, Below int64
}

// countLiveScript counts in one script, so no trim, delete or append falls
// between the length and the count below ARGV[1] (none when it is empty).
// The entries below are read a page at a time on the server: a count, not
// a transfer.
var countLiveScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, 0} end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local length, added = 0, 0
for i = 1, #info, 2 do
  if info[i] == 'length' then length = info[i + 1] end
  if info[i] == 'entries-added' then added = info[i + 1] end
end
local below, from = 0, '-'
while ARGV[1] ~= '' do
  local page = redis.call('XRANGE', KEYS[1], from, ARGV[1], 'COUNT', 1000)
  below = below + #page
  if #page < 1000 then break end
  from = '(' .. page[#page][1]
end
return {length, added, below}
`)

// CountLive returns the stream's length and entries-added and how many of
// its live entries lie at or below w (none when w is zero), all read at
// one instant. A missing stream counts zeros.
func (l *Log) CountLive(ctx context.Context, w brand.StreamID) (LiveCount, error) {
	through := ""
	if !w.IsZero() {
		through = w.String()
	}
	n, err := countLiveScript.Run(ctx, l.rdb, []string{l.key}, through).Int64Slice()
	if err != nil {
		return LiveCount{}, fmt.Errorf("count the live entries of %s: %w", l.key, err)
	}
	if len(n) != 3 {
		return LiveCount{}, fmt.Errorf("count the live entries of %s: %d numbers in the reply, want 3", l.key, len(n))
	}
	return LiveCount{Length: n[0], EntriesAdded: n[1], Below: n[2]}, nil
}

// Inspect reports the stream's status and that of its groups (only group
// when it is not empty). A missing stream is reported with length 0.
func Inspect(ctx context.Context, l *Log, group string) (StreamStatus, error) {
	st := StreamStatus{Key: l.key, Groups: []GroupStatus{}}
	info, err := l.rdb.XInfoStream(ctx, l.key).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return st, nil
		}
		return st, fmt.Errorf("xinfo stream %s: %w", l.key, err)
	}
	st.Length, st.EntriesAdded, st.LastGeneratedID = info.Length, info.EntriesAdded, info.LastGeneratedID
	st.FirstID, st.LastID = info.FirstEntry.ID, info.LastEntry.ID
	groups, err := l.rdb.XInfoGroups(ctx, l.key).Result()
	if err != nil {
		return st, fmt.Errorf("xinfo groups %s: %w", l.key, err)
	}
	for _, g := range groups {
		if group != "" && g.Name != group {
			continue
		}
		gs, err := inspectGroup(ctx, l, g, st.FirstID)
		if err != nil {
			return st, err
		}
		st.Groups = append(st.Groups, gs)
	}
	if group != "" && len(st.Groups) == 0 {
		return st, fmt.Errorf("%s has no group %q", l.key, group)
	}
	return st, nil
}

func inspectGroup(ctx context.Context, l *Log, g redis.XInfoGroup, firstID string) (GroupStatus, error) {
	gs := GroupStatus{Name: g.Name, LastDeliveredID: g.LastDeliveredID, Pending: g.Pending, Consumers: []ConsumerStatus{}}
	if g.Lag >= 0 {
		lag := g.Lag
		gs.Lag = &lag
	}
	consumers, err := l.rdb.XInfoConsumers(ctx, l.key, g.Name).Result()
	if err != nil {
		return gs, fmt.Errorf("xinfo consumers %s %s: %w", l.key, g.Name, err)
	}
	for _, c := range consumers {
		gs.Consumers = append(gs.Consumers, ConsumerStatus{Name: c.Name, Pending: c.Pending, IdleSeconds: c.Idle.Seconds()})
	}
	if gs.Pending > 0 {
		if err := oldestPending(ctx, l, &gs, firstID); err != nil {
			return gs, err
		}
	}
	n, err := l.rdb.XLen(ctx, l.ks.DeadLetter(l.name, g.Name)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return gs, fmt.Errorf("xlen dead letters of %s: %w", g.Name, err)
	}
	gs.DeadLetters = n
	return gs, inspectGaps(ctx, l, &gs)
}

// maxGapScan bounds how many recorded gaps are read.
const maxGapScan = 10000

// inspectGaps reads the group's catch-up gaps and start records.
func inspectGaps(ctx context.Context, l *Log, gs *GroupStatus) error {
	key := l.ks.CatchUp(l.name, gs.Name)
	gaps, err := l.rdb.LRange(ctx, key, 0, maxGapScan-1).Result()
	if err != nil {
		return fmt.Errorf("catch-up gaps %s: %w", key, err)
	}
	gs.CatchUpGaps = int64(len(gaps))
	for _, s := range gaps {
		if g, err := parseGap(s); err == nil && g.skipped > 0 {
			gs.TrimmedUnread += g.skipped
		}
	}
	akey := l.ks.Attempts(l.name, gs.Name)
	if gs.StartsRecorded, err = l.rdb.HLen(ctx, akey).Result(); err != nil {
		return fmt.Errorf("start records %s: %w", akey, err)
	}
	return nil
}

// maxTrimmedScan bounds how many pending ids below the first entry are counted.
const maxTrimmedScan = 100000

func oldestPending(ctx context.Context, l *Log, gs *GroupStatus, firstID string) error {
	p, err := l.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: l.key, Group: gs.Name, Start: "-", End: "+", Count: 1}).Result()
	if err != nil {
		return fmt.Errorf("xpending %s %s: %w", l.key, gs.Name, err)
	}
	if len(p) == 0 {
		return nil
	}
	gs.OldestPendingID = p[0].ID
	if sid, err := brand.ParseStreamID(p[0].ID); err == nil {
		gs.OldestPendingAge = time.Since(sid.Time()).Seconds()
	}
	end := "+"
	if firstID != "" {
		end = "(" + firstID
	}
	below, err := l.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: l.key, Group: gs.Name, Start: "-", End: end, Count: maxTrimmedScan}).Result()
	if err != nil {
		return fmt.Errorf("xpending %s %s below %s: %w", l.key, gs.Name, firstID, err)
	}
	gs.PendingTrimmed = int64(len(below))
	return nil
}

// Node names the Redis server the log's client talks to now: its run_id
// (INFO server). A failover that moves the client to another node (a
// Sentinel client following a promotion) changes it. It is "" when that
// cannot be told: a cluster client (each key's node is the cluster's to
// choose), or INFO refused.
func (l *Log) Node(ctx context.Context) string {
	c, ok := l.rdb.(*redis.Client)
	if !ok {
		return ""
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "run_id:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
