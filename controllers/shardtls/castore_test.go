package shardtls_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/renderqueue/renderqueue/controllers/shardtls"
	"github.com/renderqueue/renderqueue/pkg/certs"
)

func TestCAStore(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	k := fake.NewClientBuilder().WithScheme(scheme).Build()
	now := t0
	key := types.NamespacedName{Namespace: "renderqueue-system", Name: "renderqueue-shard-ca"}
	store := &shardtls.CAStore{Reader: k, Writer: k, Secret: key, Now: func() time.Time { return now }, Log: logr.Discard()}
	ctx := context.Background()

	first, err := store.CA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	if err := k.Get(ctx, key, &sec); err != nil {
		t.Fatalf("the CA Secret was not created: %v", err)
	}
	if loaded, err := certs.LoadCA(sec.Data); err != nil || !loaded.Cert.Equal(first.Cert) {
		t.Fatalf("the Secret does not hold the CA returned (%v)", err)
	}

	// another operator process reads the same CA
	other := &shardtls.CAStore{Reader: k, Writer: k, Secret: key, Now: func() time.Time { return now }, Log: logr.Discard()}
	if again, err := other.CA(ctx); err != nil || !again.Cert.Equal(first.Cert) {
		t.Fatalf("a second store made another CA (%v)", err)
	}

	// within a year of its end: renewed, the old CA kept in the bundle
	now = t0.Add(certs.CALifetime - 300*24*time.Hour)
	renewed, err := store.CA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if renewed.Cert.Equal(first.Cert) {
		t.Fatal("the CA was not renewed")
	}
	bundle, _ := certs.ParseCerts(renewed.Bundle)
	if len(bundle) != 2 || !bundle[1].Equal(first.Cert) {
		t.Errorf("renewed bundle of %d certificates, want the new CA and the old", len(bundle))
	}
	if err := k.Get(ctx, key, &sec); err != nil || string(sec.Data[certs.KeyCACert]) != string(renewed.Bundle) {
		t.Errorf("the renewal was not written (%v)", err)
	}

	// the other store, which held the old CA, re-reads once Refresh has passed
	if got, err := other.CA(ctx); err != nil || !got.Cert.Equal(renewed.Cert) {
		t.Errorf("the other store kept the old CA (%v)", err)
	}
}
