package clix

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"
)

// A --redis URL in go-redis's failover form (a Sentinel's address, the
// master's name, more Sentinels as addr parameters:
// redis://sentinel-a:26379/0?master_name=mymaster&addr=sentinel-b:26379)
// gives a client that asks the Sentinels for the master and follows a
// promotion. The URL's userinfo authenticates to the Sentinels; the
// master's user and password are the username and password parameters.
// With replica_only=true a reader reads from replicas (writes there fail:
// replicas are read-only).

// sentinelURL reports whether raw is go-redis's failover form: a Sentinel's
// address with master_name (redis.ParseFailoverURL).
func sentinelURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.Query().Has("master_name")
}

// openSentinel connects through Sentinel to the master it names (or, with
// replica_only, to its replicas): the client asks the Sentinels for the
// master and follows a promotion.
func openSentinel(ctx context.Context, c *cli.Context, raw string) (redis.UniversalClient, error) {
	o, err := redis.ParseFailoverURL(raw)
	if err != nil {
		return nil, Usagef("--redis", "%s: %v", Redact(raw), scrubSentinel(err, raw))
	}
	if o.MasterName == "" {
		return nil, Usagef("--redis", "%s: master_name is empty", Redact(raw))
	}
	if err := redisTLS(c, o.TLSConfig, raw); err != nil {
		return nil, err
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 3 * time.Second
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout, o.WriteTimeout = 5*time.Second, 5*time.Second
	}
	rdb := redis.NewFailoverClient(o)
	if err := ping(ctx, rdb, c.Duration(FlagRedisWait)); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis master %q through Sentinel at %s: %w", o.MasterName, Redact(raw), scrubSentinel(err, raw))
	}
	if err := checkEviction(ctx, c, rdb, nil); err != nil {
		rdb.Close()
		return nil, err
	}
	return rdb, nil
}

// scrubSentinel is scrub for a Sentinel URL, whose master password may be
// in its query.
func scrubSentinel(err error, raw string) error {
	err = scrub(err, raw)
	if u, perr := url.Parse(raw); perr == nil {
		if pw := u.Query().Get("password"); pw != "" && strings.Contains(err.Error(), pw) {
			return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
		}
	}
	return err
}
