package client

import (
	"math/rand/v2"
	"time"
)

// Backoff is a jittered, exponentially growing wait (the fields and Step of apimachinery's
// wait.Backoff, which this package used before: it links no Kubernetes package now).
type Backoff struct {
	// Duration is the first wait.
	Duration time.Duration
	// Factor multiplies the wait after each step (0: it stays the same).
	Factor float64
	// Jitter adds up to Jitter × the wait at random (0: none).
	Jitter float64
	// Steps is how many steps may grow the wait; after them it stays where it got to.
	Steps int
	// Cap bounds the wait before the jitter (0: no bound).
	Cap time.Duration
}

// Step returns the next wait and advances b.
func (b *Backoff) Step() time.Duration {
	d := b.Duration
	if b.Steps > 0 {
		b.Steps--
		if b.Factor != 0 {
			b.Duration = time.Duration(float64(b.Duration) * b.Factor)
			if b.Cap > 0 && b.Duration > b.Cap {
				b.Duration = b.Cap
				b.Steps = 0
			}
		}
	}
	if b.Jitter > 0 {
		d += time.Duration(rand.Float64() * b.Jitter * float64(d))
	}
	return d
}
