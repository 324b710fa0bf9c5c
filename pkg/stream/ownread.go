package stream

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// ownReads is a consumer's reads on a connection of its own (ownConn):
// each XREADGROUP, and the acks of the batch before that go with it,
// written in one write, the reply read off the socket straight into the
// buffer its entries are cut from. The connection is dialled by the first
// read of a run and closed by release. A read that finds it in use (reads
// are one at a time but for a drain beside a read ahead), or that cannot
// have one (a cluster client), goes through go-redis, as do the reads
// while one that failed waits to be dialled again (ownSlot).
type ownReads struct {
	mu   sync.Mutex
	slot ownSlot
}

// take returns the connection, held until done is called, or nil.
func (o *ownReads) take(ctx context.Context, c Client) (conn *ownConn, done func()) {
	if !o.mu.TryLock() {
		return nil, nil
	}
	if conn = o.slot.get(ctx, c); conn == nil { // none: go-redis's way
		o.mu.Unlock()
		return nil, nil
	}
	return conn, o.mu.Unlock
}

// fail gives the connection up; called while it is held.
func (o *ownReads) fail() { o.slot.fail() }

// close closes the connection once no read holds it; the next run dials
// again.
func (o *ownReads) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.slot.drop()
}

// readOwn sends acks (none: no XACK), this consumer's window of first
// starts when window is not "" (windowValue), and an XREADGROUP from
// after on the group's own connection and reads the messages. ok is false
// when the read did not go there (no connection to be had, or it failed on
// the network): send them again through go-redis; acks sent twice ack
// once, a window set twice is set, and entries a lost reply delivered wait
// in this consumer's pending list, as after a read go-redis sent again
// itself. An error reply to the read is read again through Do, whose error
// is go-redis's.
func (g *redisGroup) readOwn(ctx context.Context, after string, block time.Duration, count int64, acks ackSet, window string) (msgs []message, ackErr, windowErr, err error, ok bool) {
	conn, done := g.own.take(ctx, g.rdb)
	if conn == nil {
		return nil, nil, nil, nil, false
	}
	defer done()
	var cmds [][]string
	if len(acks.ids) > 0 {
		cmds = append(cmds, append([]string{"XACK", g.key, g.group}, acks.ids...))
		if len(acks.records) > 0 {
			cmds = append(cmds, append([]string{"HDEL", g.attempts}, acks.records...))
		}
	}
	carry := window != ""
	if carry && sentEarly {
		// Negative control: says the window goes with the read, and
		// writes it late.
		carry = false
		go func() {
			time.Sleep(100 * time.Millisecond)
			g.rdb.HSet(context.WithoutCancel(ctx), g.windows, g.consumer, window)
		}()
	}
	if carry {
		cmds = append(cmds, []string{"HSET", g.windows, g.consumer, window})
	}
	read := xreadgroupArgs(g.group, g.consumer, g.key, after, count, block)
	cmds = append(cmds, read)
	replies, err := conn.do(ctx, block, g.replies.sizeLikeLast(count), cmds...)
	if err != nil {
		g.own.fail()
		return nil, nil, nil, nil, false
	}
	if carry {
		if err := replyError(replies[len(replies)-2]); err != nil {
			windowErr = g.windowError(window, err)
		}
	}
	if len(acks.ids) > 0 {
		if err := replyError(replies[0]); err != nil {
			return nil, fmt.Errorf("ack %d entries in %s %s: %w", len(acks.ids), g.key, g.group, err), windowErr, nil, true
		}
	}
	b := replies[len(replies)-1]
	if b[0] == '-' {
		args := make([]any, len(read))
		for i, a := range read {
			args[i] = a
		}
		msgs, err = readReply(g.rdb.Do(ctx, args...))
		return msgs, nil, windowErr, err, true
	}
	r := &resp{s: unsafe.String(&b[0], len(b))}
	msgs, err = r.messages()
	g.replies.learn(len(b), len(msgs))
	return msgs, nil, windowErr, err, true
}
