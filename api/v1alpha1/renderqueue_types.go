package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RenderQueueSpec is the desired state of a RenderQueue: how many keeper shards, what they hold,
// how they prioritise, where the schedule lives, and how their Pods are scheduled.
//
// Durations are Go duration strings ("90s", "60m", "24h", "1h30m"), each bounded by the API
// server to what the keeper handles (no value a Go time.Duration cannot hold gets in). They are
// pointers so that Go clients leave them unset (and the API server applies the default) rather
// than sending "0s"; read them with the WindowDuration, VerifyIntervalDuration and
// LeaseDurationValue methods (and spec.verifyWalkRate, a pointer for the same reason, with
// VerifyWalkRateValue).
// +kubebuilder:validation:XValidation:rule="!has(self.maxLeaseDuration) || !has(self.leaseDuration) || duration(self.maxLeaseDuration) >= duration(self.leaseDuration)",message="maxLeaseDuration must be at least leaseDuration",fieldPath=".maxLeaseDuration"
type RenderQueueSpec struct {
	// Shards is the number of keeper shards (Pods named <name>-shard-<i>), 1..256. The 1024 hash
	// slots are spread evenly over them; changing it rebalances slots with a two-phase handoff.
	// The scale subresource maps to this field.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 256",message="shards must be between 1 and 256"
	// +optional
	Shards int32 `json:"shards,omitempty"`

	// Window is how far ahead of now a shard holds rows: a row is held iff it is due before
	// now + window. 0 (the default) holds every owned row; otherwise from 1m to 8760h (a year).
	// +kubebuilder:default="0s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]{1,5}([.][0-9]*)?|[.][0-9]+)h|([0-9]{1,7}([.][0-9]*)?|[.][0-9]+)m|([0-9]{1,9}([.][0-9]*)?|[.][0-9]+)s|([0-9]{1,12}([.][0-9]*)?|[.][0-9]+)ms|([0-9]{1,15}([.][0-9]*)?|[.][0-9]+)(us|µs|μs)|([0-9]{1,18}([.][0-9]*)?|[.][0-9]+)ns)+)$') && (duration(self) == duration('0s') || (duration(self) >= duration('1m') && duration(self) <= duration('8760h')))",message="window must be 0 (hold every owned row) or a duration from 1m to 8760h, such as 24h or 36h30m"
	// +optional
	Window *metav1.Duration `json:"window,omitempty"`

	// VerifyInterval is how often a shard re-walks its slots to verify what it holds. With a
	// window set, a shard walks at least every window/3 whatever this says: a larger value is
	// accepted and clamped by the keeper (so that lengthening the window never needs two edits),
	// and 0 then means "every window/3". With window 0, 0 turns periodic verification off.
	// Otherwise from 10s to 8760h. Defaults to 60m.
	// +kubebuilder:default="60m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]{1,5}([.][0-9]*)?|[.][0-9]+)h|([0-9]{1,7}([.][0-9]*)?|[.][0-9]+)m|([0-9]{1,9}([.][0-9]*)?|[.][0-9]+)s|([0-9]{1,12}([.][0-9]*)?|[.][0-9]+)ms|([0-9]{1,15}([.][0-9]*)?|[.][0-9]+)(us|µs|μs)|([0-9]{1,18}([.][0-9]*)?|[.][0-9]+)ns)+)$') && (duration(self) == duration('0s') || (duration(self) >= duration('10s') && duration(self) <= duration('8760h')))",message="verifyInterval must be 0 or a duration from 10s to 8760h, such as 60m"
	// +optional
	VerifyInterval *metav1.Duration `json:"verifyInterval,omitempty"`

	// VerifyWalkRate is the most rows a second a shard's verification walk reads (a full walk
	// while the shard is exact and no slots are arriving): the walk pauses between its steps to
	// keep to it, so that it leaves CPU to claims and spreads its reads on PostgreSQL. The load
	// and the walks that repair a gap or prepare incoming slots are never paced. Defaults to
	// 100000 (a 10M-row shard verifies in about 100 s); 0 reads as fast as PostgreSQL sends; at
	// most 100000000. Raise it when a shard holds so many rows, or verifies so often, that a walk
	// at this rate would take about as long as verifyInterval (rows / rate should stay well below
	// it, or walks run back to back). A change reaches running shards without a restart and
	// applies from their next walk.
	// +kubebuilder:default=100000
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000000
	// +optional
	VerifyWalkRate *int32 `json:"verifyWalkRate,omitempty"`

	// Priority tunes the claim order. With none of its fields set a shard keeps three promises
	// at any load: no class of rows (one cadence and source) with due rows goes more than half its
	// cadence without a render (the starvation bound, always on); a drained backlog does not come
	// due again as a second wave; and under sustained overload every row's interval stretches
	// instead of rows running up to half a cadence late (reschedule Adaptive). See
	// docs/priority.md.
	// +kubebuilder:default={}
	// +optional
	Priority Priority `json:"priority,omitempty"`

	// Objectives are freshness objectives: each promises that a share (Percentile) of the renders
	// of one class of rows start within MaxLateness of their due time. The shards count, per
	// objective, every due time of a row of its class as one event, good or late
	// (docs/objectives.md): a render that started in time and completed is good; a row not being
	// rendered when MaxLateness has passed, or whose render then ends without completing, is
	// late. The counts are exported as renderqueue_keeper_objective_events_total, which the
	// burn-rate alerts of config/prometheus read. Each row counts for at most one objective: the
	// classes must not overlap. At most 16.
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	// +optional
	Objectives []Objective `json:"objectives,omitempty"`

	// LeaseDuration is how long a claimed row stays leased to a render worker before it is handed
	// out again, unless completed or released first. From 1s to 24h; defaults to 5m.
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]{1,5}([.][0-9]*)?|[.][0-9]+)h|([0-9]{1,7}([.][0-9]*)?|[.][0-9]+)m|([0-9]{1,9}([.][0-9]*)?|[.][0-9]+)s|([0-9]{1,12}([.][0-9]*)?|[.][0-9]+)ms|([0-9]{1,15}([.][0-9]*)?|[.][0-9]+)(us|µs|μs)|([0-9]{1,18}([.][0-9]*)?|[.][0-9]+)ns)+)$') && duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="leaseDuration must be a duration from 1s to 24h, such as 5m"
	// +optional
	LeaseDuration *metav1.Duration `json:"leaseDuration,omitempty"`

	// MaxLeaseDuration is the longest lease a shard gives: a claim or an extension asking for
	// more (leaseSeconds) is given this much (the reply's leaseExpires says so). It is also how
	// long a shard holds back the rows whose leases are unknown — those of a keeper process that
	// died, or of a shard that gave slots away and did not hand their leases over — so that no row
	// is rendered by two workers at once (docs/design.md, "Leases across a handoff"). From 1s to
	// 24h, at least leaseDuration; unset: leaseDuration.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]{1,5}([.][0-9]*)?|[.][0-9]+)h|([0-9]{1,7}([.][0-9]*)?|[.][0-9]+)m|([0-9]{1,9}([.][0-9]*)?|[.][0-9]+)s|([0-9]{1,12}([.][0-9]*)?|[.][0-9]+)ms|([0-9]{1,15}([.][0-9]*)?|[.][0-9]+)(us|µs|μs)|([0-9]{1,18}([.][0-9]*)?|[.][0-9]+)ns)+)$') && duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="maxLeaseDuration must be a duration from 1s to 24h, such as 15m"
	// +optional
	MaxLeaseDuration *metav1.Duration `json:"maxLeaseDuration,omitempty"`

	// Store says where the schedule table lives.
	Store Store `json:"store"`

	// Image is the container image of the keeper shards. Empty means the operator's own image
	// (the same binary runs `renderqueue keeper`). An operator started with --allowed-images
	// runs only the images it allows (the RenderQueue gets no Pods and says why otherwise).
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.matches('[[:space:]]')",message="image must be an image reference without whitespace, such as ghcr.io/renderqueue/renderqueue:v0.1.0"
	// +optional
	Image string `json:"image,omitempty"`

	// ImagePullPolicy of the keeper container; Kubernetes' default when empty.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Resources of the keeper container. A shard holds its rows in memory: size the memory limit
	// for the rows of 1024/shards slots within the window.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// Procs is how many threads run the keeper's Go code at once (its GOMAXPROCS; `renderqueue
	// keeper --procs`). Unset: 1, the keeper's default. A shard's work runs under one lock, and
	// with one thread the goroutine holding it is the one running, which keeps the claims' tail
	// short; a shard then uses about one core and completes at most about 80,000 rows a second
	// (docs/scale.md). Raise it for a shard that must go past that (add shards first), or that
	// spends much time outside the lock (TLS handshakes of many short-lived clients). 0 leaves the
	// choice to the Go runtime: the container's CPU limit rounded up (and at least 2), else the
	// node's CPUs. At most 256. Changing it replaces the shards one at a time, like a new image
	// does.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=256
	// +optional
	Procs *int32 `json:"procs,omitempty"`

	// NodeSelector of the shard Pods.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations of the shard Pods.
	// +listType=atomic
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Affinity of the shard Pods.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// The fields below shape the shard Pods like the pod-template fields of a Deployment. Changing
	// any of them replaces the shards one at a time, like a new image does.

	// ImagePullSecrets names Secrets (in the RenderQueue's namespace) holding the registry
	// credentials to pull the keeper image with; at most 16, no name twice.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	// +optional
	ImagePullSecrets []LocalSecretReference `json:"imagePullSecrets,omitempty"`

	// PodLabels are extra labels of the shard Pods (at most 64), e.g. for cost allocation or a
	// NetworkPolicy. The operator's own labels cannot be set here: keys under renderqueue.dev/
	// and app.kubernetes.io/name, instance, component and managed-by are refused, since the
	// shards' Service, PodDisruptionBudget and scale selector rely on them.
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$') && k.matches('^([^/]{1,253}/)?[^/]{1,63}$'))",message="podLabels keys must be label keys: an optional DNS subdomain prefix of at most 253 characters and '/', then a name of at most 63 characters of alphanumerics, '-', '_' and '.' that starts and ends with an alphanumeric"
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('renderqueue.dev/') && !(k in ['app.kubernetes.io/name', 'app.kubernetes.io/instance', 'app.kubernetes.io/component', 'app.kubernetes.io/managed-by']))",message="podLabels must not set the operator's own labels (renderqueue.dev/*, app.kubernetes.io/name, app.kubernetes.io/instance, app.kubernetes.io/component, app.kubernetes.io/managed-by): the shards' Service, PodDisruptionBudget and scale selector rely on them"
	// +optional
	PodLabels map[string]LabelValue `json:"podLabels,omitempty"`

	// PodAnnotations are extra annotations of the shard Pods (at most 64, 255 KiB in all), e.g.
	// for a service mesh or a log collector. Keys under renderqueue.dev/ are the operator's and
	// are refused.
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$') && k.matches('^([^/]{1,253}/)?[^/]{1,63}$'))",message="podAnnotations keys must be annotation keys: an optional DNS subdomain prefix of at most 253 characters and '/', then a name of at most 63 characters of alphanumerics, '-', '_' and '.' that starts and ends with an alphanumeric"
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('renderqueue.dev/'))",message="podAnnotations must not set the operator's own annotations (renderqueue.dev/*)"
	// +kubebuilder:validation:XValidation:rule="self.map(k, k.size() + self[k].size()).sum() <= 261120",message="podAnnotations must be at most 255 KiB in all, keys and values (a Pod's annotations may take 256 KiB; the operator's own need the rest)"
	// +optional
	PodAnnotations map[string]string `json:"podAnnotations,omitempty"`

	// PriorityClassName of the shard Pods. Create the PriorityClass first: the API server
	// refuses a Pod naming a missing one, so a shard being created or replaced stays down (and
	// a rolling replacement stops there) until the class exists.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="priorityClassName must be a PriorityClass name: lower-case alphanumerics, '-' and '.', starting and ending with an alphanumeric"
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// TopologySpreadConstraints of the shard Pods (at most 8), e.g. to spread the shards over
	// zones or nodes: a Pod's topologySpreadConstraints without labelSelector, which the operator
	// sets to the shard Pods' selector, so that a constraint always spreads this RenderQueue's
	// shards (a selector that missed them would silently spread nothing).
	// +listType=map
	// +listMapKey=topologyKey
	// +listMapKey=whenUnsatisfiable
	// +kubebuilder:validation:MaxItems=8
	// +optional
	TopologySpreadConstraints []TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`

	// TLS says whether the shards serve their API (claims, completions, status, metrics) over
	// HTTPS, with a certificate the operator issues or one you provide in a Secret. Defaults to
	// Disabled: plain HTTP. Changing it replaces the shards one at a time, like a new image does.
	// See docs/security.md.
	// +kubebuilder:default={}
	// +optional
	TLS ShardTLS `json:"tls,omitempty"`

	// Logging is how the keeper shards log (their --log-format and --log-level): unset, text at
	// info. Changing it replaces the shards one at a time, like a new image does. See
	// docs/monitoring.md ("Logs").
	// +optional
	Logging *ShardLogging `json:"logging,omitempty"`
}

// ShardLogging is how the keeper shards log, on their container's stderr.
type ShardLogging struct {
	// Format of the log lines: text (key=value pairs) or json (one JSON object a line, what log
	// pipelines want). Empty: text.
	// +kubebuilder:validation:Enum=text;json
	// +optional
	Format string `json:"format,omitempty"`

	// Level is the least severe messages logged: error, warn, info, debug, or a verbosity from 0
	// to 9 (info and the keeper's V(1)..V(N) details). Empty: info.
	// +kubebuilder:validation:Pattern=`^(error|warn|info|debug|[0-9])$`
	// +optional
	Level string `json:"level,omitempty"`
}

// ShardTLSMode says how the shards' API is served.
// +kubebuilder:validation:Enum=Disabled;OperatorIssued;Provided
type ShardTLSMode string

// Shard TLS modes.
const (
	// ShardTLSDisabled: plain HTTP.
	ShardTLSDisabled ShardTLSMode = "Disabled"
	// ShardTLSOperatorIssued: HTTPS with a serving certificate the operator issues from its
	// shard CA and keeps current, for the server name ShardServerName.
	ShardTLSOperatorIssued ShardTLSMode = "OperatorIssued"
	// ShardTLSProvided: HTTPS with the serving certificate of a Secret someone else keeps
	// current (cert-manager, say), named by ShardTLS.SecretName.
	ShardTLSProvided ShardTLSMode = "Provided"
)

// ShardTLS is the TLS setting of the shards' API.
// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.mode != 'Provided' || (has(self.secretName) && size(self.secretName) > 0)",message="tls.secretName is required when tls.mode is Provided",fieldPath=".secretName"
// +kubebuilder:validation:XValidation:rule="(has(self.mode) && self.mode == 'Provided') || !has(self.secretName)",message="tls.secretName is only allowed when tls.mode is Provided",fieldPath=".secretName"
type ShardTLS struct {
	// Mode is Disabled (plain HTTP, the default), OperatorIssued or Provided.
	//
	// OperatorIssued: the operator issues the shards a serving certificate from its own CA, in
	// the Secret <name>-shard-tls, renews it 30 days before its end (the shards reload it without
	// a restart), and publishes the CA bundle clients verify it with in the ConfigMap
	// <name>-shard-ca (key ca.crt).
	//
	// Provided: the shards serve the certificate of the Secret secretName, which you (or
	// cert-manager) keep current: keys tls.crt (the certificate, then any intermediates),
	// tls.key and ca.crt (the CA clients verify it with), as cert-manager writes them. It must be
	// valid for <name>-shards.<namespace>.svc. The operator reads it (grant it get on the Secret:
	// config/samples/shard-tls-secret-rbac.yaml), checks it, publishes its ca.crt in the
	// ConfigMap <name>-shard-ca, and creates or replaces no shard Pod while it is missing,
	// unreadable or invalid. The shards reload a renewed certificate without a restart.
	//
	// Either way, clients verify the server name <name>-shards.<namespace>.svc whatever address
	// they dial.
	// +kubebuilder:default=Disabled
	// +optional
	Mode ShardTLSMode `json:"mode,omitempty"`

	// SecretName is the Secret in the RenderQueue's namespace holding the shards' serving
	// certificate, with mode Provided (and only then).
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="tls.secretName must be a Secret name: lower-case alphanumerics, '-' and '.', starting and ending with an alphanumeric"
	// +optional
	SecretName string `json:"secretName,omitempty"`
}

// LabelValue is a Kubernetes label value: empty, or at most 63 characters of alphanumerics, '-',
// '_' and '.' that start and end with an alphanumeric.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="self.matches('^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$')",message="podLabels values must be label values: empty, or at most 63 characters of alphanumerics, '-', '_' and '.' that start and end with an alphanumeric"
type LabelValue string

// TopologySpreadConstraint spreads the shard Pods over the domains of a topology (zones, nodes,
// ...). It is a Pod's TopologySpreadConstraint whose labelSelector the operator sets to the
// shard Pods' selector (renderqueue.dev/queue=<name>, app.kubernetes.io/component=keeper); there
// is no labelSelector field to set (kubectl refuses it as an unknown field).
// +kubebuilder:validation:XValidation:rule="!has(self.minDomains) || self.whenUnsatisfiable == 'DoNotSchedule'",message="topologySpreadConstraints minDomains is only allowed with whenUnsatisfiable DoNotSchedule"
type TopologySpreadConstraint struct {
	// MaxSkew is the largest difference allowed between the number of shard Pods in any two
	// domains (with DoNotSchedule), or the skew the scheduler prefers not to exceed (with
	// ScheduleAnyway); at least 1.
	// +kubebuilder:validation:Minimum=1
	MaxSkew int32 `json:"maxSkew"`

	// TopologyKey is the node label whose values are the domains, e.g.
	// topology.kubernetes.io/zone or kubernetes.io/hostname.
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$') && self.matches('^([^/]{1,253}/)?[^/]{1,63}$')",message="topologySpreadConstraints topologyKey must be a node label key, e.g. topology.kubernetes.io/zone or kubernetes.io/hostname"
	TopologyKey string `json:"topologyKey"`

	// WhenUnsatisfiable is DoNotSchedule (a shard Pod that would exceed maxSkew stays Pending) or
	// ScheduleAnyway (the scheduler only prefers domains with fewer shards).
	// +kubebuilder:validation:Enum=DoNotSchedule;ScheduleAnyway
	WhenUnsatisfiable corev1.UnsatisfiableConstraintAction `json:"whenUnsatisfiable"`

	// MinDomains is the number of domains the scheduler assumes at least (with DoNotSchedule
	// only); at least 1.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MinDomains *int32 `json:"minDomains,omitempty"`

	// NodeAffinityPolicy says whether the shards' nodeSelector and node affinity limit the
	// domains counted: Honor (Kubernetes' default) or Ignore.
	// +kubebuilder:validation:Enum=Honor;Ignore
	// +optional
	NodeAffinityPolicy *corev1.NodeInclusionPolicy `json:"nodeAffinityPolicy,omitempty"`

	// NodeTaintsPolicy says whether tainted nodes the shards do not tolerate are left out of the
	// domains counted: Honor, or Ignore (Kubernetes' default).
	// +kubebuilder:validation:Enum=Honor;Ignore
	// +optional
	NodeTaintsPolicy *corev1.NodeInclusionPolicy `json:"nodeTaintsPolicy,omitempty"`

	// MatchLabelKeys are keys of spec.podLabels whose values (on the Pod being scheduled) narrow
	// the shard selector, as in a Pod's constraint; at most 16. The selector's own keys
	// (renderqueue.dev/queue, app.kubernetes.io/component) are refused.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$') && k.matches('^([^/]{1,253}/)?[^/]{1,63}$'))",message="topologySpreadConstraints matchLabelKeys must be label keys"
	// +kubebuilder:validation:XValidation:rule="self.all(k, !(k in ['renderqueue.dev/queue', 'app.kubernetes.io/component']))",message="topologySpreadConstraints matchLabelKeys must not name the shard selector's own keys (renderqueue.dev/queue, app.kubernetes.io/component)"
	// +optional
	MatchLabelKeys []string `json:"matchLabelKeys,omitempty"`
}

// LocalSecretReference names a Secret in the RenderQueue's namespace.
type LocalSecretReference struct {
	// Name of the Secret.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="imagePullSecrets names must be Secret names: lower-case alphanumerics, '-' and '.', starting and ending with an alphanumeric"
	Name string `json:"name"`
}

// Priority tunes the claim order. Rows are claimed by relative lateness (now − due) / cadence,
// multiplied by SubmittedBoost for rows that came from a sitemap; urgent rows go first but take
// at most UrgentMaxShare of each claim batch while other rows are due; Floors reserve shares of
// each batch for classes of rows; Reschedule picks a rendered row's next due time.
// A class of rows (one cadence and source) that has had due rows and no render for half its
// cadence gets its most overdue row in the next claim, whatever these fields say (the
// starvation bound).
//
// Both values are decimal strings (see the package documentation for why not floats).
type Priority struct {
	// SubmittedBoost multiplies the relative lateness of submitted rows: a decimal number
	// greater than 0 and at most 1000, e.g. "2" or "1.5". Defaults to "2".
	// +kubebuilder:default="2"
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) > 0.0 && double(self) <= 1000.0",message="submittedBoost must be a decimal number greater than 0 and at most 1000, such as \"2\" or \"1.5\""
	// +optional
	SubmittedBoost string `json:"submittedBoost,omitempty"`

	// UrgentMaxShare caps the share of each claim batch that urgent rows may take while other
	// rows are due: a decimal number from 0 to 1, e.g. "0.2". Defaults to "0.2".
	// +kubebuilder:default="0.2"
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) >= 0.0 && double(self) <= 1.0",message="urgentMaxShare must be a decimal number from 0 to 1, such as \"0.2\""
	// +optional
	UrgentMaxShare string `json:"urgentMaxShare,omitempty"`

	// Floors reserve a minimum share of every claim batch for classes of rows (one cadence and
	// source each) while the class has due rows, so that a class keeps that share of the renders
	// behind the boost or under overload (without a floor every class still keeps moving: the
	// starvation bound renders one row of a class that has waited half its cadence); a
	// reservation the class cannot use goes back to the claim order in the same batch. At most
	// one floor per class, at most 64 floors, shares summing to at most 1. See docs/priority.md.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(f, self.exists_one(g, g.cadence == f.cadence && g.source == f.source))",message="floors: at most one floor per class (cadence and source)"
	// +kubebuilder:validation:XValidation:rule="self.all(f, f.share.matches('^[0-9]+([.][0-9]+)?$')) && self.map(f, double(f.share)).sum() <= 1.000000001",message="floors: shares must not sum past 1"
	// +listType=atomic
	// +optional
	Floors []Floor `json:"floors,omitempty"`

	// Reschedule picks a rendered row's next due time when the render worker does not give one:
	// KeepPhase keeps the row on its own schedule (its due time plus whole cadences, the point
	// nearest to one cadence after the render), so a drained backlog does not come due again as
	// a second wave, but under overload rows run up to half a cadence late before one skips a
	// cycle; AfterRender schedules it one cadence after the completion, which stretches every
	// interval under overload but brings a drained backlog back as a wave. Adaptive (the
	// default) is KeepPhase while the shard keeps up or drains a backlog with capacity to spare,
	// and AfterRender while its rows need more renders an hour than its claims hand out. A
	// RenderQueue created before Adaptive existed holds KeepPhase, stored at its creation:
	// remove the field or set Adaptive to adopt it. See docs/priority.md for the trade-off.
	// +kubebuilder:validation:Enum=KeepPhase;AfterRender;Adaptive
	// +kubebuilder:default=Adaptive
	// +optional
	Reschedule string `json:"reschedule,omitempty"`
}

// Floor reserves a share of every claim batch for one class of rows.
type Floor struct {
	// Cadence of the class's rows, e.g. "96h" or "1h30m"; whole milliseconds from 1ms to 87600h
	// (the cadences rows may have).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]{1,5}([.][0-9]*)?|[.][0-9]+)h|([0-9]{1,7}([.][0-9]*)?|[.][0-9]+)m|([0-9]{1,9}([.][0-9]*)?|[.][0-9]+)s|([0-9]{1,12}([.][0-9]*)?|[.][0-9]+)ms|([0-9]{1,15}([.][0-9]*)?|[.][0-9]+)(us|µs|μs)|([0-9]{1,18}([.][0-9]*)?|[.][0-9]+)ns)+)$') && duration(self) >= duration('1ms') && duration(self) <= duration('87600h') && int(duration(self)) % 1000000 == 0",message="floor cadence must be a duration of whole milliseconds from 1ms to 87600h, such as 96h or 1h30m"
	Cadence metav1.Duration `json:"cadence"`

	// Source of the class's rows: submitted (from a sitemap) or discovered (by the crawler).
	// +kubebuilder:validation:Enum=submitted;discovered
	Source string `json:"source"`

	// Share of every claim batch reserved for the class: a decimal number greater than 0 and at
	// most 1, e.g. "0.05".
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) > 0.0 && double(self) <= 1.0",message="floor share must be a decimal number greater than 0 and at most 1, such as \"0.05\""
	Share string `json:"share"`
}

// Objective is one freshness objective.
type Objective struct {
	// Name of the objective, in metrics and alerts: lower-case letters, digits and '-', at most 63.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Class selects the rows the objective is about; empty: every row.
	// +optional
	Class ObjectiveClass `json:"class,omitempty"`

	// Percentile is the share of the class's events, in percent, that must be good: a decimal
	// number greater than 0 and below 100, e.g. "99" or "99.9". The error budget is
	// 100 − Percentile.
	// +kubebuilder:validation:MaxLength=8
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]{1,2}([.][0-9]{1,4})?$') && double(self) > 0.0 && double(self) < 100.0",message="percentile must be a decimal number greater than 0 and below 100, such as \"99\" or \"99.9\""
	Percentile string `json:"percentile"`

	// MaxLateness is the most a render may start after the row's due time and count as good,
	// e.g. "10m"; from 1s to 8760h.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]{1,5}([.][0-9]*)?|[.][0-9]+)h|([0-9]{1,7}([.][0-9]*)?|[.][0-9]+)m|([0-9]{1,9}([.][0-9]*)?|[.][0-9]+)s|([0-9]{1,12}([.][0-9]*)?|[.][0-9]+)ms|([0-9]{1,15}([.][0-9]*)?|[.][0-9]+)(us|µs|μs)|([0-9]{1,18}([.][0-9]*)?|[.][0-9]+)ns)+)$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="maxLateness must be a duration from 1s to 8760h, such as 10m"
	MaxLateness metav1.Duration `json:"maxLateness"`

	// Window is how far back status.objectives judges the objective, e.g. "672h" (28 days, the
	// default); from 1h to 2160h (90 days).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]{1,5}([.][0-9]*)?|[.][0-9]+)h|([0-9]{1,7}([.][0-9]*)?|[.][0-9]+)m|([0-9]{1,9}([.][0-9]*)?|[.][0-9]+)s|([0-9]{1,12}([.][0-9]*)?|[.][0-9]+)ms|([0-9]{1,15}([.][0-9]*)?|[.][0-9]+)(us|µs|μs)|([0-9]{1,18}([.][0-9]*)?|[.][0-9]+)ns)+)$') && duration(self) >= duration('1h') && duration(self) <= duration('2160h')",message="window must be a duration from 1h to 2160h, such as 672h"
	// +optional
	Window *metav1.Duration `json:"window,omitempty"`
}

// ObjectiveClass selects rows by cadence, source and urgency; every field left out matches all.
// +kubebuilder:validation:XValidation:rule="!has(self.minCadence) || !has(self.maxCadence) || duration(self.minCadence) <= duration(self.maxCadence)",message="class: minCadence must not be above maxCadence"
type ObjectiveClass struct {
	// MinCadence and MaxCadence bound the rows' cadence, inclusive, e.g. minCadence 24h and
	// maxCadence 24h for the daily rows.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]{1,5}([.][0-9]*)?|[.][0-9]+)h|([0-9]{1,7}([.][0-9]*)?|[.][0-9]+)m|([0-9]{1,9}([.][0-9]*)?|[.][0-9]+)s|([0-9]{1,12}([.][0-9]*)?|[.][0-9]+)ms|([0-9]{1,15}([.][0-9]*)?|[.][0-9]+)(us|µs|μs)|([0-9]{1,18}([.][0-9]*)?|[.][0-9]+)ns)+)$')",message="minCadence must be a duration such as 1h"
	// +optional
	MinCadence *metav1.Duration `json:"minCadence,omitempty"`
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]{1,5}([.][0-9]*)?|[.][0-9]+)h|([0-9]{1,7}([.][0-9]*)?|[.][0-9]+)m|([0-9]{1,9}([.][0-9]*)?|[.][0-9]+)s|([0-9]{1,12}([.][0-9]*)?|[.][0-9]+)ms|([0-9]{1,15}([.][0-9]*)?|[.][0-9]+)(us|µs|μs)|([0-9]{1,18}([.][0-9]*)?|[.][0-9]+)ns)+)$')",message="maxCadence must be a duration such as 1h"
	// +optional
	MaxCadence *metav1.Duration `json:"maxCadence,omitempty"`
	// Source selects the rows from a sitemap (submitted) or found by the crawler (discovered).
	// +kubebuilder:validation:Enum=submitted;discovered
	// +optional
	Source string `json:"source,omitempty"`
	// Urgent selects the urgent rows (true) or the others (false).
	// +optional
	Urgent *bool `json:"urgent,omitempty"`
}

// Store says where the schedule table lives.
type Store struct {
	// SecretRef names the Secret (in the RenderQueue's namespace) holding the PostgreSQL
	// connection string.
	SecretRef SecretKeyRef `json:"secretRef"`
}

// SecretKeyRef names one key of a Secret in the same namespace.
type SecretKeyRef struct {
	// Name of the Secret: a Secret name (lower-case alphanumerics, '-' and '.'). Required.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="store.secretRef.name must name the Secret holding the PostgreSQL DSN: lower-case alphanumerics, '-' and '.', starting and ending with an alphanumeric"
	Name string `json:"name"`

	// Key within the Secret whose value is the DSN: alphanumerics, '-', '_' and '.', not "." or
	// "..", not starting with "..". Defaults to "dsn".
	// +kubebuilder:default="dsn"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-._a-zA-Z0-9]+$') && self != '.' && !self.startsWith('..')",message="store.secretRef.key must be a Secret key: alphanumerics, '-', '_' and '.', not '.' or '..' and not starting with '..'"
	// +optional
	Key string `json:"key,omitempty"`
}

// RenderQueueStatus is the observed state of a RenderQueue, polled from every shard's
// GET /v1/status and aggregated by the operator.
type RenderQueueStatus struct {
	// ObservedGeneration is the .metadata.generation the status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Exact, EdgeHealthy, WalksComplete, Progressing, Reconciled, ClassesServed.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Shards is the state of each shard, in shard order.
	// +listType=map
	// +listMapKey=name
	// +optional
	Shards []ShardStatus `json:"shards,omitempty"`

	// CurrentShards is the number of shards in the committed assignment (the scale
	// subresource's status replicas).
	// +optional
	CurrentShards int32 `json:"currentShards,omitempty"`

	// ReadyShards is the number of shards that have finished loading.
	// +optional
	ReadyShards int32 `json:"readyShards,omitempty"`

	// Due is the number of due rows, summed per slot over the committed assignment (each slot
	// counted once, by its owner). A lower bound unless DueExact.
	// +optional
	Due int64 `json:"due"`

	// DueExact is true when every shard is reachable and exact, so Due is the true count.
	// +optional
	DueExact bool `json:"dueExact"`

	// RowsHeldBack is the number of due rows no shard hands out yet, summed over the shards
	// (ShardStatus.RowsHeldBack): rows of slots whose earlier owner's leases are not known yet
	// (a handover in progress) or not at all (a keeper process that died, a shard that did not
	// hand its leases over), held back until any such lease has ended. They are counted in Due.
	// +optional
	RowsHeldBack int64 `json:"rowsHeldBack,omitempty"`

	// DueAsOf is the time of the shard poll at which Due or DueExact last changed. The operator
	// polls every few seconds but rewrites the status only when something in it changed, so a
	// still queue keeps an older DueAsOf: Due has been the same since.
	// +optional
	DueAsOf *metav1.Time `json:"dueAsOf,omitempty"`

	// Objectives are how the freshness objectives of spec.objectives are kept over their
	// windows, from the events the shards counted (docs/objectives.md); the operator keeps their
	// history in the ConfigMap <name>-objective-history.
	// +listType=map
	// +listMapKey=name
	// +optional
	Objectives []ObjectiveStatus `json:"objectives,omitempty"`

	// Forecast is the work due within the next 15 minutes, hour and day: Due plus the rows that
	// come due by then, from the shards' exact counts of their held rows by due time. It is what
	// the external metric renderqueue_due_forecast serves (docs/autoscaling.md, "Scaling ahead").
	// Unset until the shards have been polled.
	// +optional
	Forecast *ForecastStatus `json:"forecast,omitempty"`

	// Membership is the slot assignment and the state of any handoff in progress.
	// +optional
	Membership MembershipStatus `json:"membership,omitempty"`

	// Selector is the label selector of the shard Pods, in string form (scale subresource).
	// +optional
	Selector string `json:"selector,omitempty"`

	// TLS is the shards' serving certificate: as the operator last issued it (spec.tls
	// OperatorIssued; the operator never reads that Secret back: it renews the certificate from
	// what is recorded here), or as it last found it in the Secret you provide (Provided);
	// unset when TLS is disabled.
	// +optional
	TLS *ShardTLSStatus `json:"tls,omitempty"`
}

// ObjectiveStatus is how one objective is kept.
type ObjectiveStatus struct {
	// Name of the objective.
	Name string `json:"name"`
	// Window is the span judged; Since its start (later while the history is younger).
	Window metav1.Duration `json:"window"`
	// +optional
	Since metav1.Time `json:"since,omitzero"`
	// Good and Late are the events decided within the window.
	// +optional
	Good int64 `json:"good"`
	// +optional
	Late int64 `json:"late"`
	// Attainment is Good over all events, e.g. "99.42%"; empty while there are none.
	// +optional
	Attainment string `json:"attainment,omitempty"`
	// BudgetRemaining is the share of the error budget (100% − percentile) left over the
	// window, e.g. "40.5%"; negative when overspent.
	// +optional
	BudgetRemaining string `json:"budgetRemaining,omitempty"`
	// BurnRate1h and BurnRate6h are how fast the last hour's and the last 6 hours' events spend
	// the budget (1: exactly at the rate that spends it over any window; 14.4 spends 30 days'
	// in 2), e.g. "0.35"; empty without events in that span.
	// +optional
	BurnRate1h string `json:"burnRate1h,omitempty"`
	// +optional
	BurnRate6h string `json:"burnRate6h,omitempty"`
	// Met is true when Attainment is at least the percentile (or there are no events).
	Met bool `json:"met"`
}

// ForecastStatus is the work due within a few horizons, as of one poll of the shards.
type ForecastStatus struct {
	// AsOf is the time of the shard poll the figures are from. In a queue whose due count does
	// not change the operator refreshes them at most once a minute (ForecastRefresh), so that a
	// still queue does not rewrite its status on every poll; they were true at AsOf.
	AsOf metav1.Time `json:"asOf"`
	// Horizons are the figures per horizon, shortest first: 15m, 1h, 24h.
	// +listType=map
	// +listMapKey=horizon
	Horizons []ForecastHorizon `json:"horizons"`
}

// ForecastHorizon is the work due within one horizon.
type ForecastHorizon struct {
	// Horizon is how far ahead of AsOf it looks: 15m, 1h or 24h.
	Horizon string `json:"horizon"`
	// Due is the rows due at AsOf plus those coming due within Horizon of it. A lower bound
	// unless Exact.
	Due int64 `json:"due"`
	// Exact is true when Due is the true count: the due count is exact, no handoff is in
	// progress and every shard serves the assignment committed, and every shard holds all its
	// rows due within the horizon (its edge is at least Horizon ahead of AsOf).
	Exact bool `json:"exact"`
	// Reason says why Due is not exact; empty when it is.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// ShardTLSStatus records the serving certificate the operator wrote into the shards' Secret, or
// found in the Secret provided.
type ShardTLSStatus struct {
	// SecretName is the Secret (type kubernetes.io/tls) holding the certificate and key the
	// shards serve: <name>-shard-tls, or spec.tls.secretName with Provided.
	SecretName string `json:"secretName"`
	// CAConfigMapName is the ConfigMap whose key ca.crt holds the CA bundle clients verify the
	// shards with, <name>-shard-ca.
	CAConfigMapName string `json:"caConfigMapName"`
	// ServerName is the DNS name the certificate is issued for and clients verify,
	// <name>-shards.<namespace>.svc (also valid: the Service's other names and the shards'
	// host names <pod>.<name>-shards.<namespace>.svc).
	ServerName string `json:"serverName"`
	// Serial is the certificate's serial number, in hex.
	Serial string `json:"serial"`
	// NotAfter is the end of the certificate's validity.
	NotAfter metav1.Time `json:"notAfter"`
	// RenewAfter is when the operator replaces the certificate (30 days before NotAfter, or
	// at once when its CA changed). Unset with Provided: whoever writes the Secret renews it.
	// +optional
	RenewAfter metav1.Time `json:"renewAfter,omitzero"`
	// CAFingerprint is the SHA-256 fingerprint (hex) of the CA certificate clients verify it
	// with (with Provided: the certificate of ca.crt its chain ends at).
	CAFingerprint string `json:"caFingerprint"`
}

// ShardStatus is one shard as the operator last saw it.
type ShardStatus struct {
	// Name of the shard (and of its Pod), <rq>-shard-<i>.
	Name string `json:"name"`

	// Slots the shard owns, in compact text form, e.g. "0-340".
	// +optional
	Slots string `json:"slots,omitempty"`

	// URL is the base URL of the shard's HTTP API (http://<Pod IP>:8080, https:// with
	// spec.tls OperatorIssued or Provided) while its Pod has an IP
	// and is not being deleted; render workers discover the shards from it (pkg/client/discovery/kube's
	// RenderQueue), so they need read access to this object only, not to Pods.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	URL string `json:"url,omitempty"`

	// State is the shard's queue state as it reports it (queued, empty, unready), or the
	// operator's view when it cannot ask (Pending while the Pod starts, Unreachable, Failing
	// when the Pod's status says why the keeper does not run; Error then holds that reason and
	// message, e.g. `CreateContainerConfigError: secret "renderqueue-db" not found`).
	// +optional
	State string `json:"state,omitempty"`

	// Ready is true once the shard has finished its first walk.
	// +optional
	Ready bool `json:"ready"`

	// RowsHeld is the number of rows held in memory.
	// +optional
	RowsHeld int64 `json:"rowsHeld,omitempty"`

	// RowsOwned is the number of rows of the owned slots, held or not (as of the last walk).
	// +optional
	RowsOwned int64 `json:"rowsOwned,omitempty"`

	// Due is the number of due rows in the owned slots.
	// +optional
	Due int64 `json:"due"`

	// Exact is true when the shard vouches for its due count.
	// +optional
	Exact bool `json:"exact"`

	// Edge: every owned row due before it is held. Unset before the first walk, and when the
	// window is 0 (unbounded).
	// +optional
	Edge *metav1.Time `json:"edge,omitempty"`

	// EdgeAheadSeconds is how far the edge is ahead of now, in whole seconds; negative when the
	// edge lags. Between walks it falls by a second every second; so that a still queue does not
	// rewrite its status on every poll, the operator refreshes it when it has drifted by more
	// than a minute or a tenth of its value, when the edge moves, and at once when its sign
	// changes. Edge itself is exact.
	// +optional
	EdgeAheadSeconds *int64 `json:"edgeAheadSeconds,omitempty"`

	// LastWalk summarises the last finished walk.
	// +optional
	LastWalk *WalkSummary `json:"lastWalk,omitempty"`

	// Epoch is the membership epoch the shard reports having adopted.
	// +optional
	Epoch int64 `json:"epoch,omitempty"`

	// PreparedEpoch is the highest epoch whose incoming slots the shard reports fully walked.
	// +optional
	PreparedEpoch int64 `json:"preparedEpoch,omitempty"`

	// RowsHeldBack is the number of the shard's due rows it hands out to nobody yet: rows of
	// slots whose earlier owner may have leased them (see HeldBack).
	// +optional
	RowsHeldBack int64 `json:"rowsHeldBack,omitempty"`

	// HeldBack says which slots hold their rows back, until when and why, e.g. "slots 0-63
	// until 12:00:30Z (the leases of an earlier keeper process are not known: they have ended by
	// then)"; empty when none.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	HeldBack string `json:"heldBack,omitempty"`

	// Error is the last error seen for this shard (its Pod's problem, unreachable, the shard's
	// own error such as a database it cannot reach, a failed walk, ...), empty if none.
	// +optional
	Error string `json:"error,omitempty"`
}

// WalkSummary summarises one verification walk.
type WalkSummary struct {
	// StartedAt is when the walk started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// FinishedAt is when the walk finished.
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
	// Partial is true when some segments could not be read.
	// +optional
	Partial bool `json:"partial,omitempty"`
	// Failed is true when the walk failed as a whole.
	// +optional
	Failed bool `json:"failed,omitempty"`
	// Scanned rows.
	// +optional
	Scanned int64 `json:"scanned,omitempty"`
	// Admitted rows: newly held rows due at or after the previous edge.
	// +optional
	Admitted int64 `json:"admitted,omitempty"`
	// Repaired rows: rows due before the previous edge that were missing or stale (true misses).
	// +optional
	Repaired int64 `json:"repaired,omitempty"`
	// Invalid rows skipped.
	// +optional
	Invalid int64 `json:"invalid,omitempty"`
	// UnreadSegments is the number of segments the walk could not read.
	// +optional
	UnreadSegments int64 `json:"unreadSegments,omitempty"`
}

// MembershipStatus is the slot assignment the shards follow (they watch it) and the state of
// any two-phase handoff.
type MembershipStatus struct {
	// Epoch of the committed assignment; bumped by every prepare and commit.
	// +optional
	Epoch int64 `json:"epoch,omitempty"`

	// Assignment is the committed ownership: which slots each shard owns and counts.
	// +listType=map
	// +listMapKey=shard
	// +optional
	Assignment []ShardSlots `json:"assignment,omitempty"`

	// Incoming is, during a handoff, the slots each receiver walks and holds without owning.
	// +listType=map
	// +listMapKey=shard
	// +optional
	Incoming []ShardSlots `json:"incoming,omitempty"`

	// SlotsMoving is the number of slots in Incoming.
	// +optional
	SlotsMoving int32 `json:"slotsMoving,omitempty"`

	// Handoff is the two-phase handoff in progress (state Preparing) or the last one that
	// finished (Committed or RolledBack): everything the operator needs to resume it.
	// +optional
	Handoff *HandoffStatus `json:"handoff,omitempty"`
}

// HandoffState is the state of a two-phase slot handoff.
// +kubebuilder:validation:Enum=Preparing;Committed;RolledBack
type HandoffState string

// Handoff states (the same values as pkg/membership's).
const (
	// HandoffPreparing: the prepare assignment is published; receivers are walking their
	// incoming slots.
	HandoffPreparing HandoffState = "Preparing"
	// HandoffCommitted: ownership of the moving slots was moved to their receivers.
	HandoffCommitted HandoffState = "Committed"
	// HandoffRolledBack: a receiver did not report in time; the previous ownership was
	// published again.
	HandoffRolledBack HandoffState = "RolledBack"
)

// HandoffStatus is the persisted state of one rebalance (pkg/membership's Handoff).
type HandoffStatus struct {
	// State of the handoff.
	State HandoffState `json:"state"`
	// FromEpoch is the epoch of the settled assignment the handoff started from.
	FromEpoch int64 `json:"fromEpoch"`
	// PrepareEpoch is the epoch of the prepare assignment; 0 for the first assignment, which is
	// committed directly.
	// +optional
	PrepareEpoch int64 `json:"prepareEpoch,omitempty"`
	// FinalEpoch is the epoch of the commit or rollback assignment.
	FinalEpoch int64 `json:"finalEpoch"`
	// Moves lists the slots being handed over.
	// +listType=atomic
	// +optional
	Moves []SlotMove `json:"moves,omitempty"`
	// StartedAt is when the handoff started.
	StartedAt metav1.Time `json:"startedAt"`
	// Deadline is when a handoff still Preparing is rolled back.
	Deadline metav1.Time `json:"deadline"`
	// FinishedAt is when the handoff was committed or rolled back.
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
	// Waiting lists the receivers that had not reported the prepare epoch walked at the last
	// step.
	// +listType=atomic
	// +optional
	Waiting []string `json:"waiting,omitempty"`
}

// SlotMove is a set of slots handed from one shard to another.
type SlotMove struct {
	// From is the giving shard; empty for slots without owner (the first assignment).
	// +optional
	From string `json:"from,omitempty"`
	// To is the receiving shard.
	To string `json:"to"`
	// Slots moving, in compact text form.
	Slots string `json:"slots"`
}

// ShardSlots is a set of slots of one shard.
type ShardSlots struct {
	// Shard name, <rq>-shard-<i>.
	Shard string `json:"shard"`
	// Slots in compact text form, e.g. "0-340,1000-1023".
	// +optional
	Slots string `json:"slots,omitempty"`
}

// RenderQueue is a sharded, in-memory queue of due render work over a PostgreSQL schedule:
// keeper shards that hold the due rows of their hash slots, hand render workers the most overdue
// work first, and report exactly how much work is due.
//
// The name is a DNS label of at most 53 characters starting with a letter (MaxNameLength), so
// that the names of its children — shard Pods <name>-shard-<i> with i up to 255, their host
// names and labels, the Service <name>-shards — are valid. It is checked when the object is
// created (a name never changes), so that an object stored before the rule can still have its
// status written.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=rq,categories=renderqueue
// +kubebuilder:validation:XValidation:rule="oldSelf.hasValue() || (self.metadata.name.size() <= 53 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$'))",optionalOldSelf=true,message="metadata.name must be at most 53 characters of lower-case alphanumerics and '-', starting with a letter and ending with an alphanumeric: the shard Pods (<name>-shard-<i>), their host names and labels and the Service <name>-shards are named after it"
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.shards,statuspath=.status.currentShards,selectorpath=.status.selector
// +kubebuilder:printcolumn:name="Shards",type=integer,JSONPath=`.spec.shards`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Ready condition"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="why Ready is what it is (ShardsNotReady, AllShardsReady, ...)"
// +kubebuilder:printcolumn:name="Reconciled",type=string,JSONPath=`.status.conditions[?(@.type=="Reconciled")].reason`,description="ReconcileSucceeded, or why the operator leaves the shards alone (InvalidSpec, ImageNotAllowed, ChildConflict, ...)"
// +kubebuilder:printcolumn:name="Due",type=integer,JSONPath=`.status.due`
// +kubebuilder:printcolumn:name="Exact",type=boolean,JSONPath=`.status.dueExact`
// +kubebuilder:printcolumn:name="Edge",type=string,JSONPath=`.status.conditions[?(@.type=="EdgeHealthy")].status`,description="EdgeHealthy condition"
// +kubebuilder:printcolumn:name="ReadyShards",type=integer,JSONPath=`.status.readyShards`,priority=1,description="shards that have finished loading"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RenderQueue struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state.
	Spec RenderQueueSpec `json:"spec"`
	// Status is the observed state, written by the operator.
	// +optional
	Status RenderQueueStatus `json:"status,omitempty"`

	// decodeErr is set by UnmarshalJSON when spec or status did not decode (DecodeErr).
	decodeErr string `json:"-"`
}

// RenderQueueList is a list of RenderQueues.
//
// +kubebuilder:object:root=true
type RenderQueueList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the RenderQueues.
	Items []RenderQueue `json:"items"`
}
