package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/certs"
)

// failingCA is a ShardCASource that cannot provide a CA (its Secret unreadable, say).
type failingCA struct{ err error }

func (f failingCA) CA(context.Context) (*certs.CA, error) { return nil, f.err }

// TestReconcileTLSBlockedWithoutCA: a RenderQueue asking for TLS while the operator has no shard
// CA, or cannot read it, is blocked with ShardTLSUnavailable (so no shard Pod is created or
// replaced without its certificate), its recorded status.tls is kept, and nothing is written: the
// reconciler has no client here, so any write would panic. With TLS disabled nothing blocks.
func TestReconcileTLSBlockedWithoutCA(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	recorded := &rqv1.ShardTLSStatus{SecretName: "web-shard-tls", NotAfter: metav1.Time{Time: now.Add(200 * 24 * time.Hour)}}
	queue := func(mode rqv1.ShardTLSMode) *rqv1.RenderQueue {
		rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Namespace: "render", Name: "web"}}
		rq.Spec.TLS.Mode = mode
		rq.Status.TLS = recorded
		return rq
	}
	for _, tc := range []struct {
		name string
		// ca is the reconciler's ShardCA (nil: the operator runs without --shard-ca-secret).
		ca ShardCASource
		// mode is the RenderQueue's spec.tls.mode.
		mode rqv1.ShardTLSMode
		// blocked: a ShardTLSUnavailable blocker is expected, its message containing want.
		blocked bool
		want    string
	}{
		{name: "no CA configured", ca: nil, mode: rqv1.ShardTLSOperatorIssued, blocked: true, want: "--shard-ca-secret is empty"},
		{name: "CA unreadable", ca: failingCA{errors.New("secrets \"renderqueue-shard-ca\" is forbidden")}, mode: rqv1.ShardTLSOperatorIssued,
			blocked: true, want: "is forbidden"},
		{name: "TLS disabled, no CA", ca: nil, mode: rqv1.ShardTLSDisabled},
		{name: "TLS disabled, CA unreadable", ca: failingCA{errors.New("unreadable")}, mode: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &RenderQueueReconciler{ShardCA: tc.ca}
			st, events, blocker, err := r.reconcileTLS(context.Background(), queue(tc.mode), true, now)
			if err != nil {
				t.Fatalf("reconcileTLS: %v", err)
			}
			if len(events) != 0 {
				t.Errorf("events = %v, want none", events)
			}
			if !tc.blocked {
				if blocker != nil || st.status != nil || st.bundle != nil {
					t.Fatalf("TLS disabled: got blocker %+v, state %+v; want nothing", blocker, st)
				}
				return
			}
			if blocker == nil || blocker.Reason != rqv1.ReasonShardTLSUnavailable {
				t.Fatalf("blocker = %+v, want reason %s", blocker, rqv1.ReasonShardTLSUnavailable)
			}
			if !strings.Contains(blocker.Message, tc.want) || !strings.Contains(blocker.Message, "no shard Pod is created or replaced") {
				t.Errorf("message %q does not say %q and that no shard Pod is created or replaced", blocker.Message, tc.want)
			}
			if st.status != recorded {
				t.Errorf("status.tls = %+v, want the recorded one kept", st.status)
			}
		})
	}
}
