package stream

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/failpoint"
)

// Consumer runs one short-lived worker over a consumer group: it drains its
// own pending entries, reclaims entries idle peers left behind, reads new
// entries, and returns when the work is done or its budget is spent. Set the
// exported fields before Run; zero values take the defaults shown.
type Consumer struct {
	Count         int64         // entries per read; 0: adaptive, from 100 up to 1,000 while batches are handled quickly (run.adapt)
	Block         time.Duration // how long a read of new entries waits; 2s
	MinIdle       time.Duration // idle time (judged by the server) after which a peer's entry is reclaimed; 30s
	ClaimEvery    time.Duration // period of the reclaim beat; MinIdle/10, so a dead peer's entries move within 1.1 × MinIdle
	MaxAttempts   int64         // deliveries before an entry is dead-lettered; 5
	MaxEntryBytes int           // entries larger than this (EntryBytes) are dead-lettered unhandled, without their payload; 0: no limit
	MaxEntries    int64         // stop after handling this many deliveries; 0 means no limit
	MaxDuration   time.Duration // stop after this long; 0 means no limit
	Concurrency   int           // handlers of one batch run in parallel; 1
	DedupeTTL     time.Duration // when set, entries already handled by the group are acked unhandled
	Grace         time.Duration // how long in-flight handlers may finish after cancellation; 10s
	ForgetAfter   time.Duration // remove consumers with nothing pending idle this long; 24h; negative: never
	WriteTimeout  time.Duration // bound on acks and dead letters written after cancellation; 10s
	Payloads      PayloadSource // recovers entries trimmed while pending; nil: dead-letter them. A History also catches up lagging groups
	LeaseTTL      time.Duration // how long a catch-up lease, or a dead letter retry's claim, lasts without renewal; 30s
	Logger        *slog.Logger  // where the run reports what it skips or removes; discard by default
	// Progress, when set, is called on the run's goroutine after each batch
	// is settled, with the run's counts so far and the batch's size (metrics
	// take their deltas from it). It must return quickly.
	Progress func(sum Summary, batch int)
	// HandlerBegins says the handler tells when its work begins: a start
	// is then recorded when the handler calls Delivery.Begin (or returns
	// without calling it), each on its own, rather than before the handler
	// is called. A handler that must get ready before it can take its entry
	// (an exec handler creating its process) sets it: a worker killed while
	// the handler was getting ready counts no start, where a start recorded
	// before it counted one for a handler that never ran.
	HandlerBegins bool
	// Admit, when set, is called by each of the Concurrency workers before
	// it takes its next entry and records that entry's start: a handler
	// that can take only so many entries yet holds workers there (a
	// co-process still starting takes one), so no start is counted for an
	// entry it would only have queued. An error (ctx done) ends that worker
	// for the batch; what it did not take stays pending, its start not
	// counted.
	Admit func(ctx context.Context) error

	// Failpoint, when set, is called at the points of each batch (package
	// failpoint lists them): crash tests kill the process exactly there.
	Failpoint failpoint.Func

	log   *Log
	dead  *Log
	group string
	name  string
	io    groupIO // all the run says to Redis (groupio.go)
}

// NewConsumer returns consumer name of group on the log's stream.
func NewConsumer(l *Log, group, name string) (*Consumer, error) {
	if err := ValidateName("group", group); err != nil {
		return nil, err
	}
	if err := ValidateName("consumer", name); err != nil {
		return nil, err
	}
	dead, err := l.DeadLetters(group)
	if err != nil {
		return nil, err
	}
	c := &Consumer{log: l, dead: dead, group: group, name: name, io: newRedisGroup(l, dead, group, name)}
	c.defaults()
	return c, nil
}

// Log returns the stream the consumer reads.
func (c *Consumer) Log() *Log { return c.log }

// Group returns the consumer group's name.
func (c *Consumer) Group() string { return c.group }

// Name returns the consumer's name.
func (c *Consumer) Name() string { return c.name }

// DeadLetterLog returns the group's dead-letter log.
func (c *Consumer) DeadLetterLog() *Log { return c.dead }

// Defaults of the Consumer's fields, the values a zero field takes (the
// worker's flags default to them too).
const (
	DefaultBlock        = 2 * time.Second
	DefaultMinIdle      = 30 * time.Second
	DefaultMaxAttempts  = 5
	DefaultConcurrency  = 1
	DefaultGrace        = 10 * time.Second
	DefaultForgetAfter  = 24 * time.Hour
	DefaultWriteTimeout = 10 * time.Second
	DefaultLeaseTTL     = 30 * time.Second // long enough for a batch of handlers
)

// defaults fills zero fields with their defaults.
func (c *Consumer) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Block, DefaultBlock)
	def(&c.MinIdle, DefaultMinIdle)
	if c.ClaimEvery <= 0 || c.ClaimEvery > c.MinIdle {
		// An entry becomes claimable MinIdle after its peer died, at any
		// phase of our beat: beating every MinIdle would take up to 2 ×
		// MinIdle to move it (BenchmarkDeadPeerRecovery_Ratio measured
		// 1.58); MinIdle/10 bounds it to 1.1.
		c.ClaimEvery = max(c.MinIdle/10, time.Millisecond)
	}
	def(&c.Grace, DefaultGrace)
	def(&c.ForgetAfter, DefaultForgetAfter)
	def(&c.WriteTimeout, DefaultWriteTimeout)
	def(&c.LeaseTTL, DefaultLeaseTTL)
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Run works until the group has nothing left for this consumer, the budget
// is spent, or ctx is cancelled, and returns what it did. After cancellation
// in-flight handlers get Grace to finish; unfinished entries stay pending.
// An error means Redis failed; the summary still counts what was done.
func (c *Consumer) Run(ctx context.Context, h Handler) (Summary, error) {
	c.defaults()
	r := newRun(c, h)
	defer c.io.release()
	err := r.loop(ctx)
	if ferr := r.ack.flush(ctx); err == nil {
		err = ferr
	}
	if err == nil { // else the acks may not be through: the window still counts
		r.dropWindow(ctx)
	}
	r.finish()
	if err != nil {
		r.sum.ExitReason = ExitError
	}
	return r.sum, err
}

// EnsureGroup creates the group at the start of the stream (and the stream
// if missing). An existing group is fine.
func (c *Consumer) EnsureGroup(ctx context.Context) error { return c.io.ensureGroup(ctx) }

// ForgetStale removes consumers of the group, other than this one, that have
// nothing pending and have been idle longer than ForgetAfter. It returns how
// many it removed.
func (c *Consumer) ForgetStale(ctx context.Context) (int64, error) {
	if c.ForgetAfter < 0 {
		return 0, nil
	}
	removed, err := c.io.forgetIdle(ctx, c.ForgetAfter)
	for _, name := range removed {
		c.Logger.Info("removed stale consumer", "group", c.group, "consumer", name, "idle_over", c.ForgetAfter.String())
	}
	return int64(len(removed)), err
}

func (c *Consumer) failpoint(name failpoint.Name) {
	if c.Failpoint != nil {
		c.Failpoint(name)
	}
}

// isNil reports whether err is go-redis's "no reply" (an empty read).
func isNil(err error) bool { return errors.Is(err, redis.Nil) }
