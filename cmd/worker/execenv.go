package main

import (
	"net/url"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

// Exec handlers get a clean environment: the worker's holds the Redis URL
// with its password, S3 keys and the webhook secret, none of which a handler
// needs. These pass through, and the names given with --handler-env.
var baseHandlerEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM"}

// handlerEnv returns the environment of an exec handler: the base names,
// every LC_* locale variable, and allow, with the worker's values.
func handlerEnv(allow []string) []string {
	keep := map[string]bool{}
	for _, name := range append(baseHandlerEnv, allow...) {
		keep[strings.TrimSpace(name)] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if keep[name] || strings.HasPrefix(name, "LC_") {
			env = append(env, kv)
		}
	}
	return env
}

// secretsOf returns the secrets this worker holds, to be masked in what its
// handlers write on stderr: the Redis password, the webhook secret and the
// AWS secret keys.
func secretsOf(c *cli.Context) []string {
	var out []string
	for _, raw := range strings.Split(c.String("redis"), ",") {
		if u, err := url.Parse(strings.TrimSpace(raw)); err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok {
				out = append(out, pw)
			}
		} else if err != nil {
			out = append(out, raw) // unparsable: mask it whole
		}
	}
	out = append(out, c.String("webhook-secret"), os.Getenv("AWS_SECRET_ACCESS_KEY"), os.Getenv("AWS_SESSION_TOKEN"))
	kept := out[:0]
	for _, s := range out {
		if len(s) >= 4 { // shorter ones would mask ordinary words
			kept = append(kept, s)
		}
	}
	return kept
}

// masker replaces each secret in a text with "xxxxx".
type masker []string

func (m masker) mask(s string) string {
	for _, secret := range m {
		s = strings.ReplaceAll(s, secret, "xxxxx")
	}
	return s
}
