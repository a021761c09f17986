// Package kubesource is the keeper shard's settings source inside Kubernetes: it watches the
// shard's own RenderQueue object (and nothing else — its RBAC allows just that object) and turns
// its spec (window, verifyInterval, verifyWalkRate, leaseDuration, maxLeaseDuration, priority:
// boost, urgent share, floors, reschedule) and status (membership: the shard's owned and incoming
// slots, the epoch, who gives it slots in a handoff; shards: the other shards' URLs) into
// keeper.Settings, as CloudNativePG's instance manager watches its own Cluster.
package kubesource

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/keeper"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// SettingsFor derives shard's settings from its RenderQueue. Malformed slot text is an error,
// never a partial membership.
func SettingsFor(rq *rqv1.RenderQueue, shard string) (keeper.Settings, error) {
	// an object stored before the CRD's rules (a lease of 1ns, a window that does not decode) is
	// refused, never read with zeroed or out-of-range fields
	if err := rq.Validate(); err != nil {
		return keeper.Settings{}, fmt.Errorf("renderqueue %s/%s: %w", rq.Namespace, rq.Name, err)
	}
	boost, err := rq.Spec.Priority.SubmittedBoostValue()
	if err != nil {
		return keeper.Settings{}, fmt.Errorf("renderqueue %s/%s: %w", rq.Namespace, rq.Name, err)
	}
	share, err := rq.Spec.Priority.UrgentMaxShareValue()
	if err != nil {
		return keeper.Settings{}, fmt.Errorf("renderqueue %s/%s: %w", rq.Namespace, rq.Name, err)
	}
	floors, err := floorsOf(rq.Spec.Priority.Floors)
	if err != nil {
		return keeper.Settings{}, fmt.Errorf("renderqueue %s/%s: %w", rq.Namespace, rq.Name, err)
	}
	resched, err := policy.ParseReschedule(rq.Spec.Priority.RescheduleValue())
	if err != nil {
		return keeper.Settings{}, fmt.Errorf("renderqueue %s/%s: priority: %w", rq.Namespace, rq.Name, err)
	}
	objectives, err := objectivesOf(rq.Spec.Objectives)
	if err != nil {
		return keeper.Settings{}, fmt.Errorf("renderqueue %s/%s: %w", rq.Namespace, rq.Name, err)
	}
	s := keeper.Settings{
		Objectives:     objectives,
		Window:         rq.Spec.WindowDuration(),
		VerifyInterval: rq.Spec.VerifyIntervalDuration(),
		VerifyWalkRate: rq.Spec.VerifyWalkRateValue(),
		LeaseDuration:  rq.Spec.LeaseDurationValue(),
		MaxLease:       rq.Spec.MaxLeaseDurationValue(),
		SubmittedBoost: boost,
		UrgentMaxShare: share,
		Floors:         floors,
		Reschedule:     resched,
		Epoch:          rq.Status.Membership.Epoch,
	}
	find := func(list []rqv1.ShardSlots, what string) (schedule.SlotSet, error) {
		for _, e := range list {
			if e.Shard == shard {
				set, err := schedule.ParseSlots(e.Slots)
				if err != nil {
					return schedule.SlotSet{}, fmt.Errorf("renderqueue %s/%s: %s slots of %s: %w", rq.Namespace, rq.Name, what, shard, err)
				}
				return set, nil
			}
		}
		return schedule.SlotSet{}, nil
	}
	if s.Owned, err = find(rq.Status.Membership.Assignment, "owned"); err != nil {
		return keeper.Settings{}, err
	}
	if s.Incoming, err = find(rq.Status.Membership.Incoming, "incoming"); err != nil {
		return keeper.Settings{}, err
	}
	if s.Peers, err = peersOf(rq); err != nil {
		return keeper.Settings{}, err
	}
	if s.Arriving, err = arrivingTo(rq, shard); err != nil {
		return keeper.Settings{}, err
	}
	if err := s.Validate(); err != nil {
		return keeper.Settings{}, fmt.Errorf("renderqueue %s/%s: settings of %s: %w", rq.Namespace, rq.Name, shard, err)
	}
	return s, nil
}

// peersOf is the queue's shards as the status knows them: each shard of the assignment with the
// slots it owns and its URL (status.shards[].url; empty while its Pod has no IP or is being
// deleted), and each shard of status.shards with no slots.
func peersOf(rq *rqv1.RenderQueue) ([]keeper.Peer, error) {
	urls := map[string]string{}
	for _, sh := range rq.Status.Shards {
		urls[sh.Name] = sh.URL
	}
	var out []keeper.Peer
	seen := map[string]bool{}
	for _, a := range rq.Status.Membership.Assignment {
		set, err := schedule.ParseSlots(a.Slots)
		if err != nil {
			return nil, fmt.Errorf("renderqueue %s/%s: owned slots of %s: %w", rq.Namespace, rq.Name, a.Shard, err)
		}
		out = append(out, keeper.Peer{Name: a.Shard, URL: urls[a.Shard], Owned: set})
		seen[a.Shard] = true
	}
	for _, sh := range rq.Status.Shards {
		if !seen[sh.Name] {
			out = append(out, keeper.Peer{Name: sh.Name, URL: sh.URL})
		}
	}
	return out, nil
}

// arrivingTo names the shards that give shard its slots: the moves of the handoff in
// status.membership.handoff to shard, while it prepares (the incoming slots) or once committed
// (the slots it took over, with when). Nothing after a rollback.
func arrivingTo(rq *rqv1.RenderQueue, shard string) ([]keeper.Arrival, error) {
	h := rq.Status.Membership.Handoff
	if h == nil || (h.State != rqv1.HandoffPreparing && h.State != rqv1.HandoffCommitted) {
		return nil, nil
	}
	var out []keeper.Arrival
	for _, m := range h.Moves {
		if m.To != shard {
			continue
		}
		set, err := schedule.ParseSlots(m.Slots)
		if err != nil {
			return nil, fmt.Errorf("renderqueue %s/%s: slots moving from %q to %s: %w", rq.Namespace, rq.Name, m.From, m.To, err)
		}
		a := keeper.Arrival{From: m.From, Slots: set}
		if h.State == rqv1.HandoffCommitted {
			a.CommittedAt = h.StartedAt.Time
			if h.FinishedAt != nil {
				a.CommittedAt = h.FinishedAt.Time
			}
			a.Epoch = h.FinalEpoch
		}
		out = append(out, a)
	}
	return out, nil
}

// floorsOf converts spec.priority.floors; none gives nil (so equal settings compare equal).
func floorsOf(in []rqv1.Floor) ([]policy.Floor, error) {
	var out []policy.Floor
	for i, f := range in {
		src, err := schedule.ParseSource(f.Source)
		if err != nil {
			return nil, fmt.Errorf("priority.floors[%d]: %w", i, err)
		}
		share, err := f.ShareValue()
		if err != nil {
			return nil, fmt.Errorf("priority.floors[%d]: %w", i, err)
		}
		out = append(out, policy.Floor{Cadence: f.Cadence.Duration, Source: src, Share: share})
	}
	return out, nil
}

// Source watches one RenderQueue for one shard.
type Source struct {
	cache     cache.Cache
	namespace string
	name      string
	shard     string
	log       logr.Logger

	mu      sync.Mutex
	started bool
}

// New returns a source for shard, watching the RenderQueue namespace/name through cfg.
func New(cfg *rest.Config, namespace, name, shard string, log logr.Logger) (*Source, error) {
	scheme := runtime.NewScheme()
	if err := rqv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := cache.New(cfg, cache.Options{
		Scheme: scheme,
		ByObject: map[client.Object]cache.ByObject{
			&rqv1.RenderQueue{}: {
				Namespaces: map[string]cache.Config{namespace: {}},
				Field:      fields.OneTermEqualSelector("metadata.name", name),
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching renderqueue %s/%s: %w", namespace, name, err)
	}
	return &Source{cache: c, namespace: namespace, name: name, shard: shard, log: log}, nil
}

func (s *Source) start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return nil
	}
	go func() {
		if err := s.cache.Start(ctx); err != nil {
			s.log.Error(err, "RenderQueue watch stopped")
		}
	}()
	if !s.cache.WaitForCacheSync(ctx) {
		return fmt.Errorf("watching renderqueue %s/%s: cache did not sync", s.namespace, s.name)
	}
	s.started = true
	return nil
}

func (s *Source) current(ctx context.Context) (keeper.Settings, error) {
	var rq rqv1.RenderQueue
	if err := s.cache.Get(ctx, client.ObjectKey{Namespace: s.namespace, Name: s.name}, &rq); err != nil {
		return keeper.Settings{}, fmt.Errorf("reading renderqueue %s/%s: %w", s.namespace, s.name, err)
	}
	return SettingsFor(&rq, s.shard)
}

// Initial waits for the RenderQueue and returns the shard's settings from it.
func (s *Source) Initial(ctx context.Context) (keeper.Settings, error) {
	if err := s.start(ctx); err != nil {
		return keeper.Settings{}, err
	}
	return s.current(ctx)
}

// Watch sends the shard's settings on ch every time the RenderQueue changes them, until ctx
// ends. Settings that do not parse are logged and skipped: the shard keeps its last good ones.
func (s *Source) Watch(ctx context.Context, ch chan<- keeper.Settings) error {
	if err := s.start(ctx); err != nil {
		return err
	}
	inf, err := s.cache.GetInformer(ctx, &rqv1.RenderQueue{})
	if err != nil {
		return fmt.Errorf("watching renderqueue %s/%s: %w", s.namespace, s.name, err)
	}
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
	})
	if err != nil {
		return fmt.Errorf("watching renderqueue %s/%s: %w", s.namespace, s.name, err)
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	var last *keeper.Settings
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
		st, err := s.current(ctx)
		if err != nil {
			s.log.Error(err, "Ignoring RenderQueue change; keeping the last good settings", "renderqueue", s.name)
			continue
		}
		if last != nil && reflect.DeepEqual(*last, st) {
			continue
		}
		last = &st
		select {
		case ch <- st:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// objectivesOf converts spec.objectives (validated) into the shard's objective settings.
func objectivesOf(in []rqv1.Objective) ([]keeper.ObjectiveSetting, error) {
	var out []keeper.ObjectiveSetting
	for _, o := range in {
		p, err := o.PercentileValue()
		if err != nil {
			return nil, fmt.Errorf("objective %q: %w", o.Name, err)
		}
		po := policy.Objective{Name: o.Name, MaxLateness: o.MaxLateness.Duration, Urgent: o.Class.Urgent}
		if o.Class.MinCadence != nil {
			po.MinCadence = o.Class.MinCadence.Duration
		}
		if o.Class.MaxCadence != nil {
			po.MaxCadence = o.Class.MaxCadence.Duration
		}
		if o.Class.Source != "" {
			src, err := schedule.ParseSource(o.Class.Source)
			if err != nil {
				return nil, fmt.Errorf("objective %q: %w", o.Name, err)
			}
			po.Source = &src
		}
		out = append(out, keeper.ObjectiveSetting{Objective: po, Percentile: p})
	}
	return out, nil
}
