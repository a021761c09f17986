package keeper

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

// hostileCompleteBody is a /v1/complete body of about size bytes made of small items (so far more
// items than a request may carry: 1 MiB holds about 20,000).
func hostileCompleteBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < size-100; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"key":"https://x.example/%07d","lease":"%016x"}`, i, i)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// peakHeap samples the live heap (objects in use) until stop is closed and returns the highest
// value seen.
func peakHeap(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-stop:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return out
}

// BenchmarkHostileCompleteBodies sends 32 concurrent 1 MiB /v1/complete bodies (each with about
// 20,000 items, over the 10,000-item limit) to the shard's handler and reports the peak live
// heap above the idle heap while they are handled, and how many were refused with which code.
func BenchmarkHostileCompleteBodies(b *testing.B) {
	const clients, size = 32, 1 << 20
	e := newShardEnv(b, allSlots(time.Hour))
	srv := httptest.NewServer(e.sh.Handler(HandlerOptions{Token: "t"}))
	defer srv.Close()
	body := hostileCompleteBody(size)
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var peakSum float64
	codes := map[int]int{}
	var mu sync.Mutex
	for b.Loop() {
		runtime.GC()
		idle := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		metrics.Read(idle)
		stop := make(chan struct{})
		peak := peakHeap(stop)
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/complete", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer t")
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			})
		}
		wg.Wait()
		close(stop)
		peakSum += float64(<-peak-idle[0].Value.Uint64()) / (1 << 20)
	}
	b.ReportMetric(peakSum/float64(b.N), "peak-heap-MiB")
	b.Logf("replies: %v", codes)
}
