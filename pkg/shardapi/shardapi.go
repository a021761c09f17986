// Package shardapi is the wire contract of a keeper shard's HTTP API: the JSON bodies of
// /v1/claim, /v1/complete, /v1/release, /v1/extend, /v1/rows/{key} and /v1/status. The keeper serves it; the operator, the
// metrics provider, the worker simulator and users' tools read it. Fields may be added; none may
// change meaning (docs/design.md, "What a shard vouches for"). Every time is RFC 3339 and every duration is seconds.
// Package wire (pkg/shardapi/wire) encodes and decodes the hot messages without reflection.
package shardapi

import "time"

// Queue states reported in Status.Status.
const (
	// StatusUnready: the shard cannot vouch that it sees all due work and holds no due rows.
	StatusUnready = "unready"
	// StatusQueued: the shard holds due rows.
	StatusQueued = "queued"
	// StatusEmpty: the shard is complete and no row is due. Never reported while unseen work
	// may be due.
	StatusEmpty = "empty"
)

// Status is the body of GET /v1/status.
type Status struct {
	Shard          string    `json:"shard"`
	AsOf           time.Time `json:"asOf"`
	Status         string    `json:"status"`
	Complete       bool      `json:"complete"`
	Exact          bool      `json:"exact"`
	Window         float64   `json:"window"`
	VerifyInterval float64   `json:"verifyInterval"`
	// VerifyWalkRate is the most rows a second the shard's verification walks read (0: unpaced),
	// as its settings say now (a walk in progress keeps the rate it started with). Absent (nil)
	// from keepers that predate it.
	VerifyWalkRate *int       `json:"verifyWalkRate,omitempty"`
	Edge           *time.Time `json:"edge"`
	// EdgeAheadSeconds is edge − asOf; negative when the edge lags behind the clock. Absent
	// (null) before the first walk finished, or when the window is 0 and the edge is unbounded.
	EdgeAheadSeconds *float64   `json:"edgeAheadSeconds"`
	Gap              *Gap       `json:"gap"`
	Membership       Membership `json:"membership"`
	Rows             Rows       `json:"rows"`
	// Due counts held rows with due <= asOf in owned slots (not incoming).
	Due        int            `json:"due"`
	Leased     int            `json:"leased"`
	DuePerSlot map[string]int `json:"duePerSlot"`
	// DuePerIncomingSlot is the due count of each incoming slot the shard has walked (not part of
	// Due). During a handoff the operator takes a moving slot's count from here while the new
	// owner has not adopted the commit yet, so the sum stays exact through the switch (the rule:
	// pkg/membership's doc, "When a moving slot's count counts").
	DuePerIncomingSlot map[string]int `json:"duePerIncomingSlot,omitempty"`
	Lateness           Lateness       `json:"lateness"`
	Oldest             *Oldest        `json:"oldest"`
	ByRoute            map[string]int `json:"byRoute"`
	Classes            []Class        `json:"classes"`
	Coming             Coming         `json:"coming"`
	LastWalk           *Walk          `json:"lastWalk"`
	// WalkingSince is the start of the walk in progress, if any.
	WalkingSince *time.Time `json:"walkingSince"`
	// HeldBack counts the due rows of owned slots that are fenced (Fences): handed out to nobody
	// until their fence ends. They are due and counted in Due. Absent when none.
	HeldBack int `json:"heldBack,omitempty"`
	// Fences are the owned slots whose rows the shard hands out to nobody yet, and why: the
	// leases an earlier owner of them may have granted are not known yet (a handover it awaits)
	// or not at all (a dead keeper's: until they must have ended). docs/design.md, "Leases
	// across a handoff".
	Fences []Fence `json:"fences,omitempty"`
	// Objectives are the freshness events the shard counted per objective of its settings
	// (spec.objectives), cumulative since Since: the keeper process started counting it, or its
	// definition last changed. Absent when there are none.
	Objectives []ObjectiveCount `json:"objectives,omitempty"`
	// Error is the last error the shard wants its operator to see (a failed walk, a store outage).
	Error string `json:"error,omitempty"`
}

// ObjectiveCount is one objective's events counted by a shard.
type ObjectiveCount struct {
	Name string `json:"name"`
	// Percentile is the share of the events, in percent, the objective promises good.
	Percentile float64 `json:"percentile"`
	// Good and Late are the events decided so far: renders that started within the objective's
	// maxLateness and completed, and due times that passed it without such a render.
	Good  uint64    `json:"good"`
	Late  uint64    `json:"late"`
	Since time.Time `json:"since"`
}

// Fence is a set of owned slots that hand out none of their rows until Until.
type Fence struct {
	// Slots in compact text form.
	Slots string `json:"slots"`
	// Until is when the fence ends; absent while it waits for a handover (then Reason names the
	// shard asked).
	Until *time.Time `json:"until,omitempty"`
	// Reason says why.
	Reason string `json:"reason"`
}

// Gap describes a loss of continuity of the change-event subscription.
type Gap struct {
	// Since is when continuity was lost.
	Since time.Time `json:"since"`
	// Resumed is when the subscription was back, if it is.
	Resumed *time.Time `json:"resumed,omitempty"`
	// Reason says why (the listener's error).
	Reason string `json:"reason,omitempty"`
}

// Membership is the shard's slot assignment as it knows it.
type Membership struct {
	Epoch int64 `json:"epoch"`
	// Owned and Incoming are slot sets in compact text form, e.g. "0-255,512-600".
	Owned    string `json:"owned"`
	Incoming string `json:"incoming"`
	// PreparedEpoch is the highest epoch whose incoming slots the shard has fully walked.
	PreparedEpoch int64 `json:"preparedEpoch"`
}

// Rows counts rows.
type Rows struct {
	Held    int `json:"held"`
	Invalid int `json:"invalid"`
	// OwnedNotHeld is the owned rows the last walk did not hold (beyond the window): approximate,
	// stamped with OwnedNotHeldAsOf.
	OwnedNotHeld       int        `json:"ownedNotHeld"`
	OwnedNotHeldAsOf   *time.Time `json:"ownedNotHeldAsOf"`
	OwnedNotHeldByHour []int      `json:"ownedNotHeldByHour,omitempty"`
	// OwnedNotHeldApproximate is true whenever the owned-not-held figures are given: they are
	// counted by the last full walk and not kept up to date by events.
	OwnedNotHeldApproximate bool `json:"ownedNotHeldApproximate"`
}

// Lateness summarises how late the due rows are, absolute (seconds) and relative (÷ cadence).
type Lateness struct {
	MaxSeconds  float64 `json:"maxSeconds"`
	P50Seconds  float64 `json:"p50Seconds"`
	P99Seconds  float64 `json:"p99Seconds"`
	MaxRelative float64 `json:"maxRelative"`
	P50Relative float64 `json:"p50Relative"`
	P99Relative float64 `json:"p99Relative"`
}

// Oldest is the held row that has been due the longest: when it came due. /v1/status is served
// without authentication, so it names no row (keepers before issue 45 also sent its key).
type Oldest struct {
	Due time.Time `json:"due"`
}

// Class is the due count of one (cadence, source) group, and how late its due rows are.
type Class struct {
	Cadence float64 `json:"cadence"`
	Source  string  `json:"source"`
	Due     int     `json:"due"`
	Held    int     `json:"held"`
	// MaxLateSeconds is how late the class's most overdue row is (0 when none is due).
	MaxLateSeconds float64 `json:"maxLateSeconds"`
	// LateBy counts the due rows by relative lateness (seconds late ÷ cadence), in LateBuckets
	// buckets: ≤ 0.1, (0.1, 0.5], (0.5, 1], (1, 2] and > 2 cadences late (LateBound). The
	// counts sum to Due and add up exactly across shards, unlike percentiles.
	LateBy []int `json:"lateBy"`
	// WaitingSince is when the class last had a row claimed or, if later, when its most overdue
	// claimable row came due: it has had due rows and no render since. Absent (nil) when it has
	// no claimable due row (urgent rows aside), and from keepers that predate it. The starvation
	// bound serves a class once it has waited half its cadence; one that has waited longer than
	// its cadence is starving (Starving): no claims are being made, or more classes are past
	// their bound than the claims have room for.
	WaitingSince *time.Time `json:"waitingSince,omitempty"`
}

// Waiting is how long the class has had due rows and no render at asOf (the status's AsOf); 0
// when it is not waiting.
func (c Class) Waiting(asOf time.Time) time.Duration {
	if c.WaitingSince == nil || !asOf.After(*c.WaitingSince) {
		return 0
	}
	return asOf.Sub(*c.WaitingSince)
}

// CadenceDuration is the class's cadence as a duration.
func (c Class) CadenceDuration() time.Duration {
	return time.Duration(c.Cadence * float64(time.Second))
}

// Starving reports whether the class has had due rows and no render for longer than its
// cadence at asOf (the status's AsOf).
func (c Class) Starving(asOf time.Time) bool {
	return c.Cadence > 0 && c.Waiting(asOf) > c.CadenceDuration()
}

// LateBuckets is the number of relative-lateness buckets of Class.LateBy.
const LateBuckets = 5

// LateBound returns the upper bound of Class.LateBy's bucket i (0 ≤ i < LateBuckets−1) in
// cadences, as the fraction num/den, so that lateness can be compared with it exactly in integer
// milliseconds: a row is in bucket i or below when (now − due) × den ≤ cadence × num. The last
// bucket has no upper bound.
func LateBound(i int) (num, den int64) {
	switch i {
	case 0:
		return 1, 10
	case 1:
		return 1, 2
	case 2:
		return 1, 1
	case 3:
		return 2, 1
	}
	panic("shardapi.LateBound: bucket out of range")
}

// Coming counts held rows not yet due by when they come due.
type Coming struct {
	Next15m int   `json:"next15m"`
	Next60m int   `json:"next60m"`
	Next24h int   `json:"next24h"`
	ByHour  []int `json:"byHour"`
	// CutAtWindow is true when the window is shorter than 24 h, so the later bins only count what
	// the window holds (see Rows.OwnedNotHeldByHour for the rest).
	CutAtWindow bool `json:"cutAtWindow"`
}

// Walk describes one verification walk.
type Walk struct {
	StartedAt      time.Time  `json:"startedAt"`
	FinishedAt     *time.Time `json:"finishedAt"`
	Partial        bool       `json:"partial"`
	Failed         bool       `json:"failed"`
	Scanned        int        `json:"scanned"`
	Admitted       int        `json:"admitted"`
	Repaired       int        `json:"repaired"`
	Invalid        int        `json:"invalid"`
	UnreadSegments int        `json:"unreadSegments"`
	Error          string     `json:"error,omitempty"`
}

// ClaimRequest is the body of POST /v1/claim.
type ClaimRequest struct {
	// N is how many rows to claim (1..MaxClaim).
	N int `json:"n"`
	// LeaseSeconds is the lease duration; 0 means the shard's default.
	LeaseSeconds float64 `json:"leaseSeconds,omitempty"`
}

// MaxClaim is the most rows one claim may ask for.
const MaxClaim = 10000

// ClaimResponse is the reply to POST /v1/claim.
type ClaimResponse struct {
	Items []ClaimedRow `json:"items"`
}

// ClaimedRow is one claimed row and its lease.
type ClaimedRow struct {
	Key     string    `json:"key"`
	Due     time.Time `json:"due"`
	Cadence float64   `json:"cadence"`
	Route   string    `json:"route"`
	Source  string    `json:"source"`
	Urgent  bool      `json:"urgent"`
	// Lease identifies this claim; complete and release must present it.
	Lease string `json:"lease"`
	// LeaseExpires is when the lease lapses and the row can be claimed again.
	LeaseExpires time.Time `json:"leaseExpires"`
}

// CompleteRequest is the body of POST /v1/complete.
type CompleteRequest struct {
	Items []Completion `json:"items"`
}

// Completion reports one rendered row.
type Completion struct {
	Key   string `json:"key"`
	Lease string `json:"lease"`
	// NextDue is the next render time; absent leaves it to the reschedule policy.
	NextDue *time.Time `json:"nextDue,omitempty"`
}

// CompleteResponse is the reply to POST /v1/complete.
type CompleteResponse struct {
	// Completed is the number of items written.
	Completed int `json:"completed"`
	// Results has one entry per item, in request order.
	Results []ItemResult `json:"results"`
}

// ItemResult is the outcome of one item of a complete or release request.
type ItemResult struct {
	Key string `json:"key"`
	// Error is empty when the item succeeded; otherwise it says why nothing was done for it
	// (the lease expired or was never current, the row is no longer held, ...).
	Error string `json:"error,omitempty"`
	// MovedTo, with Error, is the base URL of the shard the item's lease moved to with its slot
	// (a handoff committed after the claim): send the item there. pkg/client does, and on from
	// there when that shard answers MovedTo too (up to 3 hops).
	MovedTo string `json:"movedTo,omitempty"`
}

// ReleaseRequest is the body of POST /v1/release: hand leased rows back unrendered.
type ReleaseRequest struct {
	Items []Lease `json:"items"`
}

// Lease names one leased row.
type Lease struct {
	Key   string `json:"key"`
	Lease string `json:"lease"`
}

// ReleaseResponse is the reply to POST /v1/release.
type ReleaseResponse struct {
	Released int          `json:"released"`
	Results  []ItemResult `json:"results"`
}

// ExtendRequest is the body of POST /v1/extend: keep rows leased while their render runs.
type ExtendRequest struct {
	Items []Lease `json:"items"`
	// LeaseSeconds sets each lease to expire this long after now (0 means the shard's default
	// lease): an extension for a render that outlasts its lease, or a shorter lease to have the
	// row handed out again sooner. At most the longest lease a claim may ask for.
	LeaseSeconds float64 `json:"leaseSeconds,omitempty"`
}

// ExtendResponse is the reply to POST /v1/extend.
type ExtendResponse struct {
	// Extended is the number of leases moved.
	Extended int `json:"extended"`
	// Results has one entry per item, in request order. A lease that is no longer current
	// (expired, released, completed, or the row left the shard) is refused with an error and
	// stays ended.
	Results []ExtendResult `json:"results"`
}

// ExtendResult is the outcome of one item of an extend request.
type ExtendResult struct {
	Key string `json:"key"`
	// LeaseExpires is the lease's new expiry; absent when Error is set.
	LeaseExpires *time.Time `json:"leaseExpires,omitempty"`
	// Error is empty when the lease was extended.
	Error string `json:"error,omitempty"`
	// MovedTo, with Error, is the base URL of the shard the lease moved to with its slot: extend
	// it there (see ItemResult.MovedTo).
	MovedTo string `json:"movedTo,omitempty"`
}

// HandoverRequest is the body of POST /v1/handover: a shard that took slots over asks the shard
// that owned them for the leases it granted on their rows, which travel with the slots
// (docs/design.md, "Leases across a handoff"). It needs the bearer token.
type HandoverRequest struct {
	// Shard is the asking shard's name.
	Shard string `json:"shard"`
	// Slots are the slots asked for, in compact text form.
	Slots string `json:"slots"`
}

// States of HandoverSlots.
const (
	// HandoverOwned: the asked shard still owns the slots (it has not adopted the commit yet):
	// ask again.
	HandoverOwned = "owned"
	// HandoverGiven: the asked shard gave the slots away: Leases are the leases it granted on
	// their rows that run on, FenceUntil the end of a fence it had on them.
	HandoverGiven = "handedOver"
	// HandoverUnknown: the asked shard has no record of the slots (its process started after it
	// gave them, or never owned them): FenceUntil is when every lease an earlier process of it
	// may have granted has ended.
	HandoverUnknown = "unknown"
)

// HandoverResponse is the reply to POST /v1/handover.
type HandoverResponse struct {
	// Shard is the answering shard's name; Epoch the membership epoch it has adopted.
	Shard string `json:"shard"`
	Epoch int64  `json:"epoch"`
	// Slots covers every slot asked for, in groups of one state.
	Slots []HandoverSlots `json:"slots"`
}

// HandoverSlots is the answer for a group of the slots asked for.
type HandoverSlots struct {
	// Slots in compact text form.
	Slots string `json:"slots"`
	// State is HandoverOwned, HandoverGiven or HandoverUnknown.
	State string `json:"state"`
	// FenceUntil is when the slots' rows may be handed out again, when that is later than now:
	// no row of them is handed out before it.
	FenceUntil *time.Time `json:"fenceUntil,omitempty"`
	// Leases are the leases that run on (HandoverGiven).
	Leases []HandoverLease `json:"leases,omitempty"`
}

// HandoverLease is one lease that travels with its slot.
type HandoverLease struct {
	Key string `json:"key"`
	// Slot is the row's slot.
	Slot int `json:"slot"`
	// Lease is the lease's token, as the claim handed it out.
	Lease   string    `json:"lease"`
	Expires time.Time `json:"expires"`
	// Rev is the row's rev the lease was granted for.
	Rev int64 `json:"rev"`
}

// ProxiedAuthorizationHeader carries the bearer token ("Bearer <token>") of GET /v1/rows/{key}
// where the Authorization header cannot go: the kube-apiserver's Pod proxy authenticates the
// caller with that header and drops it before it forwards the request (`kubectl renderqueue
// explain`). The shard compares either header with its token in constant time.
const ProxiedAuthorizationHeader = "X-Renderqueue-Authorization"

// States of RowExplanation.State: what the shard does with the row, or why it does not hold it.
const (
	// RowWaiting: held and due in an owned slot: a claim hands it out (Rank, Estimate).
	RowWaiting = "waiting"
	// RowHeldBack: held and due, but its slot is fenced (Fence): handed out to nobody until the
	// fence ends (Estimate waits for it).
	RowHeldBack = "heldBack"
	// RowLeased: handed out to a worker (Lease).
	RowLeased = "leased"
	// RowNotDue: held, not due yet.
	RowNotDue = "notDue"
	// RowIncoming: held in a slot being handed to this shard: the giver (Owner) serves it until
	// the handoff commits.
	RowIncoming = "incoming"
	// RowBeyondWindow: not held: due at or after now + the window (the shard holds the rows due
	// before it; a walk takes the row in once it comes within the window).
	RowBeyondWindow = "beyondWindow"
	// RowNotOwned: not held: its slot is another shard's (Owner), or no shard's.
	RowNotOwned = "notOwned"
	// RowInvalid: not held: the row in PostgreSQL is invalid (Reason says why; an unscheduled
	// row, due_at NULL, is one) and is never held.
	RowInvalid = "invalid"
	// RowNotSeen: not held although the row in PostgreSQL is valid, owned and within the window:
	// this shard has not applied its latest version yet (its change event is on the way, or was
	// lost in a gap that a walk repairs; Reason says which the shard knows).
	RowNotSeen = "notSeen"
)

// RowExplanation is the body of GET /v1/rows/{key}: what one shard knows of one key — its slot
// and the slot's owner, whether the shard holds the row and why not, and for a held row its
// lateness, score, lease or fence, its rank among the due rows in claim order and a rough
// estimate of when a claim takes it. It needs the bearer token. A key no row has is a 404.
type RowExplanation struct {
	// Shard is the answering shard's name, AsOf when it answered.
	Shard string    `json:"shard"`
	AsOf  time.Time `json:"asOf"`
	Key   string    `json:"key"`
	// Slot is the key's slot (of its hash, as the database computes it).
	Slot int `json:"slot"`
	// Owner is the shard that owns the slot in the membership this shard has adopted (Epoch);
	// OwnerURL its base URL when known. Owner is empty when no shard owns the slot.
	Owner    string `json:"owner"`
	OwnerURL string `json:"ownerURL,omitempty"`
	Epoch    int64  `json:"epoch"`
	// Held says the shard holds the row in memory.
	Held bool `json:"held"`
	// State is one of the Row* constants; Reason says it in words.
	State  string `json:"state"`
	Reason string `json:"reason"`
	// Row is the row as the shard holds it, or as PostgreSQL has it when the shard does not.
	Row RowFields `json:"row"`
	// LateSeconds is asOf − due (negative: not due yet) and LateRelative that in cadences;
	// Score is the claim score, LateRelative × the source's boost. Held rows only.
	LateSeconds  *float64 `json:"lateSeconds,omitempty"`
	LateRelative *float64 `json:"lateRelative,omitempty"`
	Score        *float64 `json:"score,omitempty"`
	// Lease is the worker's lease of a leased row.
	Lease *RowLease `json:"lease,omitempty"`
	// Fence is the fence of the row's slot, when it is fenced.
	Fence *Fence `json:"fence,omitempty"`
	// Rank is the row's place among the due rows of the shard (RowWaiting, RowHeldBack).
	Rank *RowRank `json:"rank,omitempty"`
	// Estimate is when a claim may take the row (held rows of owned slots).
	Estimate *ClaimEstimate `json:"estimate,omitempty"`
}

// RowFields are a row's scheduling fields.
type RowFields struct {
	// Due is absent for an unscheduled row (due_at NULL).
	Due *time.Time `json:"due,omitempty"`
	// Cadence in seconds.
	Cadence float64 `json:"cadence"`
	Route   string  `json:"route"`
	Source  string  `json:"source"`
	Urgent  bool    `json:"urgent"`
	Rev     int64   `json:"rev"`
}

// RowLease is the lease of a leased row, without its token (which authorises completions).
type RowLease struct {
	// ID names the lease without revealing it: "sha256:" and the first 16 hex digits of the
	// SHA-256 of the lease token's wire form, which a worker holding the token can compute.
	ID string `json:"id"`
	// Since is when this shard granted the lease; absent when it took the lease over with the
	// row's slot from the slot's earlier owner.
	Since *time.Time `json:"since,omitempty"`
	// Expires is when the lease ends unless extended or completed.
	Expires time.Time `json:"expires"`
	// Completing says a completion under the lease is being written: the row stays leased until
	// that write resolves, whatever Expires says.
	Completing bool `json:"completing,omitempty"`
}

// RowRank is a due row's place among the claimable due rows of its shard.
type RowRank struct {
	// Ahead is how many claimable due rows come before it in claim order: urgent rows first,
	// then by score, equal scores by due time, then key. AheadUrgent is how many of those are
	// urgent rows ahead of a row that is not. Due is every claimable due row of the shard, this
	// one included.
	Ahead       int `json:"ahead"`
	AheadUrgent int `json:"aheadUrgent"`
	Due         int `json:"due"`
	// Note says where claims depart from this order: the urgent share of a batch, the
	// starvation bound and the floors hand some rows out of it, and rows of fenced slots count
	// as ahead until a claim meets them.
	Note string `json:"note"`
}

// ClaimEstimate is a rough estimate of when a claim takes a row.
type ClaimEstimate struct {
	// At is the estimated claim time and InSeconds its distance from asOf; both absent when
	// there is no estimate (Why says why).
	At        *time.Time `json:"at,omitempty"`
	InSeconds *float64   `json:"inSeconds,omitempty"`
	Why       string     `json:"why,omitempty"`
	// ClaimRate is the rows a second the shard's claims handed out over the last
	// ClaimRateSeconds (a minute, or less since the shard's first claim).
	ClaimRate        float64 `json:"claimRate"`
	ClaimRateSeconds float64 `json:"claimRateSeconds"`
	// Method says how At is estimated, and how rough it is.
	Method string `json:"method"`
}

// Error is the body of every 4xx and 5xx reply.
type Error struct {
	Error string `json:"error"`
}
