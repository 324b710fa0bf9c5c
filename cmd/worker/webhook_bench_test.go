package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkWebhook_Ratio (P12): the worker loop with the --webhook handler
// and --concurrency 8 against a local HTTP server ÷ raw net/http POSTs of
// the same bodies from 8 goroutines to the same server. Goal >= 0.8.
//
//	go test -run '^$' -bench Webhook_Ratio -benchtime 9x ./cmd/worker
func BenchmarkWebhook_Ratio(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	ctx := context.Background()
	const entries = 5000
	_, l, ids, batch, newGroup := benchStream(b, entries, nil)
	bodies := make([][]byte, entries)
	for i, id := range ids {
		bodies[i], _ = encodeDelivery(stream.Delivery{ID: id, StreamID: id.StreamID, Fields: batch[i], Attempts: 1, Deliveries: 1, Group: "g", Consumer: "w1"})
	}
	silt := func(tb testing.TB) int {
		c, _ := stream.NewConsumer(l, newGroup(tb), "w1")
		c.Block, c.Concurrency = time.Millisecond, 8
		sum, err := c.Run(ctx, webhookHandler(srv.URL, nil, time.Minute, 3))
		if err != nil || sum.Acked != entries {
			tb.Fatalf("run: %+v %v", sum, err)
		}
		return entries
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	raw := func(tb testing.TB) int {
		var wg sync.WaitGroup
		next := make(chan []byte)
		for range 8 {
			wg.Go(func() {
				for body := range next {
					resp, err := client.Post(srv.URL, "application/json", bytes.NewReader(body))
					if err != nil {
						tb.Error(err)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		for _, body := range bodies {
			next <- body
		}
		close(next)
		wg.Wait()
		return entries
	}
	benchratio.Compare(b, silt, raw)
}
