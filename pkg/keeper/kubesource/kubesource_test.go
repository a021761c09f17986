package kubesource

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/keeper"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

func testRQ() *rqv1.RenderQueue {
	return &rqv1.RenderQueue{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: rqv1.RenderQueueSpec{
			Shards: 2, Window: dur(24 * time.Hour), VerifyInterval: dur(time.Hour), LeaseDuration: dur(5 * time.Minute),
			Priority: rqv1.Priority{SubmittedBoost: "2", UrgentMaxShare: "0.2"},
			Store:    rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}},
		},
	}
}

func TestSettingsFor(t *testing.T) {
	cases := []struct {
		name     string
		mutate   func(rq *rqv1.RenderQueue)
		owned    string // want owned slots of web-shard-1
		incoming string // want incoming slots
		err      string // substring of the error; "" = none
	}{
		{"no membership yet", func(*rqv1.RenderQueue) {}, "", "", ""},
		{"owned and incoming", func(rq *rqv1.RenderQueue) {
			rq.Status.Membership = rqv1.MembershipStatus{Epoch: 5,
				Assignment: []rqv1.ShardSlots{{Shard: "web-shard-0", Slots: "0-511"}, {Shard: "web-shard-1", Slots: "512-1023"}},
				Incoming:   []rqv1.ShardSlots{{Shard: "web-shard-1", Slots: "0-9"}}}
		}, "512-1023", "0-9", ""},
		{"malformed slots refuse the whole membership", func(rq *rqv1.RenderQueue) {
			rq.Status.Membership.Assignment = []rqv1.ShardSlots{{Shard: "web-shard-1", Slots: "5-3"}}
		}, "", "", "owned slots of web-shard-1"},
		{"bad decimal", func(rq *rqv1.RenderQueue) { rq.Spec.Priority.SubmittedBoost = "x" }, "", "", "submittedBoost"},
		{"a lease stored before the CRD's bounds", func(rq *rqv1.RenderQueue) { rq.Spec.LeaseDuration = dur(time.Nanosecond) }, "", "", "spec.leaseDuration"},
		{"floors past 1", func(rq *rqv1.RenderQueue) {
			rq.Spec.Priority.Floors = []rqv1.Floor{{Cadence: metav1.Duration{Duration: time.Hour}, Source: "submitted", Share: "0.6"},
				{Cadence: metav1.Duration{Duration: 96 * time.Hour}, Source: "discovered", Share: "0.5"}}
		}, "", "", "must not sum past 1"},
		// "96h" and "5760m" are different strings (the API server's uniqueness rule passes) but one class
		{"one class twice", func(rq *rqv1.RenderQueue) {
			rq.Spec.Priority.Floors = []rqv1.Floor{{Cadence: metav1.Duration{Duration: 96 * time.Hour}, Source: "discovered", Share: "0.1"},
				{Cadence: metav1.Duration{Duration: 5760 * time.Minute}, Source: "discovered", Share: "0.1"}}
		}, "", "", "more than one floor"},
		{"bad floor source", func(rq *rqv1.RenderQueue) {
			rq.Spec.Priority.Floors = []rqv1.Floor{{Cadence: metav1.Duration{Duration: time.Hour}, Source: "crawler", Share: "0.1"}}
		}, "", "", "priority.floors[0]"},
		{"bad reschedule", func(rq *rqv1.RenderQueue) { rq.Spec.Priority.Reschedule = "Sometimes" }, "", "", "unknown reschedule policy"},
		{"a walk rate stored before the CRD's bounds", func(rq *rqv1.RenderQueue) { rq.Spec.VerifyWalkRate = ptr.To[int32](-5) }, "", "", "spec.verifyWalkRate"},
		{"objectives whose classes overlap", func(rq *rqv1.RenderQueue) {
			rq.Spec.Objectives = []rqv1.Objective{
				{Name: "hourly", Class: rqv1.ObjectiveClass{MaxCadence: dur(time.Hour)}, Percentile: "99", MaxLateness: metav1.Duration{Duration: 10 * time.Minute}},
				{Name: "all", Percentile: "90", MaxLateness: metav1.Duration{Duration: time.Hour}},
			}
		}, "", "", `selects some rows objective "hourly" selects too`},
		{"an objective's percentile of 100", func(rq *rqv1.RenderQueue) {
			rq.Spec.Objectives = []rqv1.Objective{{Name: "all", Percentile: "100", MaxLateness: metav1.Duration{Duration: time.Hour}}}
		}, "", "", "spec.objectives[0].percentile"},
	}
	for _, tc := range cases {
		rq := testRQ()
		tc.mutate(rq)
		s, err := SettingsFor(rq, "web-shard-1")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got := schedule.FormatSlots(s.Owned); got != tc.owned {
			t.Errorf("%s: owned %q, want %q", tc.name, got, tc.owned)
		}
		if got := schedule.FormatSlots(s.Incoming); got != tc.incoming {
			t.Errorf("%s: incoming %q, want %q", tc.name, got, tc.incoming)
		}
		if s.Window != 24*time.Hour || s.SubmittedBoost != 2 || s.UrgentMaxShare != 0.2 || s.LeaseDuration != 5*time.Minute ||
			s.Floors != nil || s.Reschedule != policy.Adaptive {
			t.Errorf("%s: policy %+v", tc.name, s)
		}
		// spec.verifyWalkRate unset: the keeper's default (the API's default is the keeper's)
		if s.VerifyWalkRate != keeper.DefaultVerifyWalkRate {
			t.Errorf("%s: walk rate %d, want the default %d", tc.name, s.VerifyWalkRate, keeper.DefaultVerifyWalkRate)
		}
	}

	for _, rate := range []int32{0, 1, 2_500_000, rqv1.MaxVerifyWalkRate} {
		rq := testRQ()
		rq.Spec.VerifyWalkRate = &rate
		s, err := SettingsFor(rq, "web-shard-1")
		if err != nil || s.VerifyWalkRate != int(rate) {
			t.Errorf("spec.verifyWalkRate %d: settings rate %d, %v", rate, s.VerifyWalkRate, err)
		}
	}

	rq := testRQ()
	rq.Spec.Priority.Floors = []rqv1.Floor{{Cadence: metav1.Duration{Duration: 96 * time.Hour}, Source: "discovered", Share: "0.05"},
		{Cadence: metav1.Duration{Duration: time.Hour}, Source: "submitted", Share: "0.1"}}
	rq.Spec.Priority.Reschedule = "AfterRender"
	s, err := SettingsFor(rq, "web-shard-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []policy.Floor{{Cadence: 96 * time.Hour, Source: schedule.SourceDiscovered, Share: 0.05}, {Cadence: time.Hour, Source: schedule.SourceSubmitted, Share: 0.1}}
	if !slices.Equal(s.Floors, want) || s.Reschedule != policy.AfterRender {
		t.Errorf("floors %v reschedule %v, want %v AfterRender", s.Floors, s.Reschedule, want)
	}
}

// TestSourceFollowsItsRenderQueue runs against a real kube-apiserver (envtest).
func TestSourceFollowsItsRenderQueue(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is unset: run `make test` (it builds or reuses the envtest binaries)")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	scheme := runtime.NewScheme()
	_ = rqv1.AddToScheme(scheme)
	_ = corev1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rq := testRQ()
	if err := c.Create(ctx, rq); err != nil {
		t.Fatal(err)
	}
	other := testRQ()
	other.Name = "other"
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	src, err := New(cfg, "default", "web", "web-shard-1", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	s, err := src.Initial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Window != 24*time.Hour || !s.Owned.IsEmpty() || s.VerifyWalkRate != keeper.DefaultVerifyWalkRate {
		t.Fatalf("initial %+v", s)
	}
	ch := make(chan keeper.Settings, 4)
	go func() { _ = src.Watch(ctx, ch) }()

	rq.Status.Membership = rqv1.MembershipStatus{Epoch: 3, Assignment: []rqv1.ShardSlots{{Shard: "web-shard-0", Slots: "0-511"}, {Shard: "web-shard-1", Slots: "512-1023"}}}
	if err := c.Status().Update(ctx, rq); err != nil {
		t.Fatal(err)
	}
	// a change to another RenderQueue is not seen at all
	other.Status.Membership = rqv1.MembershipStatus{Epoch: 9}
	if err := c.Status().Update(ctx, other); err != nil {
		t.Fatal(err)
	}
	// waitFor reads settings until want holds; settings from another RenderQueue fail the test
	waitFor := func(what string, want func(keeper.Settings) bool) {
		t.Helper()
		for {
			select {
			case s := <-ch:
				if s.Epoch == 9 {
					t.Fatal("settings from another RenderQueue")
				}
				if want(s) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no settings with %s", what)
			}
		}
	}
	waitFor("epoch 3 and slots 512-1023", func(s keeper.Settings) bool {
		return s.Epoch == 3 && schedule.FormatSlots(s.Owned) == "512-1023"
	})

	// a policy change (floors, reschedule) reaches the shard
	if err := c.Get(ctx, client.ObjectKeyFromObject(rq), rq); err != nil {
		t.Fatal(err)
	}
	rq.Spec.Priority.Floors = []rqv1.Floor{{Cadence: metav1.Duration{Duration: 96 * time.Hour}, Source: "discovered", Share: "0.05"}}
	rq.Spec.Priority.Reschedule = "AfterRender"
	if err := c.Update(ctx, rq); err != nil {
		t.Fatal(err)
	}
	waitFor("the new floors", func(s keeper.Settings) bool {
		return len(s.Floors) == 1 && s.Floors[0] == (policy.Floor{Cadence: 96 * time.Hour, Source: schedule.SourceDiscovered, Share: 0.05}) &&
			s.Reschedule == policy.AfterRender && s.Epoch == 3
	})

	// so does a new verification walk rate, and 0 (unpaced)
	for _, rate := range []int32{2_000_000, 0} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(rq), rq); err != nil {
			t.Fatal(err)
		}
		rq.Spec.VerifyWalkRate = ptr.To(rate)
		if err := c.Update(ctx, rq); err != nil {
			t.Fatal(err)
		}
		waitFor(fmt.Sprintf("walk rate %d", rate), func(s keeper.Settings) bool {
			return s.VerifyWalkRate == int(rate) && s.Epoch == 3 && s.Reschedule == policy.AfterRender
		})
	}
}

// TestSettingsForHandoffs: the longest lease, the peers (URL and owned slots, shards without
// slots too) and who gives the shard its slots — while the handoff prepares, once committed (with
// when, at which epoch), and not after a rollback.
func TestSettingsForHandoffs(t *testing.T) {
	rq := testRQ()
	rq.Spec.LeaseDuration = dur(time.Minute)
	finished := metav1.NewTime(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	rq.Status.Membership = rqv1.MembershipStatus{Epoch: 7,
		Assignment: []rqv1.ShardSlots{{Shard: "web-shard-0", Slots: "0-511"}, {Shard: "web-shard-1", Slots: "512-1023"}},
		Handoff: &rqv1.HandoffStatus{State: rqv1.HandoffCommitted, FromEpoch: 5, PrepareEpoch: 6, FinalEpoch: 7, FinishedAt: &finished,
			Moves: []rqv1.SlotMove{{From: "web-shard-0", To: "web-shard-1", Slots: "512-600"}, {From: "web-shard-2", To: "web-shard-1", Slots: "601-1023"},
				{From: "web-shard-2", To: "web-shard-0", Slots: "300-511"}}}}
	rq.Status.Shards = []rqv1.ShardStatus{{Name: "web-shard-0", URL: "http://10.0.0.1:8080"}, {Name: "web-shard-1", URL: "http://10.0.0.2:8080"},
		{Name: "web-shard-2"}}
	s, err := SettingsFor(rq, "web-shard-1")
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxLease != time.Minute {
		t.Errorf("max lease %v, want spec.leaseDuration (1m) when unset", s.MaxLease)
	}
	peers := fmt.Sprint(s.Peers)
	if want := "[{web-shard-0 http://10.0.0.1:8080 0-511} {web-shard-1 http://10.0.0.2:8080 512-1023} {web-shard-2  }]"; peers != want {
		t.Errorf("peers %s, want %s", peers, want)
	}
	arriving := fmt.Sprint(s.Arriving)
	if want := "[{web-shard-0 512-600 " + finished.String() + " 7} {web-shard-2 601-1023 " + finished.String() + " 7}]"; arriving != want {
		t.Errorf("arriving %s, want %s", arriving, want)
	}
	rq.Spec.MaxLeaseDuration = dur(15 * time.Minute)
	rq.Status.Membership.Handoff.State = rqv1.HandoffPreparing
	if s, err = SettingsFor(rq, "web-shard-1"); err != nil || s.MaxLease != 15*time.Minute || len(s.Arriving) != 2 || !s.Arriving[0].CommittedAt.IsZero() || s.Arriving[0].Epoch != 0 {
		t.Errorf("preparing: max lease %v, arriving %v, %v", s.MaxLease, s.Arriving, err)
	}
	rq.Status.Membership.Handoff.State = rqv1.HandoffRolledBack
	if s, err = SettingsFor(rq, "web-shard-1"); err != nil || s.Arriving != nil {
		t.Errorf("rolled back: arriving %v, %v", s.Arriving, err)
	}
}

// TestSettingsForObjectives: spec.objectives become the shard's objective settings, class and
// percentile parsed.
func TestSettingsForObjectives(t *testing.T) {
	rq := testRQ()
	urgent := false
	rq.Spec.Objectives = []rqv1.Objective{
		{Name: "hourly", Class: rqv1.ObjectiveClass{MinCadence: dur(time.Hour), MaxCadence: dur(time.Hour), Source: "submitted"}, Percentile: "99.9",
			MaxLateness: metav1.Duration{Duration: 10 * time.Minute}},
		{Name: "slow", Class: rqv1.ObjectiveClass{MinCadence: dur(24 * time.Hour), Urgent: &urgent}, Percentile: "95", MaxLateness: metav1.Duration{Duration: 12 * time.Hour}},
	}
	s, err := SettingsFor(rq, "web-shard-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Objectives) != 2 {
		t.Fatalf("objectives %+v", s.Objectives)
	}
	h, slow := s.Objectives[0], s.Objectives[1]
	if h.Name != "hourly" || h.Percentile != 99.9 || h.MinCadence != time.Hour || h.MaxCadence != time.Hour || h.Source == nil ||
		*h.Source != schedule.SourceSubmitted || h.Urgent != nil || h.MaxLateness != 10*time.Minute {
		t.Errorf("hourly: %+v", h)
	}
	if slow.Name != "slow" || slow.Percentile != 95 || slow.MinCadence != 24*time.Hour || slow.MaxCadence != 0 || slow.Source != nil ||
		slow.Urgent == nil || *slow.Urgent || slow.MaxLateness != 12*time.Hour {
		t.Errorf("slow: %+v", slow)
	}
}
