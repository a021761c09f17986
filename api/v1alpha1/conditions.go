package v1alpha1

// Condition types of RenderQueueStatus.Conditions.
const (
	// ConditionReady is True when every shard has loaded and is serving.
	ConditionReady = "Ready"
	// ConditionExact is True when status.due is the true count: every shard reachable and exact.
	ConditionExact = "Exact"
	// ConditionEdgeHealthy is False (reason EdgeLagging) when a shard's edge is behind now.
	ConditionEdgeHealthy = "EdgeHealthy"
	// ConditionWalksComplete is False (reason PartialWalk) when a shard's last walk left segments
	// unread.
	ConditionWalksComplete = "WalksComplete"
	// ConditionProgressing is True while the operator is changing the shards (Rebalancing,
	// Loading, RollingUpdate), False (Settled) otherwise.
	ConditionProgressing = "Progressing"
	// ConditionReconciled is True (ReconcileSucceeded) when the operator can make the shards
	// what the spec asks; False names what stops it: InvalidSpec, InvalidMembership,
	// ImageNotAllowed, ChildConflict (nothing is created or replaced; the existing shards keep running and are
	// still polled) or ShardPodRefused (the API server refused a shard Pod; everything else
	// goes on).
	ConditionReconciled = "Reconciled"
	// ConditionClassesServed is False (reason ClassStarving) when a class of rows on some shard
	// (the non-urgent rows of one cadence and source) has had due rows and no render for longer
	// than its cadence; the message names the class, the shard and since when it waits.
	ConditionClassesServed = "ClassesServed"
	// ConditionObjectivesMet says whether every freshness objective (spec.objectives) is met
	// over its window: True (ObjectivesMet), False (ObjectiveMissed, naming the objectives), or
	// Unknown (NoObjectiveEvents) before any event was decided. Absent without objectives.
	ConditionObjectivesMet = "ObjectivesMet"
)

// Condition reasons (CamelCase, as Kubernetes conventions ask).
const (
	// ReasonAllShardsReady: Ready is True.
	ReasonAllShardsReady = "AllShardsReady"
	// ReasonShardsNotReady: some shard has not finished loading or is unreachable.
	ReasonShardsNotReady = "ShardsNotReady"
	// ReasonAllShardsExact: Exact is True.
	ReasonAllShardsExact = "AllShardsExact"
	// ReasonShardInexact: some shard does not vouch for its count (gap, partial walk, handoff).
	ReasonShardInexact = "ShardInexact"
	// ReasonShardUnreachable: some shard's /v1/status could not be read.
	ReasonShardUnreachable = "ShardUnreachable"
	// ReasonEdgeAhead: EdgeHealthy is True.
	ReasonEdgeAhead = "EdgeAhead"
	// ReasonEdgeLagging: EdgeHealthy is False; the message names the shard and the lag.
	ReasonEdgeLagging = "EdgeLagging"
	// ReasonWalksComplete: WalksComplete is True.
	ReasonWalksComplete = "WalksComplete"
	// ReasonPartialWalk: WalksComplete is False; the message names the shard and the unread
	// segments.
	ReasonPartialWalk = "PartialWalk"
	// ReasonMembershipChanging: the owners of some slots have not adopted the committed
	// assignment yet, so the per-slot sum misses their counts.
	ReasonMembershipChanging = "MembershipChanging"
	// ReasonWalkFailed: WalksComplete is False because a shard's last walk failed as a whole.
	ReasonWalkFailed = "WalkFailed"
	// ReasonNoShardReports: no shard could be asked, so the condition cannot be judged.
	ReasonNoShardReports = "NoShardReports"
	// ReasonSettled: Progressing is False, nothing is changing.
	ReasonSettled = "Settled"
	// ReasonRebalancing: slots are being handed off between shards.
	ReasonRebalancing = "Rebalancing"
	// ReasonLoading: shards are running their first walk.
	ReasonLoading = "Loading"
	// ReasonRowsHeldBack: Progressing is True because a shard hands some of its due rows to
	// nobody yet: the leases an earlier owner of their slots may have granted are not known yet
	// (a handover in progress) or not at all (a keeper process that died); the message says
	// which shard, how many rows, until when and why (status.shards[].heldBack).
	ReasonRowsHeldBack = "RowsHeldBack"
	// ReasonRollingUpdate: shard Pods are being replaced one at a time.
	ReasonRollingUpdate = "RollingUpdate"
	// ReasonAllClassesServed: ClassesServed is True.
	ReasonAllClassesServed = "AllClassesServed"
	// ReasonClassStarving: ClassesServed is False: a class has had due rows and no render for
	// longer than its cadence on some shard (no claims reach it, or they are too small for the
	// classes waiting); the message names the class and the shard.
	ReasonClassStarving = "ClassStarving"
	// ReasonObjectivesMet: ObjectivesMet is True.
	ReasonObjectivesMet = "ObjectivesMet"
	// ReasonObjectiveMissed: ObjectivesMet is False: an objective's good share over its window
	// is below its percentile; the message names it.
	ReasonObjectiveMissed = "ObjectiveMissed"
	// ReasonNoObjectiveEvents: ObjectivesMet is Unknown: no event has been decided yet.
	ReasonNoObjectiveEvents = "NoObjectiveEvents"
	// ReasonReconcileSucceeded: Reconciled is True.
	ReasonReconcileSucceeded = "ReconcileSucceeded"
	// ReasonInvalidSpec: Reconciled is False: the object does not decode or breaks a rule of the
	// API (stored before the rule); the message names the field.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonInvalidMembership: Reconciled is False: status.membership (the record of the slot
	// assignment and of any handoff) does not parse; the operator changes nothing until it is
	// fixed, and does not retry on its own (a later change to the RenderQueue or its Pods, or an
	// operator restart, reconciles again).
	ReasonInvalidMembership = "InvalidMembership"
	// ReasonImageNotAllowed: Reconciled is False: spec.image is not among the operator's
	// --allowed-images.
	ReasonImageNotAllowed = "ImageNotAllowed"
	// ReasonChildConflict: Reconciled is False: a child's name is taken by an object the
	// operator does not manage.
	ReasonChildConflict = "ChildConflict"
	// ReasonShardPodRefused: Reconciled is False: the API server refused to create a shard Pod
	// (a missing PriorityClass, a quota, an admission policy); the message quotes it.
	ReasonShardPodRefused = "ShardPodRefused"
	// ReasonShardTLSUnavailable: Reconciled is False: spec.tls asks for an operator-issued
	// certificate and the operator cannot issue one (it runs without a shard CA, or cannot read or
	// create its CA Secret); the message says why. No shard Pod is created or replaced meanwhile.
	ReasonShardTLSUnavailable = "ShardTLSUnavailable"
	// ReasonShardTLSSecretInvalid: Reconciled is False: spec.tls Provided names a Secret the
	// operator cannot use: missing, not readable by the operator, without a key it needs, or
	// holding a certificate that is not valid now for the shards' server name or does not
	// verify with its ca.crt; the message says which. No shard Pod is created or replaced
	// meanwhile.
	ReasonShardTLSSecretInvalid = "ShardTLSSecretInvalid"
)

// Labels set on every child object of a RenderQueue.
const (
	// LabelQueue holds the name of the owning RenderQueue.
	LabelQueue = Group + "/queue"
	// LabelShard holds the shard's name (the Pod's name, <rq>-shard-<i>) on a shard Pod.
	LabelShard = Group + "/shard"
	// LabelTLS is "true" on shard Pods that serve their API over HTTPS (spec.tls
	// OperatorIssued or Provided when they were created).
	LabelTLS = Group + "/tls"
	// LabelComponent says what the object is for ("keeper" on shard Pods).
	LabelComponent = "app.kubernetes.io/component"
)

// Annotations set by the operator.
const (
	// AnnotationPodTemplateHash on a shard Pod is the hash of the pod template it was built from;
	// a Pod whose hash differs from the current template's is replaced (one shard at a time).
	AnnotationPodTemplateHash = Group + "/pod-template-hash"
)
