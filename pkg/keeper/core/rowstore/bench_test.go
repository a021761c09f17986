package rowstore_test

import (
	"math/rand/v2"
	"testing"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/coretest"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
)

// BenchmarkFind looks up keys in batches of 128, as a walk step does, in a store of n 64-byte
// keys: keys it holds (a re-walk) or keys it does not (a load), looked up one by one or read
// ahead with Prefetch first. ns/key is the time per key looked up, Prefetch included.
func BenchmarkFind(b *testing.B) {
	const batch = 128
	for _, n := range coretest.Sizes(b) {
		s := rowstore.New()
		s.Reserve(n)
		for i := range n {
			s.Add(coretest.Key(i))
		}
		rng := rand.New(rand.NewPCG(1, 2))
		const nKeys = 1 << 20
		for _, held := range []bool{true, false} {
			keys := make([]string, nKeys)
			for i := range keys {
				j := rng.IntN(n)
				if !held {
					j += n
				}
				keys[i] = coretest.Key(j)
			}
			for _, prefetch := range []bool{false, true} {
				name := coretest.SizeName(n) + "/held=" + map[bool]string{true: "yes", false: "no"}[held] +
					"/prefetch=" + map[bool]string{true: "yes", false: "no"}[prefetch]
				b.Run(name, func(b *testing.B) {
					var sum uint32
					next := 0
					for b.Loop() {
						if next+batch > nKeys {
							next = 0
						}
						ks := keys[next : next+batch]
						next += batch
						if prefetch {
							sum += s.Prefetch(batch, func(i int) string { return ks[i] })
						}
						for _, k := range ks {
							if _, ok := s.Find(k); ok != held {
								b.Fatalf("Find(%q) = %v", k, ok)
							}
						}
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/key")
					_ = sum
				})
			}
		}
	}
}
