package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// DefaultPrefix is the key prefix shared with EchoMQ's keyspace.
const DefaultPrefix = "emq"

// ErrBadName is wrapped by errors about prefixes, queues, streams or groups
// whose names would break a key or its hash tag.
var ErrBadName = errors.New("bad name")

// maxNameLen bounds every name so that keys stay readable and small.
const maxNameLen = 128

// Keyspace names every key silt writes for one queue. All of them share the
// hash tag {<queue>}, so one queue lives in one Redis Cluster slot:
//
//	<prefix>:{<queue>}:stream:<stream>              the stream itself
//	<prefix>:{<queue>}:kinds                         the kind of ids each stream holds (hash: stream -> kind)
//	<prefix>:{<queue>}:archive:<stream>[:dead:<group>] what Redis records of the stream's archive (hash)
//	<prefix>:{<queue>}:dead:<stream>:<group>         a group's dead letters (a stream of the same kind)
//	<prefix>:{<queue>}:done:<stream>:<group>:<id>    dedupe marker of a handled entry (string, with a TTL)
//	<prefix>:{<queue>}:catchup:<stream>:<group>      gaps to read from the archive, head first (list)
//	<prefix>:{<queue>}:lease:<stream>:<group>        which consumer is catching up (string, with a TTL)
//	<prefix>:{<queue>}:attempts:<stream>:<group>     handler starts of unsettled entries (hash: stream id -> count)
//	<prefix>:{<queue>}:windows:<stream>:<group>      first starts in progress (hash: consumer -> "lo hi" stream ids)
//	<prefix>:{<queue>}:replay:<stream>:<name>        last stream id a named replay handled (string)
//	<prefix>:{<queue>}:replay-hold:<stream>:<name>   which process runs that replay now (string, with a TTL)
//	<prefix>:{<queue>}:dead-retried:<stream>:<group> dead letters retried (hash: record id -> time; the archive's history retention forgets those it drops)
//	<prefix>:{<queue>}:dead-retrying:<stream>:<group>:<id> the retry handling a dead letter now (string, with a TTL)
//	<prefix>:{<queue>}:policies, policy-runs, trimmed-unarchived   retention (PolicyStore)
//	<prefix>:{<queue>}:adopted                       streams adopted under their own key (hash: name -> key)
//
// A stream adopted under its own key (KeyspaceFor) keeps that key; its queue
// is the key's hash tag (the key itself when it has none), so every key
// above lands in the stream key's Redis Cluster slot.
type Keyspace struct {
	Prefix string
	Queue  string
	// own is the stream's own key, and ownName the name silt's other keys
	// use for it ("" for a keyspace of silt's own streams).
	own, ownName string
}

// KeyspaceFor returns the keyspace of a stream that lives under its own key
// (a stream other producers already write, such as "orders" or
// "app:{tenant}:events"), and the name silt's keys use for it: the key with
// every byte outside [A-Za-z0-9.-] escaped as _XX. The queue is the key's
// hash tag, as Redis Cluster reads it, so silt's keys share the key's slot;
// a key hashed whole that holds a '}' ("a}b", "{}a") has no tag silt's keys
// could carry, and is refused (ErrBadName).
func KeyspaceFor(prefix, key string) (Keyspace, string, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := ValidateName("prefix", prefix); err != nil {
		return Keyspace{}, "", err
	}
	if key == "" || len(key) > maxNameLen || strings.ContainsAny(key, "\r\n\x00") {
		return Keyspace{}, "", fmt.Errorf("stream key %.40q: 1 to %d bytes, no line breaks: %w", key, maxNameLen, ErrBadName)
	}
	name := escapeKey(key)
	if len(name) > maxNameLen {
		return Keyspace{}, "", fmt.Errorf("stream key %.40q: too long once escaped (%d bytes, at most %d): %w", key, len(name), maxNameLen, ErrBadName)
	}
	tag := HashTag(key)
	if !isTag(tag) { // "a}b", "{}a": hashed whole, by a tag that ends at its '}'
		return Keyspace{}, "", fmt.Errorf("stream key %.40q: Redis Cluster hashes it whole, and a hash tag cannot hold its '}', so silt's keys for it could not share its slot; "+
			"give the key a hash tag, as in app:{tenant}:events: %w", key, ErrBadName)
	}
	return Keyspace{Prefix: prefix, Queue: tag, own: key, ownName: name}, name, nil
}

// HashTag returns the part of key Redis Cluster hashes: the bytes between
// the first '{' and the next '}' when there are any, else the whole key.
func HashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// isTag reports whether s can be the hash tag of a key KeyspaceFor takes.
func isTag(s string) bool {
	return s != "" && len(s) <= maxNameLen && !strings.ContainsAny(s, "}\r\n\x00")
}

func escapeKey(key string) string {
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		if c := key[i]; nameByte(c) && c != '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02X", c)
		}
	}
	return b.String()
}

// NewKeyspace validates prefix and queue. An empty prefix means DefaultPrefix.
func NewKeyspace(prefix, queue string) (Keyspace, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := ValidateName("prefix", prefix); err != nil {
		return Keyspace{}, err
	}
	if err := ValidateName("queue", queue); err != nil {
		return Keyspace{}, err
	}
	return Keyspace{Prefix: prefix, Queue: queue}, nil
}

// ValidateName checks a name used inside a key. Allowed: 1 to 128 ASCII
// letters, digits, '.', '_' and '-'. Braces would break the hash tag, ':'
// would make keys ambiguous, and spaces or control bytes make keys unsafe to
// type. what names the role ("queue", "stream", "group") in the error.
func ValidateName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s name is empty: %w", what, ErrBadName)
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("%s name %.20q... is %d bytes, at most %d: %w", what, name, len(name), maxNameLen, ErrBadName)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return fmt.Errorf("%s name %q: byte %q at %d is not allowed (use letters, digits, '.', '_', '-'): %w",
				what, name, name[i], i, ErrBadName)
		}
	}
	return nil
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

func (k Keyspace) base() string { return k.Prefix + ":{" + k.Queue + "}:" }

// Stream returns the key of a stream. The name must have passed ValidateName.
func (k Keyspace) Stream(name string) string {
	if k.own != "" && name == k.ownName {
		return k.own
	}
	return k.base() + "stream:" + name
}

// Done returns the dedupe marker key of an entry handled by a group.
func (k Keyspace) Done(stream, group, id string) string {
	return k.base() + "done:" + stream + ":" + group + ":" + id
}

// CatchUp returns the key of a group's list of gaps to catch up from the archive.
func (k Keyspace) CatchUp(stream, group string) string {
	return k.base() + "catchup:" + stream + ":" + group
}

// Replay returns the checkpoint key of a named replay.
func (k Keyspace) Replay(stream, name string) string {
	return k.base() + "replay:" + stream + ":" + name
}

// ReplayHold returns the key of a named replay's hold: the one process that
// runs that replay now.
func (k Keyspace) ReplayHold(stream, name string) string {
	return k.base() + "replay-hold:" + stream + ":" + name
}

// Lease returns the key of a group's catch-up lease.
func (k Keyspace) Lease(stream, group string) string {
	return k.base() + "lease:" + stream + ":" + group
}

// DeadLetter returns the key of a group's dead-letter stream.
func (k Keyspace) DeadLetter(stream, group string) string {
	return k.base() + "dead:" + stream + ":" + group
}

// DeadRetried returns the key of a group's dead letters retried with
// success by RetryDeadLetter: record id to the time of the retry.
func (k Keyspace) DeadRetried(stream, group string) string {
	return k.base() + "dead-retried:" + stream + ":" + group
}

// DeadRetrying returns the key of the claim on one dead letter (its record
// id) held by the retry that hands it to a handler now: a second retry of
// the same record leaves it alone while the claim lives.
func (k Keyspace) DeadRetrying(stream, group, id string) string {
	return k.base() + "dead-retrying:" + stream + ":" + group + ":" + id
}

// Attempts returns the key of a group's handler-start counts: a hash from
// stream id to how many times a handler was started for that entry, kept
// until the entry is acked or dead-lettered.
func (k Keyspace) Attempts(stream, group string) string {
	return k.base() + "attempts:" + stream + ":" + group
}

// Kinds returns the key of the queue's hash of stream kinds: stream name to
// the kind of branded id it holds, recorded by its first append.
func (k Keyspace) Kinds() string { return k.base() + "kinds" }

// Policies returns the key of the queue's hash of declared retention
// policies: stream name to the policy (JSON), set by `archiver policy set`.
func (k Keyspace) Policies() string { return k.base() + "policies" }

// PolicyRuns returns the key of the queue's hash of the last application of
// each stream's declared policy: stream name to its outcome (JSON).
func (k Keyspace) PolicyRuns() string { return k.base() + "policy-runs" }

// Adopted returns the key of the queue's hash of streams adopted under
// their own key (KeyspaceFor): the name silt's keys use to the stream's
// key, so that a scan of the queue (archiver run --all) finds them.
func (k Keyspace) Adopted() string { return k.base() + "adopted" }

// Own returns the stream's own key and the name silt's keys use for it,
// for a keyspace of KeyspaceFor; ok is false for silt's own streams.
func (k Keyspace) Own() (key, name string, ok bool) { return k.own, k.ownName, k.own != "" }

// RecordAdopted records ks's adopted stream in its queue's Adopted hash
// (nothing for a keyspace of silt's own streams). A key that holds another
// type is refused (ErrNotStream) and nothing is recorded.
func RecordAdopted(ctx context.Context, rdb Client, ks Keyspace) error {
	if ks.own == "" {
		return nil
	}
	if typ, err := rdb.Type(ctx, ks.own).Result(); err != nil {
		return fmt.Errorf("type of %s: %w", ks.own, err)
	} else if typ != "stream" && typ != "none" {
		return fmt.Errorf("%s holds a %s, not a stream; nothing was changed: %w", ks.own, typ, ErrNotStream)
	}
	if err := rdb.HSet(ctx, ks.Adopted(), ks.ownName, ks.own).Err(); err != nil {
		return fmt.Errorf("record the adoption of %s: %w", ks.own, err)
	}
	return nil
}

// AdoptedIn returns the keyspaces of the streams adopted in ks's queue, by
// the hash Adopted (RecordAdopted) holds; a field that no longer maps to
// a keyspace of this queue is left out.
func AdoptedIn(ctx context.Context, rdb Client, ks Keyspace) ([]Keyspace, error) {
	m, err := rdb.HGetAll(ctx, ks.Adopted()).Result()
	if err != nil {
		return nil, fmt.Errorf("streams adopted in %s: %w", ks.Adopted(), err)
	}
	var out []Keyspace
	for name, key := range m {
		own, ownName, err := KeyspaceFor(ks.Prefix, key)
		if err == nil && ownName == name && own.Queue == ks.Queue {
			out = append(out, own)
		}
	}
	return out, nil
}

// TrimmedUnarchived returns the key of the queue's hash of entries removed
// without an archive (archiver trim, trim-only policies): stream name to
// how many of them were above the archive's watermark, gone for good.
func (k Keyspace) TrimmedUnarchived() string { return k.base() + "trimmed-unarchived" }

// Archived returns the key of what Redis records of a stream's archive
// (deadGroup "" for the stream itself, else of that group's dead letters).
func (k Keyspace) Archived(stream, deadGroup string) string {
	if deadGroup != "" {
		return k.base() + "archive:" + stream + ":dead:" + deadGroup
	}
	return k.base() + "archive:" + stream
}

// StartWindows returns the key of a group's windows of first handler
// starts: per consumer, the range of stream ids of the batch in hand whose
// first starts are recorded as one (an entry in it that is still pending
// was started once unless its own record says more), or an open window
// written with a read not yet served (resolveWindowsLua).
func (k Keyspace) StartWindows(stream, group string) string {
	return k.base() + "windows:" + stream + ":" + group
}

// Key is a key of the layout above taken apart by ParseKey.
type Key struct {
	Keyspace
	// Type is the key's role: "stream", "dead", "done", "catchup", "lease",
	// "attempts", "windows", "replay", "replay-hold", "archive",
	// "dead-retried", "dead-retrying", "kinds", "policies", "policy-runs",
	// "trimmed-unarchived" or "adopted" (whose Queue is the hash tag of an
	// adopted key, any bytes a tag may hold).
	Type string
	// Stream is the stream the key belongs to ("" for the queue-wide keys).
	Stream string
	// Group is the consumer group (dead, done, catchup, lease, attempts,
	// windows; archive of a dead-letter stream) or the replay's name
	// (replay, replay-hold).
	Group string
	// ID is the branded id of a done marker, or the record id of a
	// dead-retrying claim.
	ID string
}

// ParseKey takes a key of the layout apart; ok is false when key is not
// one of silt's (a name is invalid, a part is missing or left over).
func ParseKey(key string) (k Key, ok bool) {
	prefix, rest, ok := strings.Cut(key, ":{")
	if !ok {
		return Key{}, false
	}
	queue, rest, ok := strings.Cut(rest, "}:")
	// The keys silt keeps for a stream adopted under its own key
	// (KeyspaceFor) are in the queue its hash tag names: the whole key when
	// it has no tag, app:events say, which no queue name could be. Every
	// type but a stream of silt's own can be in such a queue.
	if !ok || ValidateName("prefix", prefix) != nil || !isTag(queue) ||
		(ValidateName("queue", queue) != nil && strings.HasPrefix(rest, "stream:")) {
		return Key{}, false
	}
	k.Keyspace = Keyspace{Prefix: prefix, Queue: queue}
	parts := strings.Split(rest, ":")
	k.Type = parts[0]
	want := 0 // the number of parts the type has
	switch k.Type {
	case "kinds", "policies", "policy-runs", "trimmed-unarchived", "adopted":
		want = 1
	case "stream":
		want = 2
	case "dead", "catchup", "lease", "attempts", "windows", "replay", "replay-hold", "dead-retried":
		want = 3
	case "done", "dead-retrying":
		want = 4
	case "archive":
		want = 2
		if len(parts) == 4 && parts[2] == "dead" {
			parts = []string{parts[0], parts[1], parts[3]}
			want = 3
		}
	}
	if want == 0 || len(parts) != want {
		return Key{}, false
	}
	for i, name := range parts[1:] {
		if i < 2 && ValidateName("name", name) != nil || name == "" {
			return Key{}, false
		}
	}
	if want > 1 {
		k.Stream = parts[1]
	}
	if want > 2 {
		k.Group = parts[2]
	}
	if want > 3 {
		k.ID = parts[3]
	}
	return k, true
}
