package v1alpha1

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
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

func TestDurationDefaults(t *testing.T) {
	var s RenderQueueSpec
	if s.WindowDuration() != 0 || s.VerifyIntervalDuration() != DefaultVerifyInterval ||
		s.LeaseDurationValue() != DefaultLeaseDuration {
		t.Errorf("unset durations: window %v verify %v lease %v", s.WindowDuration(),
			s.VerifyIntervalDuration(), s.LeaseDurationValue())
	}
}

func TestVerifyWalkRateValue(t *testing.T) {
	for _, c := range []struct {
		rate *int32
		want int
	}{
		{nil, DefaultVerifyWalkRate}, // unset: the default
		{ptr.To[int32](0), 0},        // unpaced
		{ptr.To[int32](2_500_000), 2_500_000},
	} {
		s := RenderQueueSpec{VerifyWalkRate: c.rate}
		if got := s.VerifyWalkRateValue(); got != c.want {
			t.Errorf("VerifyWalkRateValue(%v) = %d, want %d", ptr.Deref(c.rate, -1), got, c.want)
		}
	}
}

func TestShardName(t *testing.T) {
	rq := &RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web"}}
	if got := rq.ShardName(2); got != "web-shard-2" {
		t.Errorf("ShardName(2) = %q", got)
	}
}
