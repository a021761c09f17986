package client_test

import (
	"slices"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/client"
)

// TestBackoff: the waits grow by Factor for Steps steps up to Cap, then stay; the jitter adds
// less than Jitter × the wait (the semantics of apimachinery's wait.Backoff).
func TestBackoff(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		b    client.Backoff
		want []time.Duration
	}{
		{"capped", client.Backoff{Duration: 100 * ms, Factor: 2, Steps: 10, Cap: 500 * ms}, []time.Duration{100 * ms, 200 * ms, 400 * ms, 500 * ms, 500 * ms}},
		{"out of steps", client.Backoff{Duration: 100 * ms, Factor: 3, Steps: 2}, []time.Duration{100 * ms, 300 * ms, 900 * ms, 900 * ms}},
		{"no factor", client.Backoff{Duration: 50 * ms, Steps: 5}, []time.Duration{50 * ms, 50 * ms, 50 * ms}},
		{"no steps", client.Backoff{Duration: 70 * ms, Factor: 2}, []time.Duration{70 * ms, 70 * ms}},
	} {
		b := tc.b
		var got []time.Duration
		for range tc.want {
			got = append(got, b.Step())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	b := client.Backoff{Duration: 100 * ms, Factor: 2, Jitter: 0.5, Steps: 3, Cap: time.Second}
	base := client.Backoff{Duration: 100 * ms, Factor: 2, Steps: 3, Cap: time.Second}
	jittered := false
	for range 5 {
		d, lo := b.Step(), base.Step()
		if d < lo || d >= lo+lo/2 {
			t.Errorf("jittered wait %v outside [%v, %v)", d, lo, lo+lo/2)
		}
		jittered = jittered || d != lo
	}
	if !jittered {
		t.Error("Jitter 0.5 added nothing in 5 steps")
	}
}
