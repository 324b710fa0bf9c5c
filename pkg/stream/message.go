package stream

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// message is one entry as a read of the group returned it, decoded once
// from the server's reply: its stream id and its fields, "id" included.
// Fields is nil for an entry deleted from the stream while pending. The
// run's decode (handle.go) takes "id" out of Fields in place: the map the
// handler gets is the one the reply was decoded into.
type message struct {
	ID     string
	Fields Fields
	bytes  int // its names' and values' bytes, "id" included, when the reply's parse counted them (resp.messages); else 0
}

// xreadgroup builds an XREADGROUP of one stream. block < 0: no BLOCK.
func xreadgroup(group, consumer, key, from string, count int64, block time.Duration) []any {
	args := make([]any, 0, 11)
	for _, a := range xreadgroupArgs(group, consumer, key, from, count, block) {
		args = append(args, a)
	}
	return args
}

// xreadgroupArgs is xreadgroup's command as strings (ownConn's).
func xreadgroupArgs(group, consumer, key, from string, count int64, block time.Duration) []string {
	args := make([]string, 0, 11)
	args = append(args, "XREADGROUP", "GROUP", group, consumer, "COUNT", strconv.FormatInt(count, 10))
	if block >= 0 {
		args = append(args, "BLOCK", strconv.FormatInt(block.Milliseconds(), 10))
	}
	return append(args, "STREAMS", key, from)
}

// readReply decodes the reply of an XREADGROUP of one stream, RESP2
// ([[key, entries]]) or RESP3 ({key: entries}); a nil reply is no entries.
func readReply(cmd *redis.Cmd) ([]message, error) {
	reply, err := cmd.Result()
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		return nil, err
	}
	switch r := reply.(type) {
	case nil:
		return nil, nil
	case map[any]any: // RESP3
		for _, entries := range r {
			return entryMessages(entries)
		}
		return nil, nil
	case []any: // RESP2
		if len(r) == 0 {
			return nil, nil
		}
		s, ok := r[0].([]any)
		if !ok || len(s) != 2 {
			return nil, fmt.Errorf("unexpected XREADGROUP reply %T", r[0])
		}
		return entryMessages(s[1])
	}
	return nil, fmt.Errorf("unexpected XREADGROUP reply %T", reply)
}

// entryMessages decodes a list of [id, [name, value, ...]] (an XREADGROUP
// or XAUTOCLAIM reply's entries, or a script's) into messages, each with
// the one map its fields go into.
func entryMessages(reply any) ([]message, error) {
	entries, _ := reply.([]any)
	out := make([]message, len(entries))
	for i, e := range entries {
		pair, ok := e.([]any)
		if !ok || len(pair) != 2 {
			return nil, fmt.Errorf("unexpected entry %T in a stream reply", e)
		}
		id, ok := pair[0].(string)
		if !ok {
			return nil, fmt.Errorf("unexpected entry id %T in a stream reply", pair[0])
		}
		out[i].ID = id
		kv, _ := pair[1].([]any)
		if kv == nil {
			continue // deleted while pending
		}
		f := make(Fields, len(kv)/2)
		for j := 0; j+1 < len(kv); j += 2 {
			k, _ := kv[j].(string)
			f[k] = str(kv[j+1])
		}
		out[i].Fields = f
	}
	return out, nil
}

// fromXMessages converts go-redis's messages (a blocking read's, an
// XAUTOCLAIM's) into messages.
func fromXMessages(msgs []redis.XMessage) []message {
	out := make([]message, len(msgs))
	for i, m := range msgs {
		out[i].ID = m.ID
		if m.Values == nil {
			continue
		}
		f := make(Fields, len(m.Values))
		for k, v := range m.Values {
			f[k] = str(v)
		}
		out[i].Fields = f
	}
	return out
}

// str is a reply value as text.
func str(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// readTimeoutOf is how long the client waits for a reply: its ReadTimeout
// as go-redis normalized it, or, when that sets none, go-redis's default of
// 5 s (a cluster's node clients take that default then); 0 when the client
// does not say.
func readTimeoutOf(c Client) time.Duration {
	var d time.Duration
	switch c := c.(type) {
	case *redis.Client:
		d = c.Options().ReadTimeout
	case *redis.ClusterClient:
		d = c.Options().ReadTimeout
	default:
		return 0
	}
	if d <= 0 {
		return 5 * time.Second
	}
	return d
}
