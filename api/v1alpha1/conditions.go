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
	// Loading, RollingUpdate, ScalingDown).
	ConditionProgressing = "Progressing"
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
	// ReasonStable: Progressing is False, nothing is changing.
	ReasonStable = "Stable"
	// ReasonRebalancing: slots are being handed off between shards.
	ReasonRebalancing = "Rebalancing"
	// ReasonLoading: shards are running their first walk.
	ReasonLoading = "Loading"
	// ReasonRollingUpdate: shard Pods are being replaced one at a time.
	ReasonRollingUpdate = "RollingUpdate"
	// ReasonScalingDown: slots are moving off shards about to be removed.
	ReasonScalingDown = "ScalingDown"
)

// Labels set on every child object of a RenderQueue.
const (
	// LabelQueue holds the name of the owning RenderQueue.
	LabelQueue = Group + "/queue"
	// LabelShard holds the shard index on a shard Pod.
	LabelShard = Group + "/shard"
	// LabelComponent says what the object is for ("keeper" on shard Pods).
	LabelComponent = "app.kubernetes.io/component"
)
