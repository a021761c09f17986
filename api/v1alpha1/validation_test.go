package v1alpha1_test

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

const ns = "default"

// remove, as a value in a field edit, deletes the field instead of setting it.
type removeField struct{}

var remove = removeField{}

// minimal is the smallest valid RenderQueue, as the API server receives it (unstructured, so that
// values the Go types cannot hold, such as malformed durations, can be sent too).
func minimal() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "renderqueue.dev/v1alpha1",
		"kind":       "RenderQueue",
		"metadata":   map[string]any{"generateName": "rq-", "namespace": ns},
		"spec": map[string]any{
			"store": map[string]any{"secretRef": map[string]any{"name": "renderqueue-db"}},
		},
	}}
}

// withField is minimal() with one field (a dotted path under spec) set or removed.
func withField(path string, value any) *unstructured.Unstructured {
	u := minimal()
	fields := append([]string{"spec"}, strings.Split(path, ".")...)
	if value == remove {
		unstructured.RemoveNestedField(u.Object, fields...)
	} else {
		Expect(unstructured.SetNestedField(u.Object, value, fields...)).To(Succeed())
	}
	return u
}

// floor and floors build spec.priority.floors as the API server receives it.
func floor(cadence, source, share string) map[string]any {
	return map[string]any{"cadence": cadence, "source": source, "share": share}
}

func objective(name, percentile, maxLateness string) map[string]any {
	return map[string]any{"name": name, "percentile": percentile, "maxLateness": maxLateness}
}

func floors(f ...map[string]any) []any {
	out := make([]any, len(f))
	for i := range f {
		out[i] = f[i]
	}
	return out
}

// Messages of the CRD's rules, as the table expects them.
const (
	windowMsg     = "window must be 0 (hold every owned row) or a duration from 1m to 8760h"
	verifyMsg     = "verifyInterval must be 0 or a duration from 10s to 8760h"
	leaseMsg      = "leaseDuration must be a duration from 1s to 24h"
	maxLeaseMsg   = "maxLeaseDuration must be a duration from 1s to 24h"
	cadenceMsg    = "floor cadence must be a duration of whole milliseconds from 1ms to 87600h"
	secretNameMsg = "store.secretRef.name must name the Secret holding the PostgreSQL DSN: lower-case alphanumerics"
	secretKeyMsg  = "store.secretRef.key must be a Secret key"
	imageMsg      = "image must be an image reference without whitespace"
)

// rejected counts the invalid specs the API server rejected (each table entry that passed).
var rejected atomic.Int32

var _ = AfterSuite(func() {
	AddReportEntry("invalid specs tried and rejected", rejected.Load())
	GinkgoWriter.Printf("invalid specs rejected by the API server with a message naming the field: %d\n", rejected.Load())
})

// goChecked says whether RenderQueue.Validate, the Go mirror of the rules the operator and the
// keeper rely on (for objects stored before the rules), checks field.
func goChecked(field string) bool {
	for _, p := range []string{"metadata.name", "spec.shards", "spec.window", "spec.verifyInterval", "spec.verifyWalkRate", "spec.leaseDuration", "spec.maxLeaseDuration",
		"spec.procs", "spec.store", "spec.image", "spec.objectives"} {
		if field == p || strings.HasPrefix(field, p+".") || strings.HasPrefix(field, p+"[") {
			return true
		}
	}
	return (strings.HasPrefix(field, "spec.priority.floors[") && strings.HasSuffix(field, ".cadence")) ||
		(strings.HasPrefix(field, "spec.imagePullSecrets[") && strings.HasSuffix(field, ".name"))
}

// expectGoValidation decodes u as the operator does and checks that Validate agrees with the API
// server: valid objects pass; an invalid one fails, naming the field (its top-level part when the
// value does not even decode), when Validate checks that field.
func expectGoValidation(u *unstructured.Unstructured, field string, valid bool) {
	GinkgoHelper()
	u = u.DeepCopy()
	if u.GetName() == "" {
		u.SetName("rq-go")
	}
	data, err := u.MarshalJSON()
	Expect(err).NotTo(HaveOccurred())
	var rq rqv1.RenderQueue
	Expect(json.Unmarshal(data, &rq)).To(Succeed(), "a RenderQueue must always decode")
	err = rq.Validate()
	if valid {
		Expect(err).NotTo(HaveOccurred(), "Validate rejects what the API server accepted")
		return
	}
	if !goChecked(field) {
		return
	}
	Expect(err).To(HaveOccurred(), "Validate accepts %s, which the API server rejects", field)
	parts := strings.SplitN(field, ".", 3)
	top := strings.Join(parts[:min(2, len(parts))], ".")
	top, _, _ = strings.Cut(top, "[")
	Expect(err.Error()).To(ContainSubstring(top))
}

var _ = Describe("RenderQueue validation", func() {
	DescribeTable("rejects an invalid spec with a message naming the field",
		func(path string, value any, field, message string) {
			u := withField(path, value)
			err := k8sClient.Create(ctx, u)
			Expect(err).To(HaveOccurred(), "%s = %v was accepted", path, value)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "not an Invalid error: %v", err)
			Expect(err.Error()).To(ContainSubstring(field))
			Expect(err.Error()).To(ContainSubstring(message))
			rejected.Add(1)
			expectGoValidation(u, field, false)
		},
		Entry("no shards", "shards", int64(0), "spec.shards", "shards must be between 1 and 256"),
		Entry("negative shards", "shards", int64(-3), "spec.shards", "shards must be between 1 and 256"),
		Entry("too many shards", "shards", int64(257), "spec.shards", "shards must be between 1 and 256"),

		Entry("negative window", "window", "-1h", "spec.window", windowMsg),
		Entry("malformed window", "window", "3 days", "spec.window", windowMsg),
		Entry("window in days", "window", "1d", "spec.window", windowMsg),
		Entry("window without unit", "window", "24", "spec.window", windowMsg),
		Entry("window that overflows a Go duration", "window", "2562048h", "spec.window", windowMsg),
		Entry("window of 2ns", "window", "2ns", "spec.window", windowMsg),
		Entry("window just under 1m", "window", "59.999s", "spec.window", windowMsg),
		Entry("window over a year", "window", "8760h1ns", "spec.window", windowMsg),
		Entry("window of many digits", "window", "9999999999999999999ns", "spec.window", windowMsg),
		Entry("window of repeated hours that overflow", "window", "99999h99999h99999h99999h99999h99999h99999h99999h99999h", "spec.window", windowMsg),

		Entry("negative verifyInterval", "verifyInterval", "-5m", "spec.verifyInterval", verifyMsg),
		Entry("verifyInterval of 1ms", "verifyInterval", "1ms", "spec.verifyInterval", verifyMsg),
		Entry("verifyInterval just under 10s", "verifyInterval", "9s", "spec.verifyInterval", verifyMsg),
		Entry("verifyInterval over a year", "verifyInterval", "8761h", "spec.verifyInterval", verifyMsg),
		Entry("verifyInterval that overflows", "verifyInterval", "2562048h", "spec.verifyInterval", verifyMsg),

		Entry("negative verifyWalkRate", "verifyWalkRate", int64(-1), "spec.verifyWalkRate", "should be greater than or equal to 0"),
		Entry("verifyWalkRate over the maximum", "verifyWalkRate", int64(rqv1.MaxVerifyWalkRate+1), "spec.verifyWalkRate", "should be less than or equal to 100000000"),
		Entry("verifyWalkRate past an int32", "verifyWalkRate", int64(1<<31), "spec.verifyWalkRate", "should be less than or equal to 100000000"),
		Entry("fractional verifyWalkRate", "verifyWalkRate", 1.5, "spec.verifyWalkRate", "must be of type integer"),
		Entry("verifyWalkRate as a string", "verifyWalkRate", "100000", "spec.verifyWalkRate", "must be of type integer"),

		Entry("negative procs", "procs", int64(-1), "spec.procs", "should be greater than or equal to 0"),
		Entry("procs over the maximum", "procs", int64(rqv1.MaxProcs+1), "spec.procs", "should be less than or equal to 256"),
		Entry("fractional procs", "procs", 1.5, "spec.procs", "must be of type integer"),
		Entry("procs as a string", "procs", "2", "spec.procs", "must be of type integer"),
		Entry("logging in XML", "logging.format", "xml", "spec.logging.format", `supported values: "text", "json"`),
		Entry("logging level verbose", "logging.level", "verbose", "spec.logging.level", "should match"),
		Entry("logging level 10", "logging.level", "10", "spec.logging.level", "should match"),

		Entry("zero leaseDuration", "leaseDuration", "0s", "spec.leaseDuration", leaseMsg),
		Entry("negative leaseDuration", "leaseDuration", "-30s", "spec.leaseDuration", leaseMsg),
		Entry("malformed leaseDuration", "leaseDuration", "five minutes", "spec.leaseDuration", leaseMsg),
		Entry("leaseDuration of 1ns", "leaseDuration", "1ns", "spec.leaseDuration", leaseMsg),
		Entry("sub-second leaseDuration", "leaseDuration", "500ms", "spec.leaseDuration", leaseMsg),
		Entry("leaseDuration over 24h", "leaseDuration", "24h0m1s", "spec.leaseDuration", leaseMsg),
		Entry("leaseDuration that overflows", "leaseDuration", "2562048h", "spec.leaseDuration", leaseMsg),
		Entry("zero maxLeaseDuration", "maxLeaseDuration", "0s", "spec.maxLeaseDuration", maxLeaseMsg),
		Entry("malformed maxLeaseDuration", "maxLeaseDuration", "an hour", "spec.maxLeaseDuration", maxLeaseMsg),
		Entry("maxLeaseDuration over 24h", "maxLeaseDuration", "25h", "spec.maxLeaseDuration", maxLeaseMsg),
		Entry("maxLeaseDuration below the default leaseDuration", "maxLeaseDuration", "1m", "spec.maxLeaseDuration", "maxLeaseDuration must be at least leaseDuration"),

		Entry("zero submittedBoost", "priority.submittedBoost", "0", "spec.priority.submittedBoost", "submittedBoost must be a decimal number greater than 0 and at most 1000"),
		Entry("negative submittedBoost", "priority.submittedBoost", "-2", "spec.priority.submittedBoost", "submittedBoost must be a decimal number greater than 0 and at most 1000"),
		Entry("huge submittedBoost", "priority.submittedBoost", "1000.5", "spec.priority.submittedBoost", "submittedBoost must be a decimal number greater than 0 and at most 1000"),
		Entry("non-decimal submittedBoost", "priority.submittedBoost", "1e3", "spec.priority.submittedBoost", "submittedBoost must be a decimal number greater than 0 and at most 1000"),
		Entry("urgentMaxShare above 1", "priority.urgentMaxShare", "1.5", "spec.priority.urgentMaxShare", "urgentMaxShare must be a decimal number from 0 to 1"),
		Entry("negative urgentMaxShare", "priority.urgentMaxShare", "-0.1", "spec.priority.urgentMaxShare", "urgentMaxShare must be a decimal number from 0 to 1"),
		Entry("percent urgentMaxShare", "priority.urgentMaxShare", "20%", "spec.priority.urgentMaxShare", "urgentMaxShare must be a decimal number from 0 to 1"),
		Entry("floor share 0", "priority.floors", floors(floor("96h", "discovered", "0")), "spec.priority.floors[0].share", "floor share must be a decimal number greater than 0 and at most 1"),
		Entry("floor share above 1", "priority.floors", floors(floor("96h", "discovered", "1.5")), "spec.priority.floors[0].share", "floor share must be a decimal number greater than 0 and at most 1"),
		Entry("floor share percent", "priority.floors", floors(floor("96h", "discovered", "5%")), "spec.priority.floors[0].share", "floor share must be a decimal number greater than 0 and at most 1"),
		Entry("floors past 1", "priority.floors", floors(floor("1h", "submitted", "0.6"), floor("96h", "discovered", "0.5")), "spec.priority.floors", "floors: shares must not sum past 1"),
		Entry("floor class twice", "priority.floors", floors(floor("1h", "submitted", "0.1"), floor("1h", "submitted", "0.2")), "spec.priority.floors", "floors: at most one floor per class"),
		Entry("floor source", "priority.floors", floors(floor("1h", "crawler", "0.1")), "spec.priority.floors[0].source", "Unsupported value: \"crawler\""),
		Entry("floor cadence 0", "priority.floors", floors(floor("0s", "submitted", "0.1")), "spec.priority.floors[0].cadence", cadenceMsg),
		Entry("floor cadence malformed", "priority.floors", floors(floor("hourly", "submitted", "0.1")), "spec.priority.floors[0].cadence", cadenceMsg),
		Entry("floor cadence of a fraction of a millisecond", "priority.floors", floors(floor("1500us", "submitted", "0.1")), "spec.priority.floors[0].cadence", cadenceMsg),
		Entry("floor cadence over 10 years", "priority.floors", floors(floor("87601h", "submitted", "0.1")), "spec.priority.floors[0].cadence", cadenceMsg),
		Entry("floor cadence that overflows", "priority.floors", floors(floor("2562048h", "submitted", "0.1")), "spec.priority.floors[0].cadence", cadenceMsg),
		Entry("floor without share", "priority.floors", floors(map[string]any{"cadence": "1h", "source": "submitted"}), "spec.priority.floors[0].share", "Required value"),
		Entry("bad reschedule", "priority.reschedule", "Later", "spec.priority.reschedule", "Unsupported value"),
		Entry("objective percentile 100", "objectives", floors(objective("hourly", "100", "10m")), "spec.objectives[0].percentile", "percentile must be a decimal number greater than 0 and below 100"),
		Entry("objective percentile 0", "objectives", floors(objective("hourly", "0", "10m")), "spec.objectives[0].percentile", "percentile must be a decimal number greater than 0 and below 100"),
		Entry("objective percentile as a fraction", "objectives", floors(objective("hourly", "0.99.", "10m")), "spec.objectives[0].percentile", "percentile must be a decimal number greater than 0 and below 100"),
		Entry("objective maxLateness 0", "objectives", floors(objective("hourly", "99", "0s")), "spec.objectives[0].maxLateness", "maxLateness must be a duration from 1s to 8760h"),
		Entry("objective maxLateness malformed", "objectives", floors(objective("hourly", "99", "ten minutes")), "spec.objectives[0].maxLateness", "maxLateness must be a duration from 1s to 8760h"),
		Entry("objective name in upper case", "objectives", floors(objective("Hourly", "99", "10m")), "spec.objectives[0].name", "should match"),
		Entry("objective named twice", "objectives", floors(objective("hourly", "99", "10m"), objective("hourly", "90", "1h")), "spec.objectives[1]", "Duplicate value"),
		Entry("objective class reversed", "objectives", floors(map[string]any{"name": "x", "percentile": "99", "maxLateness": "1m",
			"class": map[string]any{"minCadence": "2h", "maxCadence": "1h"}}), "spec.objectives[0].class", "class: minCadence must not be above maxCadence"),
		Entry("objective class source", "objectives", floors(map[string]any{"name": "x", "percentile": "99", "maxLateness": "1m",
			"class": map[string]any{"source": "sitemap"}}), "spec.objectives[0].class.source", "Unsupported value"),
		Entry("bad tls mode", "tls.mode", "SelfSigned", "spec.tls.mode", "Unsupported value"),
		Entry("tls mode in lower case", "tls.mode", "operatorissued", "spec.tls.mode", "Unsupported value"),
		Entry("tls Provided without a Secret", "tls.mode", "Provided", "spec.tls.secretName", "tls.secretName is required when tls.mode is Provided"),
		Entry("tls Provided with an empty Secret name", "tls", map[string]any{"mode": "Provided", "secretName": ""}, "spec.tls.secretName", "tls.secretName is required when tls.mode is Provided"),
		Entry("tls secretName without Provided", "tls.secretName", "web-tls", "spec.tls.secretName", "tls.secretName is only allowed when tls.mode is Provided"),
		Entry("tls secretName with OperatorIssued", "tls", map[string]any{"mode": "OperatorIssued", "secretName": "web-tls"}, "spec.tls.secretName", "tls.secretName is only allowed when tls.mode is Provided"),
		Entry("tls secretName in upper case", "tls", map[string]any{"mode": "Provided", "secretName": "Web-TLS"}, "spec.tls.secretName", "tls.secretName must be a Secret name"),

		Entry("no store", "store", remove, "spec.store", "Required value"),
		Entry("no store secret", "store.secretRef", remove, "spec.store.secretRef", "Required value"),
		Entry("no store secret name", "store.secretRef.name", remove, "spec.store.secretRef.name", "Required value"),
		Entry("empty store secret name", "store.secretRef.name", "", "spec.store.secretRef.name", secretNameMsg),
		Entry("store secret name with a slash", "store.secretRef.name", "other-ns/pg", "spec.store.secretRef.name", secretNameMsg),
		Entry("upper-case store secret name", "store.secretRef.name", "PG", "spec.store.secretRef.name", secretNameMsg),
		Entry("store secret name with an underscore", "store.secretRef.name", "pg_main", "spec.store.secretRef.name", secretNameMsg),
		Entry("store secret name ending in a dot", "store.secretRef.name", "pg.", "spec.store.secretRef.name", secretNameMsg),
		Entry("store secret name of 254 characters", "store.secretRef.name", strings.Repeat("p", 254), "spec.store.secretRef.name", "Too long"),
		Entry("store secret key with a slash", "store.secretRef.key", "a/b", "spec.store.secretRef.key", secretKeyMsg),
		Entry("store secret key '.'", "store.secretRef.key", ".", "spec.store.secretRef.key", secretKeyMsg),
		Entry("store secret key '..'", "store.secretRef.key", "..", "spec.store.secretRef.key", secretKeyMsg),
		Entry("store secret key starting with '..'", "store.secretRef.key", "..dsn", "spec.store.secretRef.key", secretKeyMsg),

		Entry("image with a space", "image", "registry.example/renderqueue :v1", "spec.image", imageMsg),
		Entry("image with a trailing newline", "image", "registry.example/renderqueue:v1\n", "spec.image", imageMsg),
		Entry("bad imagePullPolicy", "imagePullPolicy", "Sometimes", "spec.imagePullPolicy", "Unsupported value"),
	)

	DescribeTable("rejects a name its children could not carry, with a message naming metadata.name",
		func(name string, shards int64) {
			u := withField("shards", shards)
			unstructured.RemoveNestedField(u.Object, "metadata", "generateName")
			u.SetName(name)
			err := k8sClient.Create(ctx, u)
			Expect(err).To(HaveOccurred(), "the name %q was accepted", name)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "not an Invalid error: %v", err)
			Expect(err.Error()).To(ContainSubstring("metadata.name must be at most 53 characters of lower-case alphanumerics and '-', starting with a letter"))
			rejected.Add(1)
			expectGoValidation(u, "metadata.name", false)
		},
		Entry("54 characters and 256 shards (shard 255's Pod name would be 64)", strings.Repeat("w", 54), int64(256)),
		Entry("57 characters (the shards' Service name would be 64)", strings.Repeat("w", 57), int64(1)),
		Entry("a dot (the shards' Service name cannot hold one)", "web.prod", int64(1)),
		Entry("a leading digit (the shards' Service name must start with a letter)", "1web", int64(1)),
		Entry("upper case", "Web", int64(1)),
		Entry("an underscore", "web_prod", int64(1)),
	)

	DescribeTable("accepts valid edge cases",
		func(path string, value any) {
			u := withField(path, value)
			Expect(k8sClient.Create(ctx, u)).To(Succeed())
			expectGoValidation(u, "spec."+path, true)
		},
		Entry("one shard", "shards", int64(1)),
		Entry("256 shards", "shards", int64(256)),
		Entry("window 0", "window", "0"),
		Entry("window 0s", "window", "0s"),
		Entry("window of 1m", "window", "1m"),
		Entry("window of 60s", "window", "60s"),
		Entry("window of a year", "window", "8760h"),
		Entry("window of a year in minutes", "window", "525600m"),
		Entry("fractional window", "window", "1.5h"),
		Entry("compound window", "window", "36h30m"),
		Entry("verifyInterval 0", "verifyInterval", "0s"),
		Entry("verifyInterval of 10s", "verifyInterval", "10s"),
		Entry("verifyInterval of a year", "verifyInterval", "8760h"),
		Entry("verifyWalkRate 0 (unpaced)", "verifyWalkRate", int64(0)),
		Entry("verifyWalkRate of 1", "verifyWalkRate", int64(1)),
		Entry("verifyWalkRate at the maximum", "verifyWalkRate", int64(rqv1.MaxVerifyWalkRate)),
		Entry("procs 0 (the Go runtime's choice)", "procs", int64(0)),
		Entry("procs of 1", "procs", int64(1)),
		Entry("procs at the maximum", "procs", int64(rqv1.MaxProcs)),
		Entry("logging json", "logging.format", "json"),
		Entry("logging text", "logging.format", "text"),
		Entry("logging level debug", "logging.level", "debug"),
		Entry("logging level 4", "logging.level", "4"),
		Entry("leaseDuration of 1s", "leaseDuration", "1s"),
		Entry("leaseDuration of 1000ms", "leaseDuration", "1000ms"),
		Entry("leaseDuration of 24h", "leaseDuration", "24h"),
		Entry("maxLeaseDuration equal to the default leaseDuration", "maxLeaseDuration", "5m"),
		Entry("maxLeaseDuration of 24h", "maxLeaseDuration", "24h"),
		Entry("urgentMaxShare 0", "priority.urgentMaxShare", "0"),
		Entry("urgentMaxShare 1", "priority.urgentMaxShare", "1"),
		Entry("submittedBoost below 1", "priority.submittedBoost", "0.5"),
		Entry("floors summing to exactly 1", "priority.floors", floors(floor("1h", "submitted", "0.1"), floor("1h", "discovered", "0.2"), floor("96h", "discovered", "0.7"))),
		Entry("one floor of 1", "priority.floors", floors(floor("24h", "submitted", "1"))),
		Entry("floor cadence of 1ms", "priority.floors", floors(floor("1ms", "submitted", "0.1"))),
		Entry("floor cadence of 1.5s", "priority.floors", floors(floor("1.5s", "submitted", "0.1"))),
		Entry("floor cadence of 10 years", "priority.floors", floors(floor("87600h", "submitted", "0.1"))),
		Entry("reschedule AfterRender", "priority.reschedule", "AfterRender"),
		Entry("reschedule KeepPhase", "priority.reschedule", "KeepPhase"),
		Entry("reschedule Adaptive", "priority.reschedule", "Adaptive"),
		Entry("tls OperatorIssued", "tls.mode", "OperatorIssued"),
		Entry("tls Disabled", "tls.mode", "Disabled"),
		Entry("tls Provided with a Secret", "tls", map[string]any{"mode": "Provided", "secretName": "web.shard-tls"}),
		Entry("store secret name with dots", "store.secretRef.name", "pg.main.example"),
		Entry("store secret name of 253 characters", "store.secretRef.name", strings.Repeat("p", 253)),
		Entry("store secret key with dots, dashes and underscores", "store.secretRef.key", "DSN_v2.main-db"),
		Entry("image by digest", "image", "registry.example:5000/team/renderqueue@sha256:"+strings.Repeat("a", 64)),
	)

	DescribeTable("accepts names its children can carry",
		func(name string, shards int64) {
			u := withField("shards", shards)
			unstructured.RemoveNestedField(u.Object, "metadata", "generateName")
			u.SetName(name)
			Expect(k8sClient.Create(ctx, u)).To(Succeed())
			expectGoValidation(u, "metadata.name", true)
		},
		Entry("one letter", "w", int64(1)),
		Entry("53 characters", "w"+strings.Repeat("-9", 26), int64(1)),
		Entry("53 characters and 256 shards (shard 255's Pod name has 63)", strings.Repeat("w", 53), int64(256)),
	)

	// The shard Pod fields: a RenderQueue the API server admits must give Pods it admits too.
	DescribeTable("rejects invalid shard Pod fields with a message naming the field",
		func(path string, value any, field, message string) {
			u := withField(path, value)
			err := k8sClient.Create(ctx, u)
			Expect(err).To(HaveOccurred(), "spec.%s = %v was accepted", path, value)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "not an Invalid error: %v", err)
			Expect(err.Error()).To(ContainSubstring(field))
			Expect(err.Error()).To(ContainSubstring(message))
			rejected.Add(1)
			expectGoValidation(u, field, false)
		},
		Entry("label key with a space", "podLabels", map[string]any{"cost center": "42"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label key name of 64 characters", "podLabels", map[string]any{strings.Repeat("k", 64): "v"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label key with an upper-case prefix", "podLabels", map[string]any{"Example.com/team": "v"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label key with an empty name", "podLabels", map[string]any{"example.com/": "v"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label key prefix of 254 characters", "podLabels", map[string]any{strings.Repeat("a", 254) + "/team": "v"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label value with a space", "podLabels", map[string]any{"team": "render farm"},
			"spec.podLabels[team]", "podLabels values must be label values"),
		Entry("label value of 64 characters", "podLabels", map[string]any{"team": strings.Repeat("v", 64)},
			"spec.podLabels.team", "Too long"),
		Entry("label value ending in a dash", "podLabels", map[string]any{"team": "render-"},
			"spec.podLabels[team]", "podLabels values must be label values"),
		Entry("the queue label", "podLabels", map[string]any{"renderqueue.dev/queue": "other"},
			"spec.podLabels", "podLabels must not set the operator's own labels"),
		Entry("the shard label", "podLabels", map[string]any{"renderqueue.dev/shard": "x"},
			"spec.podLabels", "podLabels must not set the operator's own labels"),
		Entry("the component label", "podLabels", map[string]any{"app.kubernetes.io/component": "web"},
			"spec.podLabels", "podLabels must not set the operator's own labels"),
		Entry("the managed-by label", "podLabels", map[string]any{"app.kubernetes.io/managed-by": "helm"},
			"spec.podLabels", "podLabels must not set the operator's own labels"),
		Entry("65 labels", "podLabels", manyStrings(65, ""),
			"spec.podLabels", "must have at most 64 items"),
		Entry("annotation key with a space", "podAnnotations", map[string]any{"my note": "x"},
			"spec.podAnnotations", "podAnnotations keys must be annotation keys"),
		Entry("the template hash annotation", "podAnnotations", map[string]any{"renderqueue.dev/pod-template-hash": "x"},
			"spec.podAnnotations", "podAnnotations must not set the operator's own annotations"),
		Entry("annotations over 255 KiB", "podAnnotations", map[string]any{"a": strings.Repeat("x", 200<<10), "b": strings.Repeat("y", 56<<10)},
			"spec.podAnnotations", "podAnnotations must be at most 255 KiB in all"),
		Entry("65 annotations", "podAnnotations", manyStrings(65, "x"),
			"spec.podAnnotations", "must have at most 64 items"),
		Entry("priorityClassName with a space", "priorityClassName", "high priority",
			"spec.priorityClassName", "priorityClassName must be a PriorityClass name"),
		Entry("upper-case priorityClassName", "priorityClassName", "High",
			"spec.priorityClassName", "priorityClassName must be a PriorityClass name"),
		Entry("priorityClassName of 254 characters", "priorityClassName", strings.Repeat("p", 254),
			"spec.priorityClassName", "Too long"),
		Entry("empty imagePullSecrets name", "imagePullSecrets", []any{map[string]any{"name": ""}},
			"spec.imagePullSecrets[0].name", "imagePullSecrets names must be Secret names"),
		Entry("imagePullSecrets name with a slash", "imagePullSecrets", []any{map[string]any{"name": "ns/regcred"}},
			"spec.imagePullSecrets[0].name", "imagePullSecrets names must be Secret names"),
		Entry("imagePullSecrets entry without name", "imagePullSecrets", []any{map[string]any{}},
			"spec.imagePullSecrets[0].name", "Required value"),
		Entry("imagePullSecrets name twice", "imagePullSecrets", []any{map[string]any{"name": "regcred"}, map[string]any{"name": "regcred"}},
			"spec.imagePullSecrets[1]", "Duplicate value"),
		Entry("17 imagePullSecrets", "imagePullSecrets", manySecrets(17),
			"spec.imagePullSecrets", "must have at most 16 items"),
		Entry("spread constraint with maxSkew 0", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"maxSkew": int64(0)})},
			"spec.topologySpreadConstraints[0].maxSkew", "should be greater than or equal to 1"),
		Entry("spread constraint with an unknown whenUnsatisfiable", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "Sometimes", nil)},
			"spec.topologySpreadConstraints[0].whenUnsatisfiable", `supported values: "DoNotSchedule", "ScheduleAnyway"`),
		Entry("spread constraint with an empty topologyKey", "topologySpreadConstraints",
			[]any{spread("", "DoNotSchedule", nil)},
			"spec.topologySpreadConstraints[0].topologyKey", "topologySpreadConstraints topologyKey must be a node label key"),
		Entry("spread constraint with a topologyKey with a space", "topologySpreadConstraints",
			[]any{spread("zone name", "DoNotSchedule", nil)},
			"spec.topologySpreadConstraints[0].topologyKey", "topologySpreadConstraints topologyKey must be a node label key"),
		Entry("spread constraint without topologyKey", "topologySpreadConstraints",
			[]any{map[string]any{"maxSkew": int64(1), "whenUnsatisfiable": "DoNotSchedule"}},
			"spec.topologySpreadConstraints[0].topologyKey", "Required value"),
		Entry("spread constraint without whenUnsatisfiable", "topologySpreadConstraints",
			[]any{map[string]any{"maxSkew": int64(1), "topologyKey": "kubernetes.io/hostname"}},
			"spec.topologySpreadConstraints[0].whenUnsatisfiable", "Required value"),
		Entry("spread constraint with minDomains 0", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"minDomains": int64(0)})},
			"spec.topologySpreadConstraints[0].minDomains", "should be greater than or equal to 1"),
		Entry("spread constraint with minDomains and ScheduleAnyway", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "ScheduleAnyway", map[string]any{"minDomains": int64(3)})},
			"spec.topologySpreadConstraints[0]", "topologySpreadConstraints minDomains is only allowed with whenUnsatisfiable DoNotSchedule"),
		Entry("spread constraint with an unknown nodeTaintsPolicy", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"nodeTaintsPolicy": "Always"})},
			"spec.topologySpreadConstraints[0].nodeTaintsPolicy", `supported values: "Honor", "Ignore"`),
		Entry("spread constraint with an unknown nodeAffinityPolicy", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"nodeAffinityPolicy": "Never"})},
			"spec.topologySpreadConstraints[0].nodeAffinityPolicy", `supported values: "Honor", "Ignore"`),
		Entry("spread constraint matching on the queue label", "topologySpreadConstraints",
			[]any{spread("kubernetes.io/hostname", "DoNotSchedule", map[string]any{"matchLabelKeys": []any{"renderqueue.dev/queue"}})},
			"spec.topologySpreadConstraints[0].matchLabelKeys", "matchLabelKeys must not name the shard selector's own keys"),
		Entry("spread constraint matching on a malformed key", "topologySpreadConstraints",
			[]any{spread("kubernetes.io/hostname", "DoNotSchedule", map[string]any{"matchLabelKeys": []any{"team name"}})},
			"spec.topologySpreadConstraints[0].matchLabelKeys", "matchLabelKeys must be label keys"),
		Entry("two spread constraints on one key and action", "topologySpreadConstraints",
			[]any{spread("kubernetes.io/hostname", "DoNotSchedule", nil), spread("kubernetes.io/hostname", "DoNotSchedule", map[string]any{"maxSkew": int64(2)})},
			"spec.topologySpreadConstraints[1]", "Duplicate value"),
		Entry("9 spread constraints", "topologySpreadConstraints", manySpreads(9),
			"spec.topologySpreadConstraints", "must have at most 8 items"),
	)

	DescribeTable("accepts valid shard Pod fields",
		func(path string, value any) {
			u := withField(path, value)
			Expect(k8sClient.Create(ctx, u)).To(Succeed())
			expectGoValidation(u, "spec."+path, true)
		},
		Entry("labels with and without prefix, an empty value", "podLabels",
			map[string]any{"team": "render", "example.com/cost-center": "42", "canary": "", "app.kubernetes.io/part-of": "prerender"}),
		Entry("a label key of 63 characters under a 253-character prefix", "podLabels",
			map[string]any{strings.Repeat("a", 253) + "/" + strings.Repeat("k", 63): strings.Repeat("v", 63)}),
		Entry("64 labels", "podLabels", manyStrings(64, "")),
		Entry("annotations with any value", "podAnnotations",
			map[string]any{"sidecar.istio.io/inject": "false", "example.com/config": `{"a": [1, 2], "b": "x y"}`, "note": ""}),
		Entry("255 KiB of annotations", "podAnnotations", map[string]any{"a": strings.Repeat("x", 255<<10-1)}),
		Entry("a priorityClassName", "priorityClassName", "queue-critical.example"),
		Entry("two imagePullSecrets", "imagePullSecrets", []any{map[string]any{"name": "regcred"}, map[string]any{"name": "mirror.example"}}),
		Entry("16 imagePullSecrets", "imagePullSecrets", manySecrets(16)),
		Entry("spread over zones and nodes", "topologySpreadConstraints", []any{
			spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"minDomains": int64(3), "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Ignore"}),
			spread("kubernetes.io/hostname", "ScheduleAnyway", map[string]any{"maxSkew": int64(2), "matchLabelKeys": []any{"team"}}),
			spread("kubernetes.io/hostname", "DoNotSchedule", nil),
		}),
		Entry("8 spread constraints", "topologySpreadConstraints", manySpreads(8)),
	)

	It("has no labelSelector in a spread constraint: kubectl's strict field validation refuses it", func() {
		u := withField("topologySpreadConstraints", []any{spread("topology.kubernetes.io/zone", "DoNotSchedule",
			map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"app": "web"}}})})
		err := k8sClient.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict))
		Expect(err).To(HaveOccurred(), "a labelSelector was accepted")
		Expect(err.Error()).To(ContainSubstring(`unknown field "spec.topologySpreadConstraints[0].labelSelector"`))
	})

	It("accepts verifyInterval larger than window/3 (the keeper clamps it)", func() {
		u := withField("window", "3h")
		Expect(unstructured.SetNestedField(u.Object, "2h", "spec", "verifyInterval")).To(Succeed())
		Expect(k8sClient.Create(ctx, u)).To(Succeed())
		var rq rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), &rq)).To(Succeed())
		Expect(rq.Spec.WindowDuration()).To(Equal(3 * time.Hour))
		Expect(rq.Spec.VerifyIntervalDuration()).To(Equal(2 * time.Hour))
	})

	It("applies the defaults", func() {
		u := minimal()
		Expect(k8sClient.Create(ctx, u)).To(Succeed())
		var rq rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), &rq)).To(Succeed())
		Expect(rq.Spec.Shards).To(Equal(int32(rqv1.DefaultShards)))
		Expect(rq.Spec.Window).NotTo(BeNil())
		Expect(rq.Spec.Window.Duration).To(BeZero())
		Expect(rq.Spec.VerifyInterval).NotTo(BeNil())
		Expect(rq.Spec.VerifyInterval.Duration).To(Equal(rqv1.DefaultVerifyInterval))
		Expect(rq.Spec.VerifyWalkRate).To(HaveValue(BeEquivalentTo(rqv1.DefaultVerifyWalkRate)))
		Expect(rq.Spec.VerifyWalkRateValue()).To(Equal(rqv1.DefaultVerifyWalkRate))
		Expect(rq.Spec.LeaseDuration).NotTo(BeNil())
		Expect(rq.Spec.LeaseDuration.Duration).To(Equal(rqv1.DefaultLeaseDuration))
		Expect(rq.Spec.Priority.SubmittedBoost).To(Equal(rqv1.DefaultSubmittedBoost))
		Expect(rq.Spec.Priority.UrgentMaxShare).To(Equal(rqv1.DefaultUrgentMaxShare))
		Expect(rq.Spec.Store.SecretRef.Key).To(Equal(rqv1.DefaultSecretKey))
		Expect(rq.Spec.Image).To(BeEmpty(), "the image defaults at run time to the operator's own")
		Expect(rq.Spec.Priority.SubmittedBoostValue()).To(Equal(2.0))
		Expect(rq.Spec.Priority.UrgentMaxShareValue()).To(Equal(0.2))
		Expect(rq.Spec.Priority.Reschedule).To(Equal(rqv1.DefaultReschedule))
		Expect(rq.Spec.Priority.Reschedule).To(Equal("Adaptive"), "the CRD's default is the API's")
		Expect(rq.Spec.Priority.Floors).To(BeEmpty())
	})

	It("keeps an explicit reschedule, the old default included", func() {
		for _, p := range []string{"KeepPhase", "AfterRender", "Adaptive"} {
			u := withField("priority.reschedule", p)
			Expect(k8sClient.Create(ctx, u)).To(Succeed())
			var rq rqv1.RenderQueue
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), &rq)).To(Succeed())
			Expect(rq.Spec.Priority.Reschedule).To(Equal(p))
			Expect(k8sClient.Delete(ctx, u)).To(Succeed())
		}
	})

	It("keeps the defaults of a partly given priority", func() {
		u := withField("priority.submittedBoost", "3")
		Expect(k8sClient.Create(ctx, u)).To(Succeed())
		var rq rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), &rq)).To(Succeed())
		Expect(rq.Spec.Priority.SubmittedBoost).To(Equal("3"))
		Expect(rq.Spec.Priority.UrgentMaxShare).To(Equal(rqv1.DefaultUrgentMaxShare))
	})

	It("accepts the sample", func() {
		data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "renderqueue_v1alpha1_renderqueue.yaml"))
		Expect(err).NotTo(HaveOccurred())
		// the API server's strict field validation, as kubectl applies it, catches unknown fields
		// (a client-side strict decode cannot: RenderQueue decodes itself, see UnmarshalJSON)
		u := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal(data, &u.Object)).To(Succeed())
		u.SetNamespace(ns)
		Expect(k8sClient.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict))).To(Succeed())
		var rq rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), &rq)).To(Succeed())
		Expect(rq.Spec.Shards).To(Equal(int32(3)))
		Expect(rq.Spec.WindowDuration()).To(Equal(24 * time.Hour))
	})
})

var _ = Describe("RenderQueue subresources", func() {
	var rq *rqv1.RenderQueue

	BeforeEach(func() {
		rq = &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "scaled-", Namespace: ns},
			Spec: rqv1.RenderQueueSpec{
				Shards: 3,
				Window: &metav1.Duration{Duration: 24 * time.Hour},
				Store:  rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "renderqueue-db"}},
			},
		}
		Expect(k8sClient.Create(ctx, rq)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, rq))).To(Succeed()) })

		rq.Status = rqv1.RenderQueueStatus{
			ObservedGeneration: rq.Generation,
			CurrentShards:      3,
			ReadyShards:        2,
			Due:                4211,
			DueExact:           false,
			Selector:           rqv1.LabelQueue + "=" + rq.Name,
		}
		meta.SetStatusCondition(&rq.Status.Conditions, metav1.Condition{
			Type: rqv1.ConditionEdgeHealthy, Status: metav1.ConditionFalse, Reason: rqv1.ReasonEdgeLagging,
			Message: rq.ShardName(1) + " edge is 90s behind now", ObservedGeneration: rq.Generation,
		})
		meta.SetStatusCondition(&rq.Status.Conditions, metav1.Condition{
			Type: rqv1.ConditionReady, Status: metav1.ConditionTrue, Reason: rqv1.ReasonAllShardsReady,
			Message: "3 of 3 shards ready", ObservedGeneration: rq.Generation,
		})
		// the spec refused: the shards run on, healthy, but the change asked for is not applied
		meta.SetStatusCondition(&rq.Status.Conditions, metav1.Condition{
			Type: rqv1.ConditionReconciled, Status: metav1.ConditionFalse, Reason: rqv1.ReasonImageNotAllowed,
			Message: `spec.image "evil.example/miner:latest" is not among the images the operator runs`, ObservedGeneration: rq.Generation,
		})
		Expect(k8sClient.Status().Update(ctx, rq)).To(Succeed())
	})

	It("keeps status out of spec updates and spec out of status updates", func() {
		var got rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(rq), &got)).To(Succeed())
		Expect(got.Status.Due).To(Equal(int64(4211)))
		Expect(got.Spec.Shards).To(Equal(int32(3)))
		Expect(got.Spec.LeaseDuration).NotTo(BeNil(), "a Go client leaving leaseDuration unset gets the default")
		Expect(got.Spec.LeaseDuration.Duration).To(Equal(rqv1.DefaultLeaseDuration))

		got.Status.Due = 1
		got.Spec.Shards = 5
		Expect(k8sClient.Update(ctx, &got)).To(Succeed())
		Expect(got.Status.Due).To(Equal(int64(4211)), "a spec update must not write status")
		Expect(got.Spec.Shards).To(Equal(int32(5)))
	})

	It("serves the scale subresource over spec.shards, status.currentShards and status.selector", func() {
		scale := &autoscalingv1.Scale{}
		Expect(k8sClient.SubResource("scale").Get(ctx, rq, scale)).To(Succeed())
		Expect(scale.Spec.Replicas).To(Equal(int32(3)))
		Expect(scale.Status.Replicas).To(Equal(int32(3)))
		Expect(scale.Status.Selector).To(Equal(rqv1.LabelQueue + "=" + rq.Name))

		scale.Spec.Replicas = 4
		Expect(k8sClient.SubResource("scale").Update(ctx, rq, client.WithSubResourceBody(scale))).To(Succeed())
		var got rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(rq), &got)).To(Succeed())
		Expect(got.Spec.Shards).To(Equal(int32(4)))
		Expect(got.Generation).To(BeNumerically(">", rq.Generation))
	})

	It("validates shards set through the scale subresource", func() {
		for _, replicas := range []int32{0, 257} {
			scale := &autoscalingv1.Scale{}
			Expect(k8sClient.SubResource("scale").Get(ctx, rq, scale)).To(Succeed())
			scale.Spec.Replicas = replicas
			err := k8sClient.SubResource("scale").Update(ctx, rq, client.WithSubResourceBody(scale))
			Expect(err).To(HaveOccurred(), "scaling to %d was accepted", replicas)
			Expect(err.Error()).To(ContainSubstring("shards must be between 1 and 256"))
		}
		var got rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(rq), &got)).To(Succeed())
		Expect(got.Spec.Shards).To(Equal(int32(3)))
	})

	It("shows shards, Ready and its reason, the Reconciled reason, due, exact and edge health in kubectl get", func() {
		user, err := testEnv.AddUser(envtest.User{Name: "viewer", Groups: []string{"system:masters"}}, nil)
		Expect(err).NotTo(HaveOccurred())
		kubectl, err := user.Kubectl()
		Expect(err).NotTo(HaveOccurred())
		get := func(args ...string) []string {
			stdout, stderr, err := kubectl.Run(append([]string{"get", "rq", rq.Name, "--namespace", ns}, args...)...)
			errText, _ := io.ReadAll(stderr)
			Expect(err).NotTo(HaveOccurred(), "kubectl get: %s", errText)
			out, _ := io.ReadAll(stdout)
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			Expect(lines).To(HaveLen(2), "kubectl get printed:\n%s", out)
			GinkgoWriter.Printf("kubectl get rq %s:\n%s", strings.Join(args, " "), out)
			return lines
		}
		lines := get()
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "SHARDS", "READY", "REASON", "RECONCILED", "DUE", "EXACT", "EDGE", "AGE"}))
		// a refused spec is not shown as healthy: its Reconciled reason is a column
		Expect(strings.Fields(lines[1])[:8]).To(Equal([]string{rq.Name, "3", "True", "AllShardsReady", "ImageNotAllowed", "4211", "false", "False"}))
		wide := get("-o", "wide")
		Expect(strings.Fields(wide[0])).To(Equal([]string{"NAME", "SHARDS", "READY", "REASON", "RECONCILED", "DUE", "EXACT", "EDGE", "READYSHARDS", "AGE"}))
		Expect(strings.Fields(wide[1])[8]).To(Equal("2"))
	})
})

// manyStrings is a string map of n distinct keys, each with value v.
func manyStrings(n int, v string) map[string]any {
	m := map[string]any{}
	for i := range n {
		m[fmt.Sprintf("key-%d", i)] = v
	}
	return m
}

// manySecrets is a list of n imagePullSecrets entries with distinct names.
func manySecrets(n int) []any {
	var out []any
	for i := range n {
		out = append(out, map[string]any{"name": fmt.Sprintf("regcred-%d", i)})
	}
	return out
}

// spread is a topology spread constraint with maxSkew 1, and extra fields set over it.
func spread(key, when string, extra map[string]any) map[string]any {
	c := map[string]any{"maxSkew": int64(1), "topologyKey": key, "whenUnsatisfiable": when}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// manySpreads is a list of n topology spread constraints on distinct keys.
func manySpreads(n int) []any {
	var out []any
	for i := range n {
		out = append(out, spread(fmt.Sprintf("example.com/zone-%d", i), "DoNotSchedule", nil))
	}
	return out
}
