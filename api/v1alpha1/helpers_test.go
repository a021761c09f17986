package v1alpha1

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPriorityValues(t *testing.T) {
	for _, c := range []struct {
		boost, share         string
		wantBoost, wantShare float64
		boostErr, shareErr   bool
	}{
		{"", "", 2, 0.2, false, false},
		{"1.5", "0", 1.5, 0, false, false},
		{"1000", "1", 1000, 1, false, false},
		{"0", "1.01", 0, 0, true, true},
		{"abc", "-0.1", 0, 0, true, true},
		{"1e3", "0.2", 0, 0.2, true, false},
	} {
		p := Priority{SubmittedBoost: c.boost, UrgentMaxShare: c.share}
		b, err := p.SubmittedBoostValue()
		if (err != nil) != c.boostErr || (err == nil && b != c.wantBoost) {
			t.Errorf("SubmittedBoostValue(%q) = %v, %v", c.boost, b, err)
		}
		s, err := p.UrgentMaxShareValue()
		if (err != nil) != c.shareErr || (err == nil && s != c.wantShare) {
			t.Errorf("UrgentMaxShareValue(%q) = %v, %v", c.share, s, err)
		}
	}
}

func TestWalkInterval(t *testing.T) {
	d := func(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }
	for _, c := range []struct {
		window, verify, want time.Duration
	}{
		{0, time.Hour, time.Hour},
		{0, 0, 0},
		{24 * time.Hour, time.Hour, time.Hour},
		{24 * time.Hour, 0, 8 * time.Hour},
		{3 * time.Hour, 2 * time.Hour, time.Hour},
	} {
		s := RenderQueueSpec{Window: d(c.window), VerifyInterval: d(c.verify)}
		if got := s.WalkInterval(); got != c.want {
			t.Errorf("window %v verify %v: WalkInterval = %v, want %v", c.window, c.verify, got, c.want)
		}
	}
}

func TestDurationDefaults(t *testing.T) {
	var s RenderQueueSpec
	if s.WindowDuration() != 0 || s.VerifyIntervalDuration() != DefaultVerifyInterval ||
		s.LeaseDurationValue() != DefaultLeaseDuration || s.WalkInterval() != DefaultVerifyInterval {
		t.Errorf("unset durations: window %v verify %v lease %v walk %v", s.WindowDuration(),
			s.VerifyIntervalDuration(), s.LeaseDurationValue(), s.WalkInterval())
	}
}

func TestShardName(t *testing.T) {
	rq := &RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web"}}
	if got := rq.ShardName(2); got != "web-shard-2" {
		t.Errorf("ShardName(2) = %q", got)
	}
}
