// Package shardapi is the wire contract of a keeper shard's HTTP API: the JSON bodies of
// /v1/claim, /v1/complete, /v1/release, /v1/extend and /v1/status. The keeper serves it; the operator, the
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
	// Error is the last error the shard wants its operator to see (a failed walk, a store outage).
	Error string `json:"error,omitempty"`
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

// Oldest is the held row that has been due the longest.
type Oldest struct {
	Key string    `json:"key"`
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
}

// Error is the body of every 4xx and 5xx reply.
type Error struct {
	Error string `json:"error"`
}
