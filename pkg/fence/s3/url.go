package s3

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
)

// ParseURL reads an s3 store URL:
//
//	s3://bucket[/prefix]?endpoint=URL&region=R&path-style=true|false&consistent=true|false&timeout=D
//	    &sse=aws:kms|AES256&sse-kms-key-id=ID&sse-c-key-file=PATH
//
// Errors wrap fence.ErrBadURL, say which part is wrong, and never show a
// password.
func ParseURL(raw string) (Config, error) {
	u, err := fence.ParseURL(raw)
	if err != nil {
		return Config{}, err
	}
	if u.Scheme != "s3" {
		return Config{}, fmt.Errorf("%w: scheme %q is not s3", fence.ErrBadURL, u.Scheme)
	}
	return FromURL(u)
}

// OpenURL opens the store of an s3 URL; with fence.ReadWrite it also
// probes that the store refuses a second create of one key (fence.Probe).
func OpenURL(ctx context.Context, raw string, mode fence.Mode) (*Store, error) {
	cfg, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	st, err := Open(ctx, cfg)
	if err != nil || mode != fence.ReadWrite {
		return st, err
	}
	if err := fence.Probe(ctx, st); err != nil {
		return nil, err
	}
	return st, nil
}

// FromURL reads the Config of an s3 URL that fence.ParseURL accepted.
func FromURL(u *url.URL) (Config, error) {
	if u.Host == "" {
		return Config{}, fmt.Errorf("%w: s3 URL without a bucket: want s3://bucket/prefix", fence.ErrBadURL)
	}
	if u.User != nil {
		return Config{}, fmt.Errorf("%w: s3 URL with credentials: use the AWS environment variables or a profile", fence.ErrBadURL)
	}
	cfg := Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
	if cfg.Prefix != "" {
		if err := fence.CheckKey(cfg.Prefix); err != nil {
			if strings.ContainsAny(cfg.Prefix, "@:") { // userinfo in the wrong place: not echoed
				return Config{}, fmt.Errorf("%w: the s3 prefix holds ':' or '@' (credentials in the wrong place?); it is not shown", fence.ErrBadURL)
			}
			return Config{}, fmt.Errorf("%w: s3 prefix: %v", fence.ErrBadURL, err)
		}
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "endpoint", "region", "path-style", "consistent", "timeout", "sse", "sse-kms-key-id", "sse-c-key-file":
		default:
			const want = "(want endpoint, region, path-style, consistent, timeout, sse, sse-kms-key-id, sse-c-key-file)"
			if strings.ContainsAny(k, "@:") { // userinfo in the wrong place: not echoed
				return Config{}, fmt.Errorf("%w: an unknown s3 URL parameter holds ':' or '@' (credentials in the wrong place?); it is not shown %s", fence.ErrBadURL, want)
			}
			return Config{}, fmt.Errorf("%w: unknown s3 URL parameter %q %s", fence.ErrBadURL, k, want)
		}
	}
	cfg.Endpoint, cfg.Region = q.Get("endpoint"), q.Get("region")
	if cfg.Endpoint != "" {
		ep, err := url.Parse(cfg.Endpoint)
		switch {
		case strings.Contains(cfg.Endpoint, "@"):
			// Credentials come from the AWS variables; an endpoint holding
			// some is refused and never echoed.
			return Config{}, fmt.Errorf("%w: the endpoint holds an '@' (credentials?); it is not shown: give keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", fence.ErrBadURL)
		case err != nil || (ep.Scheme != "http" && ep.Scheme != "https") || ep.Host == "":
			return Config{}, fmt.Errorf("%w: endpoint %q is not an http:// or https:// URL", fence.ErrBadURL, cfg.Endpoint)
		}
	}
	if err := parseSSE(q, &cfg); err != nil {
		return Config{}, err
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	// Tigris evaluates conditional writes on the leader only when asked to.
	cfg.Consistent = strings.HasSuffix(hostOf(cfg.Endpoint), ".tigris.dev")
	if c := q.Get("consistent"); c != "" {
		b, err := strconv.ParseBool(c)
		if err != nil {
			return Config{}, fmt.Errorf("%w: consistent=%q is not true or false", fence.ErrBadURL, c)
		}
		cfg.Consistent = b
	}
	if t := q.Get("timeout"); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d <= 0 {
			return Config{}, fmt.Errorf("%w: timeout=%q is not a positive duration such as 10s", fence.ErrBadURL, t)
		}
		cfg.Timeout = d
	}
	if ps := q.Get("path-style"); ps != "" {
		b, err := strconv.ParseBool(ps)
		if err != nil {
			return Config{}, fmt.Errorf("%w: path-style=%q is not true or false", fence.ErrBadURL, ps)
		}
		cfg.PathStyle = b
	}
	return cfg, nil
}

func hostOf(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// parseSSE reads the server-side encryption parameters of an s3 URL:
// sse=aws:kms (with sse-kms-key-id, or the bucket's default key) or
// sse=AES256, or sse-c-key-file=PATH (a 32-byte key, raw or base64, kept
// out of the URL), which is sent with every request.
func parseSSE(q url.Values, cfg *Config) error {
	cfg.SSE, cfg.SSEKMSKeyID = q.Get("sse"), q.Get("sse-kms-key-id")
	switch {
	case cfg.SSE != "" && cfg.SSE != "aws:kms" && cfg.SSE != "AES256":
		return fmt.Errorf("%w: sse=%q: want aws:kms or AES256", fence.ErrBadURL, cfg.SSE)
	case cfg.SSEKMSKeyID != "" && cfg.SSE != "aws:kms":
		return fmt.Errorf("%w: sse-kms-key-id needs sse=aws:kms", fence.ErrBadURL)
	}
	path := q.Get("sse-c-key-file")
	if path == "" {
		return nil
	}
	if cfg.SSE != "" {
		return fmt.Errorf("%w: sse-c-key-file and sse= exclude each other", fence.ErrBadURL)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: sse-c-key-file: %v", fence.ErrBadURL, err)
	}
	if k, derr := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b))); derr == nil && len(k) == 32 {
		b = k
	}
	if len(b) != 32 {
		return fmt.Errorf("%w: sse-c-key-file %s: want 32 bytes (raw or base64)", fence.ErrBadURL, path)
	}
	cfg.SSECustomerKey = b
	return nil
}
