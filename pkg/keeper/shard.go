package keeper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/coverage"
	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// Settings is what a shard runs by: its policy and its slots. A settings source (standalone
// flags, or the shard's RenderQueue object) hands the shard a new Settings whenever either
// changes.
type Settings struct {
	// Window: hold rows due before now + Window; 0 holds every row.
	Window time.Duration
	// VerifyInterval is the time between verification walks; with a window the walk runs every
	// min(VerifyInterval, Window/3), and VerifyInterval 0 means Window/3. With neither, no
	// periodic walks run (gaps and membership changes still walk).
	VerifyInterval time.Duration
	// LeaseDuration is the default lease of a claim.
	LeaseDuration time.Duration
	// VerifyWalkRate is the most rows a second a verification walk reads: a full walk while the
	// shard is exact and no slots are arriving pauses between its steps to keep to it (see
	// walkPacer). 0: every walk reads as fast as the store sends. The load and the walks that
	// repair a gap or prepare slots are never paced. A walk keeps the rate it started with; a
	// change applies from the next walk.
	VerifyWalkRate int
	// SubmittedBoost, UrgentMaxShare, Floors and Reschedule are the claim policy (see policy.Config).
	SubmittedBoost float64
	UrgentMaxShare float64
	Floors         []policy.Floor
	Reschedule     policy.Reschedule
	// MaxLease is the longest lease a claim or an extension gets (a longer one asked for is cut
	// to it), and so how long the rows of slots whose leases are unknown are held back (fenced
	// by time: docs/design.md, "Leases across a handoff"). 0: LeaseDuration.
	MaxLease time.Duration
	// Epoch, Owned and Incoming are the shard's membership.
	Epoch    int64
	Owned    schedule.SlotSet
	Incoming schedule.SlotSet
	// Peers are the queue's shards with their addresses and owned slots (for handovers and for
	// telling a worker where its lease went); Arriving names who gives this shard its incoming
	// slots, or gave it the slots of the last committed handoff. Both empty standalone.
	Peers    []Peer
	Arriving []Arrival
	// Objectives are the freshness objectives the shard counts events for (core.Core's
	// SetObjectives), each with the percentile it promises (for the metrics).
	Objectives []ObjectiveSetting
}

// ObjectiveSetting is one freshness objective of a shard's settings.
type ObjectiveSetting struct {
	policy.Objective
	// Percentile is the share of the events, in percent, that must be good.
	Percentile float64
}

// coreObjectives returns the objectives as the core counts them.
func (s Settings) coreObjectives() []policy.Objective {
	out := make([]policy.Objective, len(s.Objectives))
	for i, o := range s.Objectives {
		out[i] = o.Objective
	}
	return out
}

// Validate says what is wrong with the settings.
func (s Settings) Validate() error {
	var errs []error
	if err := s.coreConfig().Validate(); err != nil {
		errs = append(errs, err)
	}
	if s.VerifyInterval < 0 {
		errs = append(errs, fmt.Errorf("verifyInterval %v is negative", s.VerifyInterval))
	}
	if s.LeaseDuration <= 0 {
		errs = append(errs, fmt.Errorf("leaseDuration %v must be positive", s.LeaseDuration))
	}
	if s.MaxLease < 0 || (s.MaxLease > 0 && s.MaxLease < s.LeaseDuration) {
		errs = append(errs, fmt.Errorf("maxLease %v must be 0 (the lease duration) or at least the lease duration %v", s.MaxLease, s.LeaseDuration))
	}
	if s.VerifyWalkRate < 0 {
		errs = append(errs, fmt.Errorf("verifyWalkRate %d rows/s is negative", s.VerifyWalkRate))
	}
	if err := policy.ValidateObjectives(s.coreObjectives()); err != nil {
		errs = append(errs, err)
	}
	for _, o := range s.Objectives {
		if !(o.Percentile > 0 && o.Percentile < 100) {
			errs = append(errs, fmt.Errorf("objective %q: percentile %v must be within (0, 100)", o.Name, o.Percentile))
		}
	}
	for _, sl := range s.Owned.Slots() {
		if s.Incoming.Has(sl) {
			errs = append(errs, fmt.Errorf("slot %d is both owned and incoming", sl))
			break
		}
	}
	return errors.Join(errs...)
}

// WalkInterval is the time between verification walks: min(VerifyInterval, Window/3) with a
// window (VerifyInterval 0 counts as unset), VerifyInterval without; 0 means no periodic walks.
func (s Settings) WalkInterval() time.Duration {
	if s.Window > 0 {
		if s.VerifyInterval > 0 && s.VerifyInterval < s.Window/3 {
			return s.VerifyInterval
		}
		return s.Window / 3
	}
	return s.VerifyInterval
}

func (s Settings) coreConfig() policy.Config {
	return policy.Config{Window: s.Window, SubmittedBoost: s.SubmittedBoost, UrgentMaxShare: s.UrgentMaxShare,
		Floors: s.Floors, Reschedule: s.Reschedule, StarvationBound: policy.DefaultStarvationBound}
}

// Options are a shard's fixed parts.
type Options struct {
	// Name is the shard's name, reported in status.
	Name string
	// Store is the schedule store. Either Store or Open is required.
	Store store.Store
	// Open, when Store is nil, opens the store: Run calls it until it succeeds, with back-off
	// (ConnectBackoffMin doubling up to ConnectBackoffMax). Until then the shard serves its
	// status as unready, inexact, with Open's error (which must not hold secrets such as a
	// password), and claims wait for the load.
	Open func(ctx context.Context) (store.Store, error)
	// ConnectBackoffMin and ConnectBackoffMax bound the pause between calls of Open;
	// DefaultConnectBackoffMin and DefaultConnectBackoffMax when zero.
	ConnectBackoffMin, ConnectBackoffMax time.Duration
	// Clock returns the current time; time.Now when nil.
	Clock func() time.Time
	// Log receives the shard's log lines.
	Log logr.Logger
	// Metrics, when set, receives the shard's Prometheus event metrics (shardmetrics.New).
	Metrics *shardmetrics.Metrics
	// Peers asks other shards for the handover of slots given to this one; nil: none can be
	// asked, and such slots are held back for the longest lease (HandoverGiveUp after they
	// arrive).
	Peers PeerClient
	// StateFile is the keeper's Pod-local state file (StateFileIn of the Pod's emptyDir): the
	// horizon of its leases, for a process restarted in the same Pod (session.go). Empty: none.
	StateFile string
}

// Defaults of Options.ConnectBackoffMin and ConnectBackoffMax.
const (
	DefaultConnectBackoffMin = time.Second
	DefaultConnectBackoffMax = 30 * time.Second
)

// WalkReport is the record of one walk.
type WalkReport struct {
	StartedAt  time.Time
	FinishedAt time.Time
	// Full walks cover every owned and incoming slot and move the edge; others read only slots
	// that just arrived.
	Full    bool
	Partial bool
	Failed  bool
	Counts  core.WalkCounts
	// UnreadSegments is the number of segments that could not be read completely.
	UnreadSegments int
	// Unavailable says that the walk failed or was partial only because the store did not answer
	// (every unread segment's error is store.ErrUnavailable): Run walks again as soon as the store
	// is seen to answer.
	Unavailable bool
	Err         string
}

// Shard runs one keeper shard: load, subscribe, verify, serve. Its exported methods are safe for
// concurrent use.
type Shard struct {
	name  string
	clock func() time.Time
	log   logr.Logger
	m     *shardmetrics.Metrics

	// st is the store: set by NewShard, or by Run once open succeeds (under mu, before the
	// first walk; everything that uses it runs after that walk or in Run).
	st          store.Store
	open        func(ctx context.Context) (store.Store, error)
	openBackoff *backoff

	walkMu sync.Mutex // one walk at a time
	// pause waits between the steps of a paced walk, adopting settings from the walk's updates
	// (pauseAdopting; tests record the pauses instead).
	pause func(ctx context.Context, d time.Duration, updates <-chan Settings)

	statusMu   sync.Mutex // guards lastStatus; one status computation at a time
	lastStatus *shardapi.Status

	mu       sync.Mutex
	core     *core.Core
	settings Settings
	// adopt is Run's settings channel, which a full walk after the load reads between its steps
	// (a paced one in its pauses; nil outside Run).
	adopt <-chan Settings
	// cov holds the rules of what the shard vouches for: loaded, edge, gaps, complete, exact,
	// prepared.
	cov          *coverage.Ledger
	lastWalk     *WalkReport
	walkingSince time.Time
	ownedNotHeld core.WalkCounts
	ownedAsOf    time.Time
	lastErr      string
	sub          store.Subscription
	wake         chan struct{} // asks Run to walk soon
	fullWanted   bool          // the walk Run does on wake must be full (gap resumed, window changed)

	// claimKeyBytes is the key bytes per row of the last claim that got rows, for sizing the next
	// claim's buffers before it takes the lock (Claim).
	claimKeyBytes atomic.Int64
	// claimShort is, when the last claim got fewer rows than it asked for, the rows the next one
	// makes room for (claimRoom); 0 otherwise.
	claimShort atomic.Int64

	// The subscription follows the slot set in the background (resubscribe), so that a database
	// outage never holds up the run loop: subWant is the set it must follow (version subSeq),
	// subPending says it does not follow it yet — walks wait until it does — and resub wakes
	// resubscribe.
	subWant    []int
	subSeq     uint64
	subPending bool
	resub      chan struct{}

	// Leases across a handoff (handover.go), all under mu: who gives each arriving slot, the
	// handover records of slots given away and the leases that left with them, the slots held
	// back until their giver's leases arrive (runHandovers is woken by handoverWake), why each
	// fenced slot is fenced, the last known URL of each peer, and when every lease an earlier
	// process of this shard may have granted has ended (zero: none).
	peers        PeerClient
	giverOf      [schedule.NumSlots]giverInfo
	out          map[int]*outRecord
	moved        map[string]movedLease
	awaiting     map[int]awaitedHandover
	fenceWhy     [schedule.NumSlots]string
	peerURL      map[string]string
	handoverWake chan struct{}
	inherited    time.Time
	// staleLogged is when an answer from a giver behind the commit was last logged, by giver
	staleLogged map[string]time.Time

	// The keeper's session (session.go): this process's random id, its Pod's (from the state
	// file), the state file, its lease horizon (under horizonMu, which serialises its writes),
	// and whether it drains (hands out nothing more).
	instance  string
	pod       string
	stateFile string
	horizonMu sync.Mutex
	horizon   time.Time
	draining  atomic.Bool

	// loaded mirrors cov.Loaded() (set when a walk finishes, under mu) for Claim to answer
	// ErrLoading without the lock, which the load holds while it builds its trees
	loaded atomic.Bool

	// awaitingAnswer is set by Run after a walk the store did not answer (WalkReport.Unavailable),
	// until the store is seen to answer again (noteAnswered: an event batch, a resumption, a
	// written completion, a ping), which then signals answered so that Run walks at once.
	awaitingAnswer atomic.Bool
	answered       chan struct{}
}

// NewShard returns a shard that has loaded nothing yet.
func NewShard(opts Options, s Settings) (*Shard, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("shard settings: %w", err)
	}
	if opts.Store == nil && opts.Open == nil {
		return nil, errors.New("shard: no store (Options.Store or Options.Open)")
	}
	if opts.ConnectBackoffMin <= 0 {
		opts.ConnectBackoffMin = DefaultConnectBackoffMin
	}
	if opts.ConnectBackoffMax < opts.ConnectBackoffMin {
		opts.ConnectBackoffMax = max(DefaultConnectBackoffMax, opts.ConnectBackoffMin)
	}
	cfg := s.coreConfig()
	cfg.FirstLease = rand.Uint64() >> 1 // tokens of an earlier process are not accepted
	c, err := core.New(cfg)
	if err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if err := c.SetObjectives(opts.Clock(), s.coreObjectives()); err != nil {
		return nil, err
	}
	sh := &Shard{
		name: opts.Name, st: opts.Store, open: opts.Open, clock: opts.Clock, log: opts.Log, m: opts.Metrics,
		openBackoff: newBackoff(opts.ConnectBackoffMin, opts.ConnectBackoffMax),
		core:        c, settings: s, cov: coverage.New(s.Window, s.Epoch), wake: make(chan struct{}, 1),
		resub: make(chan struct{}, 1), answered: make(chan struct{}, 1),
		peers: opts.Peers, out: map[int]*outRecord{}, moved: map[string]movedLease{}, awaiting: map[int]awaitedHandover{},
		peerURL: map[string]string{}, handoverWake: make(chan struct{}, 1), staleLogged: map[string]time.Time{},
		instance: randomID(), stateFile: opts.StateFile,
	}
	sh.pause = sh.pauseAdopting
	var states [schedule.NumSlots]core.SlotState
	for _, sl := range s.Owned.Slots() {
		states[sl] = core.SlotOwned
	}
	for _, sl := range s.Incoming.Slots() {
		states[sl] = core.SlotIncoming
	}
	c.SetSlots(&states)
	sh.notePeers(s.Peers)
	sh.noteArrivals(s.Arriving)
	// slots the last committed handoff gave this shard: their giver may still have leases
	sh.takeOver(opts.Clock(), s.Owned.Slots(), true)
	return sh, nil
}

// notePeers remembers the peers' URLs (a Pod being deleted drops out of the settings while its
// handover may still be asked for). Called with s.mu held or before the shard runs.
func (s *Shard) notePeers(ps []Peer) {
	for _, p := range ps {
		if p.URL != "" {
			s.peerURL[p.Name] = p.URL
		}
	}
}

// held returns the slots the shard holds rows of: owned and incoming.
func (s *Settings) held() []int {
	all := s.Owned
	for _, sl := range s.Incoming.Slots() {
		all.Add(sl)
	}
	return all.Slots()
}

// Subscribe starts the change-event subscription of the shard's slots. It returns once the
// subscription is active; call it before the first walk.
func (s *Shard) Subscribe(ctx context.Context) error {
	s.mu.Lock()
	slots := s.settings.held()
	s.mu.Unlock()
	sub, err := s.st.Subscribe(ctx, slots)
	if err != nil {
		return fmt.Errorf("subscribing to %d slots: %w", len(slots), err)
	}
	s.mu.Lock()
	s.sub = sub
	s.mu.Unlock()
	return nil
}

// HandleBatch applies what the subscription delivered: events, a gap or a resumption.
func (s *Shard) HandleBatch(b store.Batch) {
	if b.Kind != store.KindGap {
		s.noteAnswered() // the store's connection delivers again
	}
	if b.Kind == store.KindEvents {
		// in bounded steps, so claims wait for at most one step
		for evs := b.Events; len(evs) > 0; {
			n := min(len(evs), walkStepRows)
			s.mu.Lock()
			now := s.clock()
			// read the step's keys' index entries ahead: a third less time under the lock
			// (BenchmarkKeeperApply/…/step=128)
			s.core.Prefetch(n, func(i int) string { return evs[i].Row.Key })
			for i := range evs[:n] {
				e := &evs[i]
				if e.Deleted {
					s.core.Delete(now, e.Row.Key, e.Row.Slot(), e.Row.Rev)
				} else {
					s.core.Apply(now, e.Row)
				}
			}
			s.unlockStep()
			evs = evs[n:]
		}
		s.m.EventsApplied(len(b.Events))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	switch b.Kind {
	case store.KindGap:
		if s.cov.OnGap(now, errString(b.Err)) {
			s.m.Gap()
			s.log.Error(b.Err, "Subscription lost continuity; the shard is inexact until a walk after it resumes", "shard", s.name)
		}
	case store.KindResumed:
		if ended, lasted := s.cov.OnResumed(now); ended {
			s.log.Info("Subscription resumed; walking to repair missed writes", "shard", s.name, "gapSeconds", lasted.Seconds())
		}
		s.fullWanted = true
		s.requestWalk()
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// requestWalk asks Run to walk as soon as it can.
func (s *Shard) requestWalk() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Walk runs one walk of every owned and incoming slot, or, when full is false, only of the
// incoming slots not yet prepared. It returns the walk's report.
func (s *Shard) Walk(ctx context.Context, full bool) WalkReport {
	s.walkMu.Lock()
	defer s.walkMu.Unlock()
	if full {
		s.presize(ctx)
	}

	s.mu.Lock()
	start := s.clock()
	var slots []int
	if full {
		slots = s.settings.held()
	} else {
		slots = s.settings.Incoming.Slots()
	}
	bulk := full && !s.cov.Loaded() // the load: rows are sorted into their trees at its end
	if bulk {
		s.core.BeginBulk()
	}
	if err := s.core.BeginWalk(start, s.cov.Edge(), slots); err != nil {
		s.mu.Unlock()
		return WalkReport{StartedAt: start, Failed: true, Err: err.Error()}
	}
	s.walkingSince = start
	started := s.cov.WalkStarting(start, full)
	pacer := walkPacer{rate: s.settings.VerifyWalkRate} // the rate when the walk starts
	// A full walk after the load adopts settings between its steps (paced ones in their pauses),
	// so that a slot handoff does not wait for a walk of millions of rows. The load does not: its
	// rows are sorted into their trees at its end (bulk), and the shard serves nothing until then.
	var updates <-chan Settings
	if full && !bulk {
		updates = s.adopt
	}
	s.mu.Unlock()

	var unread []int
	answered := true // every unread segment's error says the store did not answer
	res, err := s.st.Walk(ctx, slots, func(item store.WalkItem) error {
		if item.End {
			if item.Err != nil {
				for sl := item.Segment.First; sl <= item.Segment.Last; sl++ {
					unread = append(unread, sl)
				}
				answered = answered && errors.Is(item.Err, store.ErrUnavailable)
			}
			return nil
		}
		// a page in bounded steps, so claims wait for at most one step
		for rows := item.Rows; len(rows) > 0; {
			n := min(len(rows), walkStepRows)
			s.mu.Lock()
			now := s.clock()
			s.core.Prefetch(n, func(i int) string { return rows[i].Key })
			for i := range rows[:n] {
				s.core.WalkRow(now, rows[i])
			}
			paced := full && pacer.rate > 0 && s.verifying(now)
			s.unlockStep()
			rows = rows[n:]
			if d := pacer.step(paced, n, s.clock()); d > 0 {
				s.pause(ctx, d, updates)
			} else if updates != nil {
				select {
				case ns := <-updates:
					s.adoptSettings(ctx, ns)
				default:
				}
			}
		}
		return nil
	})

	rep := WalkReport{StartedAt: start, Full: full, UnreadSegments: res.Failed()}
	aborted := err != nil || (len(slots) > 0 && len(res.Segments) > 0 && res.Failed() == len(res.Segments))
	counts := s.closeWalk(unread, aborted)
	s.mu.Lock()
	defer s.mu.Unlock()
	if bulk {
		s.core.EndBulk()
	}
	s.walkingSince = time.Time{}
	switch {
	case err != nil:
		rep.Failed, rep.Err = true, err.Error()
	case aborted:
		rep.Failed = true
		rep.Err = fmt.Sprintf("every segment failed, the first: %v", firstSegmentErr(res))
	default:
		rep.Counts = counts
		rep.Partial = res.Failed() > 0
		if rep.Partial {
			rep.Err = fmt.Sprintf("%d of %d segments unread, the first: %v", res.Failed(), len(res.Segments), firstSegmentErr(res))
		}
	}
	rep.Unavailable = (rep.Failed || rep.Partial) && len(unread) > 0 && answered
	rep.FinishedAt = s.clock()
	firstLoad := s.cov.OnWalkFinished(started, coverage.WalkEnd{Failed: rep.Failed, Partial: rep.Partial, IncomingWalked: s.allIncomingWalked()})
	s.loaded.Store(s.cov.Loaded())
	if full && !rep.Failed {
		s.ownedNotHeld, s.ownedAsOf = rep.Counts, start
	}
	s.lastWalk = &rep
	s.lastErr = rep.Err
	s.m.Walk(shardmetrics.Walk{StartedAt: rep.StartedAt, FinishedAt: rep.FinishedAt, Failed: rep.Failed, Partial: rep.Partial,
		UnreadSegments: rep.UnreadSegments, Counts: rep.Counts})
	switch {
	case rep.Failed:
		s.log.Error(errors.New(rep.Err), "Walk failed", "shard", s.name, "full", full, "slots", len(slots))
	case rep.Partial:
		s.log.Error(errors.New(rep.Err), "Walk was partial", "shard", s.name, "unreadSegments", rep.UnreadSegments)
	case firstLoad:
		s.log.Info("Loaded: serving claims", "shard", s.name, "scanned", rep.Counts.Scanned, "held", s.core.Held(),
			"invalid", rep.Counts.Invalid, "seconds", rep.FinishedAt.Sub(start).Seconds())
	default:
		s.log.V(1).Info("Walk finished", "shard", s.name, "full", full, "scanned", rep.Counts.Scanned,
			"admitted", rep.Counts.Admitted, "repaired", rep.Counts.Repaired, "seconds", rep.FinishedAt.Sub(start).Seconds())
	}
	return rep
}

// verifying says whether a full walk running at now only verifies what the shard holds, so it
// may be paced (walkPacer): no slots are arriving and the shard is exact (loaded, no gap since the
// last full walk began, before its edge, the last walk whole, every owned slot walked). Complete
// is part of Exact, asked first because it is O(1) and false during the load, which it spares
// ownedWalked's visit of every slot at each step.
func (s *Shard) verifying(now time.Time) bool {
	return s.settings.Incoming.IsEmpty() && s.cov.Complete(now) && s.cov.Exact(now, s.ownedWalked())
}

// walkStepRows is how many walked rows, change events or completions the shard applies per hold
// of its lock (closing a walk, 16 times as many records are visited): about 0.3 ms at 10M rows.
const walkStepRows = 128

// unlockStep releases the lock between two steps of a long job and lets the goroutines waiting
// for it (claims) run before the job takes it again: an unlocked sync.Mutex goes to whoever asks
// first, usually the goroutine that just released it.
func (s *Shard) unlockStep() {
	s.mu.Unlock()
	runtime.Gosched()
}

// closeWalk ends the running walk (see Core.CloseWalk), visiting the rows left to visit in
// bounded steps with the lock released between them, and returns the walk's counts.
func (s *Shard) closeWalk(unread []int, abort bool) core.WalkCounts {
	s.mu.Lock()
	s.core.CloseWalk(unread, abort)
	s.mu.Unlock()
	for {
		s.mu.Lock()
		counts, done := s.core.SweepWalk(16 * walkStepRows)
		s.unlockStep()
		if done {
			return counts
		}
	}
}

func firstSegmentErr(res store.WalkResult) error {
	for _, sg := range res.Segments {
		if sg.Err != nil {
			return fmt.Errorf("slots %s: %w", sg.Segment, sg.Err)
		}
	}
	return nil
}

// allIncomingWalked says whether every incoming slot has been read by a finished walk.
func (s *Shard) allIncomingWalked() bool {
	for _, sl := range s.settings.Incoming.Slots() {
		if !s.core.WalkedBefore(sl) {
			return false
		}
	}
	return true
}

// ownedWalked says whether every owned slot has been read by a finished walk since it joined.
func (s *Shard) ownedWalked() bool {
	for sl := range schedule.NumSlots { // not Owned.Slots(): a paced walk asks at every step
		if s.settings.Owned.Has(sl) && !s.core.WalkedBefore(sl) {
			return false
		}
	}
	return true
}

// UpdateSettings adopts new settings: policy at once, the verification walk rate from the next
// walk; slots that left are dropped, slots that arrive are held (incoming) or served (owned).
// Once subscribed, the subscription follows the slot set in the background (Run's resubscriber:
// it may wait for the database), and walks wait until it does. A walk is requested when slots
// arrived or the window changed. It never waits for the database.
func (s *Shard) UpdateSettings(ctx context.Context, ns Settings) error {
	if err := ns.Validate(); err != nil {
		return fmt.Errorf("shard settings: %w", err)
	}
	s.mu.Lock()
	old := s.settings
	if ns.Epoch < old.Epoch {
		s.mu.Unlock()
		return fmt.Errorf("settings epoch %d is older than the current %d", ns.Epoch, old.Epoch)
	}
	if err := s.core.SetConfig(ns.coreConfig()); err != nil {
		s.mu.Unlock()
		return err
	}
	// the events up to now are decided under the old objectives and slots before either changes
	s.core.ObjectivesCatchUp(s.clock(), math.MaxInt)
	if !slices.EqualFunc(ns.Objectives, old.Objectives, func(a, b ObjectiveSetting) bool { return a.SameAs(b.Objective) && a.Percentile == b.Percentile }) {
		if err := s.core.SetObjectives(s.clock(), ns.coreObjectives()); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	arrived := false
	var states [schedule.NumSlots]core.SlotState
	var leaving, owning []int
	for sl := 0; sl < schedule.NumSlots; sl++ {
		switch {
		case ns.Owned.Has(sl):
			states[sl] = core.SlotOwned
		case ns.Incoming.Has(sl):
			states[sl] = core.SlotIncoming
		}
		was := s.core.SlotState(sl)
		if was == core.SlotNone && states[sl] != core.SlotNone {
			arrived = true
			delete(s.out, sl) // back here: its old handover record is void
		}
		if was == core.SlotOwned && states[sl] == core.SlotNone {
			leaving = append(leaving, sl)
		}
		if was != core.SlotOwned && states[sl] == core.SlotOwned {
			owning = append(owning, sl)
		}
	}
	now := s.clock()
	s.notePeers(ns.Peers)
	s.noteArrivals(ns.Arriving)
	s.giveAway(now, leaving, ns.Epoch) // their leases out of the core before it drops the slots
	s.core.SetSlots(&states)           // time in the slots: the rows that leave go in steps (drain)
	s.settings = ns
	cover := s.takeOver(now, owning, false)
	for sl := range s.giverOf {
		if states[sl] == core.SlotNone {
			s.giverOf[sl] = giverInfo{}
			delete(s.awaiting, sl)
			s.fenceWhy[sl] = ""
		}
	}
	windowChanged := s.cov.OnSettings(ns.Window, ns.Epoch, arrived, s.allIncomingWalked())
	if windowChanged {
		s.fullWanted = true // incomplete until a full walk
	}
	if s.sub != nil && !slices.Equal(s.subWant, ns.held()) {
		s.subWant, s.subSeq, s.subPending = ns.held(), s.subSeq+1, true
		select {
		case s.resub <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()

	if arrived || windowChanged {
		s.requestWalk()
	}
	if err := s.coverLeases(cover); err != nil {
		s.log.Error(err, "Cannot record the end of a fence in the state file", "shard", s.name)
	}
	s.drain() // the rows of the slots that left, in steps
	return nil
}

// drainStepRows bounds the departed rows (of slots that left: core.Core.Drain) one hold of the
// shard's lock removes: a few hundred microseconds.
const drainStepRows = 256

// drain removes the core's departed rows, the rows of slots that left (core.Core.Drain), in steps
// of drainStepRows with the lock released between them, so that claims wait for one step at most;
// a commit that gives slots away leaves them, a summary or an explanation needs them gone.
func (s *Shard) drain() {
	for {
		s.mu.Lock()
		done := s.core.Drain(drainStepRows)
		s.unlockStep()
		if done {
			return
		}
	}
}

// resubscribe makes the subscription follow subWant whenever it changes, until ctx ends (or the
// subscription is closed). SetSlots waits while the subscription reconnects; the run loop does
// not. Once the subscription follows the newest set, it asks for a walk.
func (s *Shard) resubscribe(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.resub:
		}
		for {
			s.mu.Lock()
			want, seq, sub := s.subWant, s.subSeq, s.sub
			s.mu.Unlock()
			if err := sub.SetSlots(ctx, want); err != nil {
				if ctx.Err() == nil {
					err = fmt.Errorf("re-subscribing to %d slots: %w", len(want), err)
					s.setErr(err)
					s.log.Error(err, "Cannot follow the new slot set", "shard", s.name)
				}
				return
			}
			s.mu.Lock()
			current := s.subSeq == seq
			if current {
				s.subPending = false
			}
			s.mu.Unlock()
			if current {
				s.log.V(1).Info("Subscription follows the slot set", "shard", s.name, "slots", len(want))
				s.requestWalk()
				break
			}
		}
	}
}

// resubscribing says whether the subscription does not yet follow the slot set.
func (s *Shard) resubscribing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subPending
}

// Run loads the shard, then keeps it verified: it subscribes, walks, applies events, walks again
// every WalkInterval (earlier after a failed or partial walk, at once after a gap resumes or slots
// arrive), and adopts settings from updates — at once, even while the database is unreachable. It
// returns when ctx ends.
//
// A failed or partial walk is tried again after a back-off from failedWalkBackoffMin doubling,
// never longer than the walk interval (nor failedWalkBackoffMax). When the store did not answer it
// (WalkReport.Unavailable) the walk is tried again as soon as the store is seen to answer — an
// event batch or resumption from the subscription, a written completion, or a ping, sent every
// pingInterval meanwhile — and no sooner than failedWalkBackoffMin after the failure: a shard is
// exact again within about a walk of the database coming back, however long it was gone.
func (s *Shard) Run(ctx context.Context, updates <-chan Settings) error {
	s.mu.Lock()
	s.adopt = updates
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.adopt = nil
		s.mu.Unlock()
	}()
	if err := s.connect(ctx, updates); err != nil {
		return err
	}
	if err := s.beginSession(ctx, updates); err != nil {
		return err
	}
	backoff := newBackoff(failedWalkBackoffMin, failedWalkBackoffMax)
	for {
		err := s.Subscribe(ctx)
		if err == nil {
			break
		}
		s.setErr(err)
		s.log.Error(err, "Cannot subscribe; retrying", "shard", s.name)
		if !s.sleepAdopting(ctx, updates, backoff.next()) {
			return ctx.Err()
		}
	}
	defer func() { _ = s.sub.Close() }()
	// The subscription ends with the caller's ctx (it is closed from a goroutine of its own
	// when ctx ends, possibly before ctx's children see the cancellation): a subscription
	// error after the caller's ctx ended is the shutdown, not a failure.
	caller := ctx
	ctx, stop := context.WithCancel(ctx) // ends resubscribe and consume when Run returns
	defer stop()
	s.mu.Lock()
	s.subWant = s.settings.held()
	s.mu.Unlock()
	go s.resubscribe(ctx)

	events := make(chan error, 1)
	go func() { events <- s.consume(ctx) }()
	go s.pingWhileAwaiting(ctx)
	go s.runHandovers(ctx)

	backoff.reset()
	nextFull := s.clock()  // the load
	var failedAt time.Time // when the last walk failed (failed: it did)
	failed := false
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		now := s.clock()
		// walks wait for the subscription to follow the slot set (resubscribe wakes the loop)
		if !now.Before(nextFull) && !s.resubscribing() {
			rep := s.Walk(ctx, true)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.mu.Lock()
			interval := s.settings.WalkInterval()
			s.mu.Unlock()
			failed = rep.Failed || rep.Partial
			switch {
			case failed:
				// inexact until a complete walk: try again soon (a database that just came back
				// may fail a first walk on connections that died with it), and never later than
				// a verification would come
				wait := backoff.next()
				if interval > 0 {
					wait = min(wait, interval)
				}
				failedAt = s.clock()
				nextFull = failedAt.Add(wait)
				s.awaitingAnswer.Store(rep.Unavailable)
			case interval > 0:
				backoff.reset()
				nextFull = rep.StartedAt.Add(interval)
			default:
				backoff.reset()
				nextFull = farFuture
			}
			if !failed {
				s.awaitingAnswer.Store(false)
			}
			continue
		}
		s.CheckEdge(now)
		s.catchUpObjectives(now, walkStepRows)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-events:
			if caller.Err() != nil {
				return caller.Err()
			}
			return err
		case ns := <-updates:
			s.adoptSettings(ctx, ns)
		case <-s.answered:
			// the store answers again after a walk it did not answer: walk now (or once
			// failedWalkBackoffMin has passed since the failure, checked on the next tick)
			if failed {
				nextFull = latest(now, failedAt.Add(failedWalkBackoffMin))
			}
		case <-s.wake:
			s.mu.Lock()
			if s.subPending { // asked again once the subscription follows
				s.mu.Unlock()
				continue
			}
			full := s.fullWanted || !s.cov.Loaded()
			s.fullWanted = false
			s.mu.Unlock()
			if full {
				nextFull = s.clock()
			} else {
				s.Walk(ctx, false)
			}
		case <-tick.C:
		}
	}
}

var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// The back-off of failed or partial walks (Run): from failedWalkBackoffMin doubling up to
// failedWalkBackoffMax, and never beyond the walk interval.
const (
	failedWalkBackoffMin = time.Second
	failedWalkBackoffMax = time.Minute
)

// pingInterval is how often Run pings a store that did not answer its last walk (store.Pinger),
// to walk again as soon as it answers; pingTimeout bounds one ping.
const (
	pingInterval = time.Second
	pingTimeout  = 5 * time.Second
)

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// noteAnswered records that the store answered (an event batch or resumption, a written
// completion, a ping): when Run awaits that after a walk the store did not answer, it walks now.
func (s *Shard) noteAnswered() {
	if s.awaitingAnswer.CompareAndSwap(true, false) {
		select {
		case s.answered <- struct{}{}:
		default:
		}
	}
}

// pingWhileAwaiting pings the store every pingInterval while Run awaits an answer (a walk it did
// not answer), until ctx ends; a store that cannot be pinged is left to the other signs and the
// back-off.
func (s *Shard) pingWhileAwaiting(ctx context.Context) {
	p, ok := s.st.(store.Pinger)
	if !ok {
		return
	}
	t := time.NewTicker(pingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !s.awaitingAnswer.Load() {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		err := p.Ping(pctx)
		cancel()
		if err == nil {
			s.noteAnswered()
		}
	}
}

// connect opens the store when the shard has none yet (Options.Open), retrying with back-off
// until it succeeds or ctx ends; meanwhile the status carries the error and settings updates are
// adopted. It returns only ctx's error.
func (s *Shard) connect(ctx context.Context, updates <-chan Settings) error {
	s.mu.Lock()
	have := s.st != nil
	s.mu.Unlock()
	if have {
		return nil
	}
	for {
		st, err := s.open(ctx)
		if err == nil {
			s.mu.Lock()
			s.st, s.lastErr = st, ""
			s.mu.Unlock()
			s.openBackoff.reset()
			s.log.Info("Store open", "shard", s.name)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.setErr(err)
		wait := s.openBackoff.next()
		s.log.Error(err, "Cannot open the store; the shard is unready, retrying", "shard", s.name, "retryIn", wait)
		if !s.sleepAdopting(ctx, updates, wait) {
			return ctx.Err()
		}
	}
}

// adoptSettings adopts settings received from Run's source (UpdateSettings); settings it refuses are
// logged and kept in the status as the shard's error, and the shard stays as it was.
func (s *Shard) adoptSettings(ctx context.Context, ns Settings) {
	if err := s.UpdateSettings(ctx, ns); err != nil {
		s.setErr(err)
		s.log.Error(err, "Rejected new settings", "shard", s.name)
	}
}

// pauseAdopting is a paced walk's pause: it waits d, or until it has adopted settings from updates
// (Run's, as the walk read them when it started), or until ctx ends. A verification walk paced over minutes thus does not hold back
// membership changes: settings apply mid-walk (slots that leave leave the walk too; see
// core.Core.SetSlots), and slots that arrive end the pacing (verifying), so the walk finishes at
// full speed and the run loop walks the arriving slots next. Other settings leave the pacing as
// it was: the next pause makes up for this one's early end. (Unpaced walks take settings
// between their steps without waiting; see Walk.)
func (s *Shard) pauseAdopting(ctx context.Context, d time.Duration, updates <-chan Settings) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case ns := <-updates:
		s.adoptSettings(ctx, ns)
	}
}

// sleepAdopting waits d, adopting settings updates meanwhile. It returns false when ctx ended.
func (s *Shard) sleepAdopting(ctx context.Context, updates <-chan Settings, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case ns := <-updates:
			s.adoptSettings(ctx, ns)
		case <-t.C:
			return true
		}
	}
}

// consume applies the subscription's batches until ctx ends.
func (s *Shard) consume(ctx context.Context) error {
	for {
		b, err := s.sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("reading change events: %w", err)
		}
		s.HandleBatch(b)
	}
}

// catchUpObjectives decides the freshness events whose lateness has passed at now (core.Core's
// ObjectivesCatchUp) in steps of at most about maxRows rows, releasing the lock between them, so
// claims wait for at most one step.
func (s *Shard) catchUpObjectives(now time.Time, maxRows int) {
	for {
		s.mu.Lock()
		if s.core.ObjectivesCatchUp(now, maxRows) {
			s.mu.Unlock()
			return
		}
		s.unlockStep()
	}
}

// CheckEdge logs once per episode when the clock passes the edge. (The edge metric is collected
// at scrape time, see StatusCollector.)
func (s *Shard) CheckEdge(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch entered, left, ahead := s.cov.EdgeLag(now); {
	case entered:
		s.log.Error(errors.New("clock passed the edge"), "Edge lagging: rows due after the edge may be unseen; the shard is incomplete until a walk finishes",
			"shard", s.name, "edge", s.cov.Edge().At, "behindSeconds", -ahead.Seconds())
	case left:
		s.log.Info("Edge ahead of the clock again", "shard", s.name, "aheadSeconds", ahead.Seconds())
	}
}

func (s *Shard) setErr(err error) {
	s.mu.Lock()
	s.lastErr = err.Error()
	s.mu.Unlock()
}

// Ready says whether the shard has loaded (finished its first full walk).
func (s *Shard) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cov.Loaded()
}

type backoff struct {
	min, max, cur time.Duration
}

func newBackoff(lo, hi time.Duration) *backoff { return &backoff{min: lo, max: hi} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }
