// Command producer appends entries to a silt stream with branded ids, from
// Go with go-redis alone (no silt import).
//
//	REDIS_URL=redis://127.0.0.1:6379/0 STREAM='emq:{cm}:stream:events' \
//	KIND=EVT go run ./docs/producers/go N   # prints each entry's branded id
//
// The branded id is the stream id, field by field: KIND_ then the
// milliseconds (10 digits) and the sequence (13 digits) in Crockford's base32.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

const alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

func b32(v uint64, width int) string {
	b := make([]byte, width)
	for i := width - 1; i >= 0; i, v = i-1, v>>5 {
		b[i] = alphabet[v&31]
	}
	return string(b)
}

func branded(kind string, ms, seq uint64) string { return kind + "_" + b32(ms, 10) + b32(seq, 13) }

// minter's successive mints strictly increase, even if the clock steps back.
type minter struct {
	kind    string
	ms, seq uint64
	started bool
}

func (m *minter) next() (uint64, uint64) {
	if now := uint64(time.Now().UnixMilli()); !m.started || now > m.ms {
		m.ms, m.seq, m.started = max(now, m.ms), 0, true
	} else {
		m.seq++
	}
	return m.ms, m.seq
}

// past moves the minter past top, another writer's newest id.
func (m *minter) past(top string) {
	a, b, _ := strings.Cut(top, "-")
	ms, _ := strconv.ParseUint(a, 10, 64)
	seq, _ := strconv.ParseUint(b, 10, 64)
	if ms > m.ms || ms == m.ms && seq >= m.seq {
		m.ms, m.seq = ms, seq
	}
}

func appendEntry(ctx context.Context, rdb *redis.Client, stream string, m *minter, fields map[string]any) (string, error) {
	for {
		ms, seq := m.next()
		id := branded(m.kind, ms, seq)
		values := map[string]any{"id": id}
		for k, v := range fields {
			values[k] = v
		}
		err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("%d-%d", ms, seq), Values: values}).Err()
		if err == nil {
			return id, nil
		}
		if !strings.Contains(err.Error(), "equal or smaller") {
			return "", err
		}
		info, err := rdb.XInfoStream(ctx, stream).Result()
		if err != nil {
			return "", err
		}
		m.past(info.LastGeneratedID)
	}
}

func main() {
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	kind := os.Getenv("KIND")
	if kind == "" {
		kind = "EVT"
	}
	n, _ := strconv.Atoi(os.Args[1])
	m := &minter{kind: kind}
	for i := range n {
		id, err := appendEntry(context.Background(), rdb, os.Getenv("STREAM"), m, map[string]any{"lang": "go", "n": strconv.Itoa(i)})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(id)
	}
}
