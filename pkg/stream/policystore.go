package stream

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// PolicyStore holds what silt records in Redis about a queue's retention,
// per stream name: each stream's declared policy and the outcome of its
// last application (opaque JSON, which package archive gives a meaning),
// and how many entries trims without an archive removed above the
// archive's watermark. Keys: Keyspace.Policies, PolicyRuns and
// TrimmedUnarchived, in the queue's hash slot.
type PolicyStore struct {
	rdb Client
	ks  Keyspace
}

// NewPolicyStore returns the policy store of the queue ks names.
func NewPolicyStore(rdb Client, ks Keyspace) PolicyStore { return PolicyStore{rdb, ks} }

// Policies returns the log's queue's policy store.
func (l *Log) Policies() PolicyStore { return PolicyStore{l.rdb, l.ks} }

// Keyspace returns the keyspace of the store's queue.
func (p PolicyStore) Keyspace() Keyspace { return p.ks }

// Policy returns stream name's declared policy; ok is false when none is.
func (p PolicyStore) Policy(ctx context.Context, name string) (b []byte, ok bool, err error) {
	return p.get(ctx, p.ks.Policies(), "policy", name)
}

// AllPolicies returns every declared policy of the queue, by stream name.
func (p PolicyStore) AllPolicies(ctx context.Context) (map[string][]byte, error) {
	m, err := p.rdb.HGetAll(ctx, p.ks.Policies()).Result()
	if err != nil {
		return nil, fmt.Errorf("policies of queue %s: %w", p.ks.Queue, err)
	}
	out := make(map[string][]byte, len(m))
	for name, v := range m {
		out[name] = []byte(v)
	}
	return out, nil
}

// SetPolicy records stream name's declared policy, replacing any. A stream
// adopted under its own key is recorded as adopted too (RecordAdopted), so
// that a scan of its queue finds it and applies the policy.
func (p PolicyStore) SetPolicy(ctx context.Context, name string, b []byte) error {
	if err := p.rdb.HSet(ctx, p.ks.Policies(), name, b).Err(); err != nil {
		return fmt.Errorf("declare the policy of %s: %w", p.ks.Stream(name), err)
	}
	if _, own, ok := p.ks.Own(); ok && own == name {
		return RecordAdopted(ctx, p.rdb, p.ks)
	}
	return nil
}

// RemovePolicy removes stream name's policy and the record of its last
// run; ok is false when it had none.
func (p PolicyStore) RemovePolicy(ctx context.Context, name string) (ok bool, err error) {
	n, err := p.rdb.HDel(ctx, p.ks.Policies(), name).Result()
	if err != nil {
		return false, fmt.Errorf("remove the policy of %s: %w", p.ks.Stream(name), err)
	}
	p.rdb.HDel(ctx, p.ks.PolicyRuns(), name)
	return n == 1, nil
}

// LastRun returns the record of the last application of stream name's
// policy; ok is false when none is recorded.
func (p PolicyStore) LastRun(ctx context.Context, name string) (b []byte, ok bool, err error) {
	return p.get(ctx, p.ks.PolicyRuns(), "last policy run", name)
}

// SetLastRun records the last application of stream name's policy.
func (p PolicyStore) SetLastRun(ctx context.Context, name string, b []byte) error {
	if err := p.rdb.HSet(ctx, p.ks.PolicyRuns(), name, b).Err(); err != nil {
		return fmt.Errorf("record the policy run of %s: %w", p.ks.Stream(name), err)
	}
	return nil
}

// AddTrimmedUnarchived adds n to the entries of stream name that a trim
// without an archive removed above the archive's watermark.
func (p PolicyStore) AddTrimmedUnarchived(ctx context.Context, name string, n int64) error {
	if err := p.rdb.HIncrBy(ctx, p.ks.TrimmedUnarchived(), name, n).Err(); err != nil {
		return fmt.Errorf("record the entries of %s removed without an archive: %w", p.ks.Stream(name), err)
	}
	return nil
}

// TrimmedUnarchived returns the entries of stream name that trims without
// an archive removed above the archive's watermark.
func (p PolicyStore) TrimmedUnarchived(ctx context.Context, name string) (int64, error) {
	n, err := p.rdb.HGet(ctx, p.ks.TrimmedUnarchived(), name).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("entries of %s removed without an archive: %w", p.ks.Stream(name), err)
	}
	return n, nil
}

func (p PolicyStore) get(ctx context.Context, key, what, name string) ([]byte, bool, error) {
	b, err := p.rdb.HGet(ctx, key, name).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("%s of %s: %w", what, p.ks.Stream(name), err)
	}
	return b, true, nil
}
