package v1alpha1

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

// Bounds the API server enforces (the rules of renderqueue_types.go) and Validate checks
// again in Go, for objects stored before the rules were tightened.
const (
	// MaxNameLength is the longest RenderQueue name: its shard Pods are named
	// <name>-shard-<i> (i up to MaxShards-1), and a Pod's host name and a label value hold at
	// most 63 characters.
	MaxNameLength = 63 - len("-shard-255")
	// MinWindow and MaxWindow bound a non-zero spec.window.
	MinWindow, MaxWindow = time.Minute, 8760 * time.Hour
	// MinVerifyInterval and MaxVerifyInterval bound a non-zero spec.verifyInterval.
	MinVerifyInterval, MaxVerifyInterval = 10 * time.Second, 8760 * time.Hour
	// MaxVerifyWalkRate bounds spec.verifyWalkRate (rows a second; 0 is unpaced).
	MaxVerifyWalkRate = 100_000_000
	// MaxProcs bounds spec.procs (threads running the keeper's Go code; 0 is the Go runtime's
	// choice).
	MaxProcs = 256
	// MinLeaseDuration and MaxLeaseDuration bound spec.leaseDuration (the keeper's longest
	// lease a claim may ask for is 24h too).
	MinLeaseDuration, MaxLeaseDuration = time.Second, 24 * time.Hour
	// MinFloorCadence and MaxFloorCadence bound a floor's cadence (the cadences a row may have).
	MinFloorCadence, MaxFloorCadence = time.Millisecond, 87600 * time.Hour
)

// UnmarshalJSON decodes a RenderQueue. A spec or status that does not decode into these types
// (an object stored before the CRD's validation was tightened, such as a window of 2562048h,
// which overflows a Go duration) does not fail the decode: the object is returned with its type
// and object metadata, whatever of spec and status decodes, and DecodeErr naming the field. So
// one such object cannot fail a list of RenderQueues (an informer's, and so every consumer of the
// operator's cache); the operator reports it on the object itself and leaves it alone.
//
// The decode is never strict (unknown fields are dropped, whatever the caller's decoder asks):
// check a manifest with the API server's strict field validation (kubectl does by default).
// A struct embedding RenderQueue inherits this method; do not embed it.
func (rq *RenderQueue) UnmarshalJSON(data []byte) error {
	type plain RenderQueue // without this method
	var p plain
	err := kjson.UnmarshalCaseSensitivePreserveInts(data, &p)
	if err == nil {
		*rq = RenderQueue(p)
		return nil
	}
	var parts struct {
		metav1.TypeMeta `json:",inline"`
		ObjectMeta      metav1.ObjectMeta          `json:"metadata,omitempty"`
		Spec            map[string]json.RawMessage `json:"spec,omitempty"`
		Status          map[string]json.RawMessage `json:"status,omitempty"`
	}
	if perr := kjson.UnmarshalCaseSensitivePreserveInts(data, &parts); perr != nil {
		return err // not a RenderQueue at all: the original error
	}
	*rq = RenderQueue{TypeMeta: parts.TypeMeta, ObjectMeta: parts.ObjectMeta}
	var problems []string
	decodeFields := func(section string, fields map[string]json.RawMessage, into any) {
		for _, name := range slices.Sorted(maps.Keys(fields)) {
			one, merr := json.Marshal(map[string]json.RawMessage{name: fields[name]})
			if merr == nil {
				merr = kjson.UnmarshalCaseSensitivePreserveInts(one, into)
			}
			if merr != nil {
				problems = append(problems, fmt.Sprintf("%s.%s: %v", section, name, merr))
			}
		}
	}
	decodeFields("spec", parts.Spec, &rq.Spec)
	decodeFields("status", parts.Status, &rq.Status)
	if len(problems) == 0 {
		problems = append(problems, err.Error())
	}
	rq.decodeErr = strings.Join(problems, "; ")
	return nil
}

// DecodeErr is the reason the object's spec or status did not decode (see UnmarshalJSON), nil
// when it decoded whole. An object with a DecodeErr has the fields that failed left at their
// zero values: never write it back.
func (rq *RenderQueue) DecodeErr() error {
	if rq.decodeErr == "" {
		return nil
	}
	return fmt.Errorf("the RenderQueue does not decode: %s", rq.decodeErr)
}

// Validate checks what the operator and the keeper rely on: the object decoded whole
// (DecodeErr), its name gives valid child names, the durations, the verification walk rate and
// procs are within their bounds, the Secret references are Secret names and keys, the image has
// no whitespace. The API server enforces the same rules on every write since they were added;
// Validate catches objects stored before. The error names each field.
func (rq *RenderQueue) Validate() error {
	if err := rq.DecodeErr(); err != nil {
		return err
	}
	var errs field.ErrorList
	name := field.NewPath("metadata", "name")
	spec := field.NewPath("spec")
	s := &rq.Spec
	if s.Shards < 1 || s.Shards > MaxShards {
		errs = append(errs, field.Invalid(spec.Child("shards"), s.Shards, fmt.Sprintf("must be between 1 and %d", MaxShards)))
	}
	// The API server allows MaxNameLength, enough for any spec.shards; an object stored before
	// that rule is refused here only when a child it needs now cannot be named, so that one whose
	// shards run keeps being reconciled.
	for _, msg := range validation.IsDNS1035Label(rq.Name) {
		errs = append(errs, field.Invalid(name, rq.Name, msg+" (the shards' Service is named after it)"))
	}
	if svc := rq.Name + "-shards"; len(svc) > validation.DNS1035LabelMaxLength {
		errs = append(errs, field.Invalid(name, rq.Name, fmt.Sprintf("the shards' Service %s would be %d characters, at most %d",
			svc, len(svc), validation.DNS1035LabelMaxLength)))
	} else if last := rq.ShardName(int(max(s.Shards, 1)) - 1); len(last) > validation.DNS1123LabelMaxLength {
		errs = append(errs, field.Invalid(name, rq.Name, fmt.Sprintf("the shard Pod %s would be %d characters, at most %d (its host name and labels)",
			last, len(last), validation.DNS1123LabelMaxLength)))
	}
	errs = append(errs, durationBounds(spec.Child("window"), s.Window, true, MinWindow, MaxWindow)...)
	errs = append(errs, durationBounds(spec.Child("verifyInterval"), s.VerifyInterval, true, MinVerifyInterval, MaxVerifyInterval)...)
	errs = append(errs, durationBounds(spec.Child("leaseDuration"), s.LeaseDuration, false, MinLeaseDuration, MaxLeaseDuration)...)
	if bad := durationBounds(spec.Child("maxLeaseDuration"), s.MaxLeaseDuration, false, MinLeaseDuration, MaxLeaseDuration); len(bad) > 0 {
		errs = append(errs, bad...)
	} else if m := s.MaxLeaseDuration; m != nil && m.Duration < s.LeaseDurationValue() {
		errs = append(errs, field.Invalid(spec.Child("maxLeaseDuration"), m.Duration.String(),
			fmt.Sprintf("must be at least leaseDuration (%v)", s.LeaseDurationValue())))
	}
	if r := s.VerifyWalkRate; r != nil && (*r < 0 || *r > MaxVerifyWalkRate) {
		errs = append(errs, field.Invalid(spec.Child("verifyWalkRate"), *r,
			fmt.Sprintf("must be from 0 (unpaced) to %d rows a second", MaxVerifyWalkRate)))
	}
	if p := s.Procs; p != nil && (*p < 0 || *p > MaxProcs) {
		errs = append(errs, field.Invalid(spec.Child("procs"), *p,
			fmt.Sprintf("must be from 0 (the Go runtime's choice) to %d threads", MaxProcs)))
	}
	for i, f := range s.Priority.Floors {
		p := spec.Child("priority", "floors").Index(i).Child("cadence")
		c := f.Cadence
		errs = append(errs, durationBounds(p, &c, false, MinFloorCadence, MaxFloorCadence)...)
		if c.Duration%time.Millisecond != 0 {
			errs = append(errs, field.Invalid(p, c.Duration.String(), "must be whole milliseconds"))
		}
	}
	errs = append(errs, validateObjectives(spec.Child("objectives"), s.Objectives)...)
	ref := spec.Child("store", "secretRef")
	for _, msg := range validation.IsDNS1123Subdomain(s.Store.SecretRef.Name) {
		errs = append(errs, field.Invalid(ref.Child("name"), s.Store.SecretRef.Name, msg))
	}
	if key := s.Store.SecretRef.Key; key != "" {
		for _, msg := range validation.IsConfigMapKey(key) {
			errs = append(errs, field.Invalid(ref.Child("key"), key, msg))
		}
	}
	for i, p := range s.ImagePullSecrets {
		for _, msg := range validation.IsDNS1123Subdomain(p.Name) {
			errs = append(errs, field.Invalid(spec.Child("imagePullSecrets").Index(i).Child("name"), p.Name, msg))
		}
	}
	if strings.ContainsFunc(s.Image, isSpace) {
		errs = append(errs, field.Invalid(spec.Child("image"), s.Image, "must not contain whitespace"))
	}
	switch s.TLS.Mode {
	case "", ShardTLSDisabled, ShardTLSOperatorIssued, ShardTLSProvided:
	default:
		errs = append(errs, field.NotSupported(spec.Child("tls", "mode"), s.TLS.Mode,
			[]ShardTLSMode{ShardTLSDisabled, ShardTLSOperatorIssued, ShardTLSProvided}))
	}
	switch secret := spec.Child("tls", "secretName"); {
	case s.TLS.Mode == ShardTLSProvided && s.TLS.SecretName == "":
		errs = append(errs, field.Required(secret, "tls.secretName is required when tls.mode is Provided"))
	case s.TLS.Mode != ShardTLSProvided && s.TLS.SecretName != "":
		errs = append(errs, field.Forbidden(secret, "tls.secretName is only allowed when tls.mode is Provided"))
	case s.TLS.SecretName != "":
		for _, msg := range validation.IsDNS1123Subdomain(s.TLS.SecretName) {
			errs = append(errs, field.Invalid(secret, s.TLS.SecretName, msg))
		}
	}
	return errs.ToAggregate()
}

// durationBounds checks d (unset is fine: the default applies) against [lo, hi], and 0 when
// zeroOK.
func durationBounds(p *field.Path, d *metav1.Duration, zeroOK bool, lo, hi time.Duration) field.ErrorList {
	if d == nil || (zeroOK && d.Duration == 0) {
		return nil
	}
	if d.Duration < lo || d.Duration > hi {
		what := fmt.Sprintf("must be from %v to %v", lo, hi)
		if zeroOK {
			what = fmt.Sprintf("must be 0 or from %v to %v", lo, hi)
		}
		return field.ErrorList{field.Invalid(p, d.Duration.String(), what)}
	}
	return nil
}

func isSpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}

// Bounds of an objective's maxLateness.
const (
	MinObjectiveLateness = time.Second
	MaxObjectiveLateness = 8760 * time.Hour
	// MaxObjectives is the most objectives a RenderQueue may have.
	MaxObjectives = 16
)

var objectiveNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// DefaultObjectiveWindow is an objective's window when spec.objectives[].window is unset.
const DefaultObjectiveWindow = 672 * time.Hour

// WindowDuration is the objective's window, DefaultObjectiveWindow when unset.
func (o Objective) WindowDuration() time.Duration {
	if o.Window == nil || o.Window.Duration <= 0 {
		return DefaultObjectiveWindow
	}
	return o.Window.Duration
}

// PercentileValue parses the objective's percentile: a decimal number within (0, 100).
func (o Objective) PercentileValue() (float64, error) {
	v, err := strconv.ParseFloat(o.Percentile, 64)
	if err != nil || !(v > 0 && v < 100) || strings.ContainsAny(o.Percentile, "eE+-") {
		return 0, fmt.Errorf("percentile %q must be a decimal number greater than 0 and below 100, such as \"99\" or \"99.9\"", o.Percentile)
	}
	return v, nil
}

// overlaps reports whether some class of rows (cadence, source, urgency) matches both.
func (c ObjectiveClass) overlaps(d ObjectiveClass) bool {
	lo := max(durOr(c.MinCadence, 0), durOr(d.MinCadence, 0))
	if (c.MaxCadence != nil && lo > c.MaxCadence.Duration) || (d.MaxCadence != nil && lo > d.MaxCadence.Duration) {
		return false
	}
	if c.Source != "" && d.Source != "" && c.Source != d.Source {
		return false
	}
	return c.Urgent == nil || d.Urgent == nil || *c.Urgent == *d.Urgent
}

func durOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.Duration
}

// validateObjectives checks spec.objectives: names, percentiles, maxLateness, cadence ranges, and
// that no two select a row in common (each row's event is counted for one objective).
func validateObjectives(p *field.Path, objs []Objective) field.ErrorList {
	var errs field.ErrorList
	if len(objs) > MaxObjectives {
		errs = append(errs, field.TooMany(p, len(objs), MaxObjectives))
	}
	seen := map[string]bool{}
	for i, o := range objs {
		op := p.Index(i)
		if !objectiveNameRE.MatchString(o.Name) || len(o.Name) > 63 {
			errs = append(errs, field.Invalid(op.Child("name"), o.Name, "must be 1–63 lower-case letters, digits and '-', starting and ending with a letter or digit"))
		}
		if seen[o.Name] {
			errs = append(errs, field.Duplicate(op.Child("name"), o.Name))
		}
		seen[o.Name] = true
		if _, err := o.PercentileValue(); err != nil {
			errs = append(errs, field.Invalid(op.Child("percentile"), o.Percentile, err.Error()))
		}
		ml := o.MaxLateness
		errs = append(errs, durationBounds(op.Child("maxLateness"), &ml, false, MinObjectiveLateness, MaxObjectiveLateness)...)
		errs = append(errs, durationBounds(op.Child("window"), o.Window, false, time.Hour, 2160*time.Hour)...)
		if o.Class.Source != "" && o.Class.Source != "submitted" && o.Class.Source != "discovered" {
			errs = append(errs, field.NotSupported(op.Child("class", "source"), o.Class.Source, []string{"submitted", "discovered"}))
		}
		if mn, mx := o.Class.MinCadence, o.Class.MaxCadence; (mn != nil && mn.Duration < 0) || (mx != nil && mx.Duration < 0) ||
			(mn != nil && mx != nil && mn.Duration > mx.Duration) {
			errs = append(errs, field.Invalid(op.Child("class"), fmt.Sprintf("%v–%v", durOr(mn, 0), durOr(mx, 0)),
				"minCadence must not be above maxCadence, nor either negative"))
		}
		for j := range i {
			if objs[j].Class.overlaps(o.Class) {
				errs = append(errs, field.Invalid(op.Child("class"), o.Name, fmt.Sprintf(
					"selects some rows objective %q selects too: each row counts for one objective, so the classes must not overlap", objs[j].Name)))
			}
		}
	}
	return errs
}
