package v1alpha1

import (
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// Defaults, mirrored from the kubebuilder default markers for code that builds objects itself.
const (
	// DefaultShards is the default spec.shards.
	DefaultShards = 1
	// MaxShards is the largest spec.shards.
	MaxShards = 256
	// DefaultVerifyInterval is the default spec.verifyInterval.
	DefaultVerifyInterval = 60 * time.Minute
	// DefaultVerifyWalkRate is the default spec.verifyWalkRate, rows a second (the keeper's
	// keeper.DefaultVerifyWalkRate).
	DefaultVerifyWalkRate = 100_000
	// DefaultLeaseDuration is the default spec.leaseDuration.
	DefaultLeaseDuration = 5 * time.Minute
	// DefaultSubmittedBoost is the default spec.priority.submittedBoost.
	DefaultSubmittedBoost = "2"
	// DefaultUrgentMaxShare is the default spec.priority.urgentMaxShare.
	DefaultUrgentMaxShare = "0.2"
	// DefaultReschedule is the default spec.priority.reschedule.
	DefaultReschedule = "Adaptive"
	// DefaultSecretKey is the default spec.store.secretRef.key.
	DefaultSecretKey = "dsn"
)

// ShardName is the name of shard i of the RenderQueue named queue (and of its Pod).
func ShardName(queue string, i int) string { return fmt.Sprintf("%s-shard-%d", queue, i) }

// ShardName is the name of this RenderQueue's shard i (and of its Pod).
func (rq *RenderQueue) ShardName(i int) string { return ShardName(rq.Name, i) }

// ShardServerName is the TLS server name of the shards of the RenderQueue namespace/name with
// spec.tls OperatorIssued or Provided, <name>-shards.<namespace>.svc (the headless Service's name): clients
// verify the shards' certificate for it whatever address they dial.
func ShardServerName(namespace, name string) string { return name + "-shards." + namespace + ".svc" }

// ShardTLSSecretName is the Secret holding the shards' serving certificate, <name>-shard-tls.
func ShardTLSSecretName(name string) string { return name + "-shard-tls" }

// ShardCAConfigMapName is the ConfigMap holding the CA bundle of the shards' certificate (key
// ShardCAKey), <name>-shard-ca: render workers mount it.
func ShardCAConfigMapName(name string) string { return name + "-shard-ca" }

// ObjectiveHistoryConfigMapName is the ConfigMap in which the operator keeps the history of the
// freshness objectives of RenderQueue name (status.objectives), under ObjectiveHistoryKey.
func ObjectiveHistoryConfigMapName(name string) string { return name + "-objective-history" }

// ObjectiveHistoryKey is the key of the history (JSON) in ObjectiveHistoryConfigMapName.
const ObjectiveHistoryKey = "history.json"

// ObjectiveHistoryWrittenAt is the annotation of ObjectiveHistoryConfigMapName that says when the
// history was last written (RFC 3339).
const ObjectiveHistoryWrittenAt = Group + "/written-at"

// ShardCAKey is the key of the CA bundle in the ConfigMap ShardCAConfigMapName.
const ShardCAKey = "ca.crt"

// TLSEnabled reports whether the shards serve their API over HTTPS (spec.tls OperatorIssued or
// Provided).
func (s *RenderQueueSpec) TLSEnabled() bool {
	return s.TLS.Mode == ShardTLSOperatorIssued || s.TLS.Mode == ShardTLSProvided
}

// ShardTLSSecret is the Secret the shards of the RenderQueue name serve their certificate from
// while TLSEnabled: spec.tls.secretName with Provided, else ShardTLSSecretName(name).
func (s *RenderQueueSpec) ShardTLSSecret(name string) string {
	if s.TLS.Mode == ShardTLSProvided {
		return s.TLS.SecretName
	}
	return ShardTLSSecretName(name)
}

// decimal is the format the API server enforces on the Priority fields.
var decimal = regexp.MustCompile(`^[0-9]+([.][0-9]+)?$`)

func parseDecimal(field, s, def string, lo, hi float64, loInclusive bool) (float64, error) {
	if s == "" {
		s = def
	}
	if !decimal.MatchString(s) {
		return 0, fmt.Errorf("%s %q is not a decimal number", field, s)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", field, s, err)
	}
	if v < lo || (!loInclusive && v == lo) || v > hi {
		return 0, fmt.Errorf("%s %s is out of range", field, s)
	}
	return v, nil
}

// SubmittedBoostValue is SubmittedBoost as a number (the default when empty).
func (p Priority) SubmittedBoostValue() (float64, error) {
	return parseDecimal("submittedBoost", p.SubmittedBoost, DefaultSubmittedBoost, 0, 1000, false)
}

// UrgentMaxShareValue is UrgentMaxShare as a number (the default when empty).
func (p Priority) UrgentMaxShareValue() (float64, error) {
	return parseDecimal("urgentMaxShare", p.UrgentMaxShare, DefaultUrgentMaxShare, 0, 1, true)
}

// ShareValue is the floor's Share as a number.
func (f Floor) ShareValue() (float64, error) {
	return parseDecimal("floor share", f.Share, "", 0, 1, false)
}

// RescheduleValue is Reschedule, or the default when empty.
func (p Priority) RescheduleValue() string {
	if p.Reschedule == "" {
		return DefaultReschedule
	}
	return p.Reschedule
}

// WindowDuration is spec.window; 0 (hold every owned row) when unset.
func (s *RenderQueueSpec) WindowDuration() time.Duration {
	if s.Window == nil {
		return 0
	}
	return s.Window.Duration
}

// VerifyIntervalDuration is spec.verifyInterval; DefaultVerifyInterval when unset.
func (s *RenderQueueSpec) VerifyIntervalDuration() time.Duration {
	if s.VerifyInterval == nil {
		return DefaultVerifyInterval
	}
	return s.VerifyInterval.Duration
}

// VerifyWalkRateValue is spec.verifyWalkRate, rows a second; DefaultVerifyWalkRate when unset,
// 0 for unpaced walks.
func (s *RenderQueueSpec) VerifyWalkRateValue() int {
	if s.VerifyWalkRate == nil {
		return DefaultVerifyWalkRate
	}
	return int(*s.VerifyWalkRate)
}

// LeaseDurationValue is spec.leaseDuration; DefaultLeaseDuration when unset.
func (s *RenderQueueSpec) LeaseDurationValue() time.Duration {
	if s.LeaseDuration == nil {
		return DefaultLeaseDuration
	}
	return s.LeaseDuration.Duration
}

// MaxLeaseDurationValue is spec.maxLeaseDuration; spec.leaseDuration (LeaseDurationValue) when
// unset.
func (s *RenderQueueSpec) MaxLeaseDurationValue() time.Duration {
	if s.MaxLeaseDuration == nil {
		return s.LeaseDurationValue()
	}
	return s.MaxLeaseDuration.Duration
}

// HandoffInProgress says whether a slot handoff is being prepared: its prepare assignment is
// published and it is neither committed nor rolled back (status.membership.handoff.state
// Preparing).
func (m *MembershipStatus) HandoffInProgress() bool {
	return m.Handoff != nil && m.Handoff.State == HandoffPreparing
}
