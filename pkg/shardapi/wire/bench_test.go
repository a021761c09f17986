package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// benchRows is the size of the benchmarks' batches: the end-to-end bench's 500-row claims.
const benchRows = 500

// benchClaim is a claim reply of benchRows rows like the keeper's (64-byte keys, due times in
// whole milliseconds, one lease expiry).
func benchClaim() shardapi.ClaimResponse {
	due := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	r := shardapi.ClaimResponse{Items: make([]shardapi.ClaimedRow, benchRows)}
	for i := range r.Items {
		r.Items[i] = shardapi.ClaimedRow{Key: fmt.Sprintf("https://shop.example.com/product/%031d", i),
			Due: due.Add(time.Duration(i) * 7 * time.Millisecond), Cadence: 345600, Route: "default", Source: "database",
			Lease: fmt.Sprintf("%016x", 1<<40+i), LeaseExpires: due.Add(5 * time.Minute)}
	}
	return r
}

// benchComplete is the complete request of benchClaim's rows, as the bench's workers send it.
func benchComplete() shardapi.CompleteRequest {
	c := benchClaim()
	r := shardapi.CompleteRequest{Items: make([]shardapi.Completion, len(c.Items))}
	for i, it := range c.Items {
		r.Items[i] = shardapi.Completion{Key: it.Key, Lease: it.Lease}
	}
	return r
}

// benchCompleted is the keeper's reply to benchComplete.
func benchCompleted() shardapi.CompleteResponse {
	c := benchClaim()
	r := shardapi.CompleteResponse{Completed: len(c.Items), Results: make([]shardapi.ItemResult, len(c.Items))}
	for i, it := range c.Items {
		r.Results[i].Key = it.Key
	}
	return r
}

// perRow reports the time per row of the batches the benchmark handled.
func perRow(b *testing.B) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchRows), "ns/row")
}

// BenchmarkClaimReply encodes (the keeper: json.Encoder as httpserve.WriteJSON did, against
// AppendClaimResponse) and decodes (a worker: json.Unmarshal against Unmarshal) a 500-row claim
// reply.
func BenchmarkClaimReply(b *testing.B) {
	claim := benchClaim()
	data, _ := json.Marshal(claim)
	b.Run("encode/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var buf bytes.Buffer
			if err := json.NewEncoder(&buf).Encode(claim); err != nil {
				b.Fatal(err)
			}
		}
		perRow(b)
	})
	b.Run("encode/wire", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = AppendClaimResponse(buf[:0], &claim); err != nil {
				b.Fatal(err)
			}
			buf = append(buf, '\n')
		}
		perRow(b)
	})
	b.Run("decode/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r shardapi.ClaimResponse
			if err := json.Unmarshal(data, &r); err != nil || len(r.Items) != benchRows {
				b.Fatal(err)
			}
		}
		perRow(b)
	})
	b.Run("decode/wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r shardapi.ClaimResponse
			if !DecodeClaimResponse(data, &r) || len(r.Items) != benchRows {
				b.Fatal("declined")
			}
		}
		perRow(b)
	})
}

// BenchmarkCompleteRequest encodes (a worker: json.Marshal against Marshal) a 500-row complete
// request and decodes it strictly (the keeper's reference decoding of a small body,
// json.Decoder with unknown fields refused, against a scan and DecodeComplete; the keeper's
// whole Decode is measured by httpserve's BenchmarkDecodeComplete).
func BenchmarkCompleteRequest(b *testing.B) {
	req := benchComplete()
	data, _ := json.Marshal(req)
	b.Run("encode/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(req); err != nil {
				b.Fatal(err)
			}
		}
		perRow(b)
	})
	b.Run("encode/wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Marshal(req); err != nil {
				b.Fatal(err)
			}
		}
		perRow(b)
	})
	b.Run("decode/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r shardapi.CompleteRequest
			if err := strictly(data, &r); err != nil || len(r.Items) != benchRows {
				b.Fatal(err)
			}
		}
		perRow(b)
	})
	b.Run("decode/wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r shardapi.CompleteRequest
			s := NewCompleteScan(shardapi.MaxClaim)
			if s.Scan(data, true) != Valid || !s.DecodeComplete(data, &r) || len(r.Items) != benchRows {
				b.Fatal("declined")
			}
		}
		perRow(b)
	})
}

// BenchmarkCompleteReply encodes (the keeper) and decodes (a worker) the 500-result reply to a
// complete request.
func BenchmarkCompleteReply(b *testing.B) {
	res := benchCompleted()
	data, _ := json.Marshal(res)
	b.Run("encode/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var buf bytes.Buffer
			if err := json.NewEncoder(&buf).Encode(res); err != nil {
				b.Fatal(err)
			}
		}
		perRow(b)
	})
	b.Run("encode/wire", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = append(AppendCompleteResponse(buf[:0], &res), '\n')
		}
		perRow(b)
	})
	b.Run("decode/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r shardapi.CompleteResponse
			if err := json.Unmarshal(data, &r); err != nil || len(r.Results) != benchRows {
				b.Fatal(err)
			}
		}
		perRow(b)
	})
	b.Run("decode/wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r shardapi.CompleteResponse
			if !DecodeCompleteResponse(data, &r) || len(r.Results) != benchRows {
				b.Fatal("declined")
			}
		}
		perRow(b)
	})
}
