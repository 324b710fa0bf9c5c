package testserver

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// SiltACL is the Redis ACL rule of the user silt runs as: its commands and
// nothing else, on keys under the default prefix only. docs/security.md
// shows the same rule (a test keeps them equal); every test redis-server
// has this user, and URL() connects as it, so the end-to-end tests run
// with exactly these rights.
const SiltACL = "on resetkeys ~emq:* resetchannels -@all " +
	"+@stream +multi +exec +discard +watch +unwatch " +
	"+eval +evalsha +script|load +script|exists " +
	"+get +set +del +exists +type +pexpire +rpush +lrange +llen +lindex +lset +lrem +hget +hset +hsetnx +hincrby +hdel +hmget +hgetall +hlen +hscan " +
	"+ping +hello +auth +select +info +wait +scan " +
	"+cluster|slots +cluster|shards +cluster|nodes +readonly +command"

// SiltUser is the name of that user.
const SiltUser = "silt"

var (
	secretsMu sync.Mutex
	secrets   []string
)

// newPassword returns a fresh password that reads as a canary: tests check
// that it never shows in output, logs or errors (see Secrets).
func newPassword() string {
	var b [8]byte
	rand.Read(b[:])
	return Canary("canary-" + hex.EncodeToString(b[:]))
}

// Canary records s as a secret of this test process and returns it.
func Canary(s string) string {
	secretsMu.Lock()
	secrets = append(secrets, s)
	secretsMu.Unlock()
	return s
}

// Secrets returns every secret this process handed out (Redis passwords,
// canaries), for checks that none of them was printed.
func Secrets() []string {
	secretsMu.Lock()
	defer secretsMu.Unlock()
	return slices.Clone(secrets)
}

// userArgs are the redis-server arguments that create the silt user (on
// the command line, each rule is an argument of its own).
func userArgs(password string) []string {
	rules := strings.Fields(strings.Replace(SiltACL, "on ", "on >"+password+" ", 1))
	return append([]string{"--user", SiltUser}, rules...)
}

// userURL returns scheme://silt:password@addr/0.
func userURL(scheme, addr, password string) string {
	u := url.URL{Scheme: scheme, User: url.UserPassword(SiltUser, password), Host: addr, Path: "/0"}
	return u.String()
}
