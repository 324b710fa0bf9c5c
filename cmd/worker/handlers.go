package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/internal/jsonx"
	"github.com/silt-dev/silt/pkg/stream"
)

// deliveryDoc is a delivery as one JSON document: the exec handler's stdin,
// the webhook's body and the --stdout line.
type deliveryDoc struct {
	ID         string            `json:"id"`
	StreamID   string            `json:"stream_id"`
	Attempts   int64             `json:"attempts"`   // handler starts, this one included
	Deliveries int64             `json:"deliveries"` // times Redis handed the entry out
	Group      string            `json:"group"`
	Consumer   string            `json:"consumer"`
	Payload    map[string]string `json:"payload"`
	// PayloadBase64 holds the fields whose name or value is not UTF-8, both
	// base64 encoded (JSON strings cannot carry raw bytes).
	PayloadBase64 map[string]string `json:"payload_base64,omitempty"`
	Recovered     bool              `json:"recovered,omitempty"`
	Replay        string            `json:"replay,omitempty"`
	// Traceparent is the handler span's W3C trace context, for --pipe
	// (exec handlers get TRACEPARENT in their environment instead).
	Traceparent string `json:"traceparent,omitempty"`
}

func encodeDelivery(d stream.Delivery) ([]byte, error) {
	return appendDelivery(make([]byte, 0, 256), deliveryDocOf(d)), nil
}

// appendDelivery writes doc as encoding/json would (TestAppendDelivery), at
// a fraction of the cost: every handler call writes one.
func appendDelivery(b []byte, doc deliveryDoc) []byte {
	b = append(b, `{"id":`...)
	b = jsonx.AppendString(b, doc.ID)
	b = append(b, `,"stream_id":`...)
	b = jsonx.AppendString(b, doc.StreamID)
	b = append(b, `,"attempts":`...)
	b = jsonx.AppendInt(b, doc.Attempts)
	b = append(b, `,"deliveries":`...)
	b = jsonx.AppendInt(b, doc.Deliveries)
	b = append(b, `,"group":`...)
	b = jsonx.AppendString(b, doc.Group)
	b = append(b, `,"consumer":`...)
	b = jsonx.AppendString(b, doc.Consumer)
	b = append(b, `,"payload":`...)
	b = jsonx.AppendStringMap(b, doc.Payload)
	if len(doc.PayloadBase64) > 0 {
		b = append(b, `,"payload_base64":`...)
		b = jsonx.AppendStringMap(b, doc.PayloadBase64)
	}
	if doc.Recovered {
		b = append(b, `,"recovered":true`...)
	}
	if doc.Replay != "" {
		b = append(b, `,"replay":`...)
		b = jsonx.AppendString(b, doc.Replay)
	}
	if doc.Traceparent != "" {
		b = append(b, `,"traceparent":`...)
		b = jsonx.AppendString(b, doc.Traceparent)
	}
	return append(b, '}')
}

func deliveryDocOf(d stream.Delivery) deliveryDoc {
	text, b64 := stream.SplitBinary(d.Fields)
	if text == nil {
		text = map[string]string{}
	}
	return deliveryDoc{
		ID: d.ID.String(), StreamID: d.StreamID.String(), Attempts: d.Attempts, Deliveries: d.Deliveries, Group: d.Group, Consumer: d.Consumer,
		Payload: text, PayloadBase64: b64, Recovered: d.Recovered, Replay: d.Replay,
	}
}

// exDataErr (EX_DATAERR from sysexits.h) is the exit status by which an exec
// handler says the entry itself is bad: dead-letter it now.
const exDataErr = 65

// execHandler runs argv once per delivery with the delivery on stdin. Exit 0
// acks; 65 dead-letters; anything else, a signal or the timeout leaves the
// entry pending. The child's stderr is logged with the entry id, secrets
// masked. The child runs with env (handlerEnv) in its own process group,
// killed whole on timeout or cancellation (ownGroup).
func execHandler(argv []string, timeout time.Duration, env []string, secrets masker, log *slog.Logger) stream.Handler {
	return func(ctx context.Context, d stream.Delivery) error {
		doc, err := encodeDelivery(d)
		if err != nil {
			return stream.Permanent(err)
		}
		parent := ctx
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = env
		if tp := traceparentOf(ctx); tp != "" { // the entry's trace, continued by the handler
			cmd.Env = append(slices.Clip(env), "TRACEPARENT="+tp)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &limitedWriter{w: &stderr, n: 64 << 10}
		cmd.WaitDelay = time.Second
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return fmt.Errorf("run handler: %w", err)
		}
		release, err := startOwned(cmd)
		if err == nil {
			if err = giveEntry(cmd, stdin, d, doc); err != nil {
				release()
				return err
			}
			err = cmd.Wait()
			release()
		}
		s := strings.TrimSpace(stderr.String())
		if s != "" {
			log.Info("handler stderr", "id", d.ID.String(), "stderr", secrets.mask(s))
		}
		if parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("handler timed out after %s (--handler-timeout)", timeout)
		} else {
			err = execResult(ctx, err)
		}
		if err != nil && s != "" { // the reason, in the log line and the dead letter
			err = fmt.Errorf("%w; last stderr line: %s", err, secrets.mask(lastLine(s)))
		}
		return err
	}
}

// giveEntry hands a started handler process its entry: its start is
// recorded first (Delivery.Begin; the Consumer runs exec handlers with
// HandlerBegins), so a worker killed while the process was being created
// counts no start for it. A refused record kills the process before it
// has read anything. A process that exits without reading its input is
// no error here: its exit status says how it went.
func giveEntry(cmd *exec.Cmd, stdin io.WriteCloser, d stream.Delivery, doc []byte) error {
	if err := d.Begin(); err != nil {
		cmd.Cancel()
		cmd.Wait()
		return err
	}
	stdin.Write(doc)
	stdin.Close()
	return nil
}

// lastLine is the last line of s, at most 300 bytes of it.
func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

func execResult(ctx context.Context, err error) error {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("handler stopped: %w", context.Cause(ctx))
	case errors.As(err, &ee) && ee.ExitCode() == exDataErr:
		return stream.Permanent(fmt.Errorf("handler exited %d (EX_DATAERR)", exDataErr))
	case errors.As(err, &ee):
		return fmt.Errorf("handler %v", ee.ProcessState)
	}
	return fmt.Errorf("run handler: %w", err)
}

// limitedWriter keeps the first n bytes and drops the rest.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// webhookHandler POSTs each delivery. 2xx acks; a 3xx (never followed: a
// redirect would turn the POST into a bodyless GET whose 200 acks an entry
// never delivered, or send the payload and its signature to a host nobody
// configured) and a 4xx other than 408, 425 and 429 dead-letter with the
// status; anything else, after bounded retries with backoff, leaves the
// entry pending. timeout bounds the whole call, retries included.
func webhookHandler(url string, secret []byte, timeout time.Duration, retries int) stream.Handler {
	client := retryablehttp.NewClient()
	client.RetryMax = retries
	client.RetryWaitMin, client.RetryWaitMax = 100*time.Millisecond, 2*time.Second
	// No HTTPClient.Timeout: the call's context below bounds every try
	// and the whole call, and a client timeout costs each request a timer
	// and a goroutine of its own.
	if t, ok := client.HTTPClient.Transport.(*http.Transport); ok {
		// Keep a connection per handler in flight: the pooled default
		// (GOMAXPROCS+1) closes the rest after each call, and with
		// --concurrency 8 on 2 cores most calls paid a new TCP connection.
		t.MaxIdleConnsPerHost = maxWebhookConns
	}
	client.HTTPClient.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	client.Logger = nil
	client.CheckRetry = webhookRetryPolicy
	client.ErrorHandler = retryablehttp.PassthroughErrorHandler
	return func(ctx context.Context, d stream.Delivery) error {
		body, err := encodeDelivery(d)
		if err != nil {
			return stream.Permanent(err)
		}
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, url, body)
		if err != nil {
			return stream.Permanent(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", d.ID.String())
		if len(secret) > 0 {
			req.Header.Set("X-Silt-Signature", "sha256="+sign(secret, body))
		}
		if tp := traceparentOf(ctx); tp != "" {
			req.Header.Set(traceparentField, tp)
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("webhook: %w", scrubURL(err, url))
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			return stream.Permanent(fmt.Errorf("webhook answered %d, a redirect to %q: redirects are not followed (point --webhook at the final URL)",
				resp.StatusCode, clix.Redact(resp.Header.Get("Location"))))
		}
		return webhookResult(resp.StatusCode)
	}
}

// maxWebhookConns bounds the idle connections kept to the webhook host: above
// any sensible --concurrency.
const maxWebhookConns = 256

func webhookResult(status int) error {
	switch {
	case status >= 200 && status < 300:
		return nil
	case status == 408 || status == 425 || status == 429 || status >= 500:
		return fmt.Errorf("webhook answered %d", status)
	case status >= 400:
		return stream.Permanent(fmt.Errorf("webhook answered %d", status))
	}
	return fmt.Errorf("webhook answered %d", status)
}

// webhookRetryPolicy retries connection errors, 408, 425, 429 and 5xx.
func webhookRetryPolicy(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		return true, nil
	}
	s := resp.StatusCode
	return s == 408 || s == 425 || s == 429 || s >= 500, nil
}

// sign returns the hex HMAC-SHA256 of body under secret.
func sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// scrubURL keeps a webhook URL's credentials out of error messages.
func scrubURL(err error, url string) error {
	red := clix.Redact(url)
	if red == url {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), url, red))
}

// stdoutHandler writes each delivery as one JSON line and acks it once the
// line is flushed.
func stdoutHandler(w io.Writer) stream.Handler {
	var mu sync.Mutex
	bw := bufio.NewWriter(w)
	return func(_ context.Context, d stream.Delivery) error {
		line, err := encodeDelivery(d)
		if err != nil {
			return stream.Permanent(err)
		}
		mu.Lock()
		defer mu.Unlock()
		bw.Write(line)
		bw.WriteByte('\n')
		if err := bw.Flush(); err != nil {
			return fmt.Errorf("write stdout: %w", err)
		}
		return nil
	}
}

// summaryWriter is where a command's JSON summary goes: stdout, unless the
// deliveries themselves go there (--stdout), then stderr.
func summaryWriter(c *cli.Context) io.Writer {
	if c.Bool("stdout") {
		return c.App.ErrWriter
	}
	return c.App.Writer
}
