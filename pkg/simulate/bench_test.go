package simulate

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkSimulate runs the docs' seed mix (200,000 rows) for 10 simulated days with the keeper
// core: s/run is the wall time of one simulation, renders/s the renders it simulates per second.
func BenchmarkSimulate(b *testing.B) {
	for _, sc := range []struct {
		load    float64
		backlog float64
	}{{0.8, 0}, {0.95, 1}, {5, 0}} {
		b.Run(fmt.Sprintf("rows=200k/days=10/load=%v/backlog=%v", sc.load, sc.backlog), func(b *testing.B) {
			cfg := Config{Fleet: SeedFleet(200_000, 300, 30, sc.backlog), Load: sc.load, Keeper: keeperPolicy, Duration: 240 * time.Hour}
			renders := 0
			start := time.Now()
			for b.Loop() {
				res, err := Run(cfg)
				if err != nil {
					b.Fatal(err)
				}
				renders += res.All.Renders
			}
			el := time.Since(start).Seconds()
			b.ReportMetric(el/float64(b.N), "s/run")
			b.ReportMetric(float64(renders)/el, "renders/s")
		})
	}
}
