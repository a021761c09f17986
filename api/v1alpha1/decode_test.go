package v1alpha1_test

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/utils/ptr"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// brokenList is a list as the API server sends it when one object was stored under an older,
// looser CRD: b's window overflows a Go duration.
const brokenList = `{"apiVersion":"renderqueue.dev/v1alpha1","kind":"RenderQueueList","metadata":{"resourceVersion":"7"},"items":[
 {"apiVersion":"renderqueue.dev/v1alpha1","kind":"RenderQueue","metadata":{"name":"a","namespace":"ns"},
  "spec":{"shards":2,"window":"24h","store":{"secretRef":{"name":"pg"}}}},
 {"apiVersion":"renderqueue.dev/v1alpha1","kind":"RenderQueue","metadata":{"name":"b","namespace":"ns","uid":"u-b","generation":4},
  "spec":{"shards":3,"window":"2562048h","leaseDuration":"5m","store":{"secretRef":{"name":"pg"}}},
  "status":{"due":5,"dueExact":true}},
 {"apiVersion":"renderqueue.dev/v1alpha1","kind":"RenderQueue","metadata":{"name":"c","namespace":"ns"},
  "spec":{"shards":1,"store":{"secretRef":{"name":"pg"}}}}]}`

// TestListDecodesAroundABrokenObject decodes a list with the codec client-go's informers use:
// the object whose spec does not decode must not fail the list (which would stop every consumer
// of the operator's cache), and must say which field is wrong.
func TestListDecodesAroundABrokenObject(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := rqv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	dec := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	obj, _, err := dec.Decode([]byte(brokenList), nil, &rqv1.RenderQueueList{})
	if err != nil {
		t.Fatalf("decoding the list: %v", err)
	}
	list := obj.(*rqv1.RenderQueueList)
	if len(list.Items) != 3 {
		t.Fatalf("decoded %d items, want 3", len(list.Items))
	}
	a, b, c := &list.Items[0], &list.Items[1], &list.Items[2]
	for _, rq := range []*rqv1.RenderQueue{a, c} {
		if err := rq.DecodeErr(); err != nil {
			t.Errorf("%s: DecodeErr = %v", rq.Name, err)
		}
		if err := rq.Validate(); err != nil {
			t.Errorf("%s: Validate = %v", rq.Name, err)
		}
	}
	if a.Spec.WindowDuration() != 24*time.Hour || a.Spec.Shards != 2 {
		t.Errorf("a decoded as %+v", a.Spec)
	}
	err = b.DecodeErr()
	if err == nil || !strings.Contains(err.Error(), `spec.window: time: invalid duration "2562048h"`) {
		t.Fatalf("b: DecodeErr = %v, want it to name spec.window and the value", err)
	}
	if verr := b.Validate(); verr == nil || verr.Error() != err.Error() {
		t.Errorf("b: Validate = %v, want the decode error", verr)
	}
	if b.Name != "b" || b.UID != "u-b" || b.Generation != 4 || b.Kind != "RenderQueue" {
		t.Errorf("b's metadata is lost: %+v %+v", b.TypeMeta, b.ObjectMeta)
	}
	if b.Spec.Shards != 3 || b.Spec.LeaseDurationValue() != 5*time.Minute || b.Spec.Store.SecretRef.Name != "pg" {
		t.Errorf("b's decodable spec fields are lost: %+v", b.Spec)
	}
	if b.Status.Due != 5 || !b.Status.DueExact {
		t.Errorf("b's status is lost: %+v", b.Status)
	}
	if cp := b.DeepCopy(); cp.DecodeErr() == nil {
		t.Error("DeepCopy drops the decode error")
	}

	// a watch event carries one object
	one, _, err := dec.Decode([]byte(`{"apiVersion":"renderqueue.dev/v1alpha1","kind":"RenderQueue","metadata":{"name":"d"},
		"spec":{"priority":{"floors":[{"cadence":"9999999999h","source":"submitted","share":"0.1"}]}}}`), nil, &rqv1.RenderQueue{})
	if err != nil {
		t.Fatalf("decoding one object: %v", err)
	}
	if err := one.(*rqv1.RenderQueue).DecodeErr(); err == nil || !strings.Contains(err.Error(), "spec.priority:") {
		t.Errorf("d: DecodeErr = %v, want it to name spec.priority", err)
	}

	// what is not a RenderQueue at all still fails
	if _, _, err := dec.Decode([]byte(`{"apiVersion":"renderqueue.dev/v1alpha1","kind":"RenderQueue","metadata":[]}`), nil, &rqv1.RenderQueue{}); err == nil {
		t.Error("an object whose metadata is not an object decoded")
	}
}

// TestValidateStoredObjects checks the Go mirror of the CRD's rules on objects that decode but
// were stored before the rules: each error names the field.
func TestValidateStoredObjects(t *testing.T) {
	d := func(v time.Duration) *metav1.Duration { return &metav1.Duration{Duration: v} }
	valid := func() *rqv1.RenderQueue {
		return &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"},
			Spec: rqv1.RenderQueueSpec{Shards: 3, Window: d(24 * time.Hour), VerifyInterval: d(time.Hour), LeaseDuration: d(5 * time.Minute),
				Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}}},
		}
	}
	if err := valid().Validate(); err != nil {
		t.Fatalf("the valid object: %v", err)
	}
	// stored before the API's rule of 53 characters, with children that can be named: still fine
	long := valid()
	long.Name, long.Spec.Shards = strings.Repeat("w", 55), 10
	if err := long.Validate(); err != nil {
		t.Errorf("a 55-character name with 10 shards (%s-shard-9 has 63 characters): %v", long.Name, err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*rqv1.RenderQueue)
		field string
	}{
		{"lease of 1ns", func(rq *rqv1.RenderQueue) { rq.Spec.LeaseDuration = d(time.Nanosecond) }, "spec.leaseDuration"},
		{"lease of 25h", func(rq *rqv1.RenderQueue) { rq.Spec.LeaseDuration = d(25 * time.Hour) }, "spec.leaseDuration"},
		{"window of 2ns", func(rq *rqv1.RenderQueue) { rq.Spec.Window = d(2) }, "spec.window"},
		{"verify interval of 1ms", func(rq *rqv1.RenderQueue) { rq.Spec.VerifyInterval = d(time.Millisecond) }, "spec.verifyInterval"},
		{"a negative walk rate", func(rq *rqv1.RenderQueue) { rq.Spec.VerifyWalkRate = ptr.To[int32](-1) }, "spec.verifyWalkRate"},
		{"a walk rate over the maximum", func(rq *rqv1.RenderQueue) {
			rq.Spec.VerifyWalkRate = ptr.To[int32](rqv1.MaxVerifyWalkRate + 1)
		}, "spec.verifyWalkRate"},
		{"negative procs", func(rq *rqv1.RenderQueue) { rq.Spec.Procs = ptr.To[int32](-1) }, "spec.procs"},
		{"procs over the maximum", func(rq *rqv1.RenderQueue) { rq.Spec.Procs = ptr.To[int32](rqv1.MaxProcs + 1) }, "spec.procs"},
		{"no shards", func(rq *rqv1.RenderQueue) { rq.Spec.Shards = 0 }, "spec.shards"},
		{"a name whose 12th shard Pod would have 64 characters", func(rq *rqv1.RenderQueue) {
			rq.Name, rq.Spec.Shards = strings.Repeat("w", 55), 12
		}, "shard Pod " + strings.Repeat("w", 55) + "-shard-11 would be 64 characters"},
		{"a name whose Service would have 64 characters", func(rq *rqv1.RenderQueue) { rq.Name = strings.Repeat("w", 57) }, "metadata.name"},
		{"a name with a dot", func(rq *rqv1.RenderQueue) { rq.Name = "web.prod" }, "metadata.name"},
		{"a store Secret in another namespace", func(rq *rqv1.RenderQueue) { rq.Spec.Store.SecretRef.Name = "other/pg" }, "spec.store.secretRef.name"},
		{"a store key '..'", func(rq *rqv1.RenderQueue) { rq.Spec.Store.SecretRef.Key = ".." }, "spec.store.secretRef.key"},
		{"a pull Secret with a space", func(rq *rqv1.RenderQueue) {
			rq.Spec.ImagePullSecrets = []rqv1.LocalSecretReference{{Name: "reg cred"}}
		}, "spec.imagePullSecrets[0].name"},
		{"an image with a space", func(rq *rqv1.RenderQueue) { rq.Spec.Image = "img :v1" }, "spec.image"},
		{"a TLS mode of none", func(rq *rqv1.RenderQueue) { rq.Spec.TLS.Mode = "None" }, "spec.tls.mode"},
		{"TLS Provided without a Secret", func(rq *rqv1.RenderQueue) { rq.Spec.TLS.Mode = rqv1.ShardTLSProvided }, "spec.tls.secretName"},
		{"a TLS Secret without Provided", func(rq *rqv1.RenderQueue) { rq.Spec.TLS.SecretName = "web-tls" }, "spec.tls.secretName"},
		{"a TLS Secret in another namespace", func(rq *rqv1.RenderQueue) {
			rq.Spec.TLS = rqv1.ShardTLS{Mode: rqv1.ShardTLSProvided, SecretName: "other/web-tls"}
		}, "spec.tls.secretName"},
		{"a floor cadence of 1500us", func(rq *rqv1.RenderQueue) {
			rq.Spec.Priority.Floors = []rqv1.Floor{{Cadence: metav1.Duration{Duration: 1500 * time.Microsecond}, Source: "submitted", Share: "0.1"}}
		}, "spec.priority.floors[0].cadence"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rq := valid()
			tc.edit(rq)
			err := rq.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Validate = %v, want an error naming %s", err, tc.field)
			}
		})
	}
}
