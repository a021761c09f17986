package main

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
)

// TestKeeperPolicyFlags: bad floors, reschedule policies and walk rates stop the standalone keeper
// before it connects to anything.
func TestKeeperPolicyFlags(t *testing.T) {
	base := []string{"keeper", "--dsn", "host=/nonexistent", "--insecure-no-auth"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--floor", "96h/crawler=0.1"}, `unknown source "crawler"`},
		{[]string{"--floor", "96h/discovered"}, "want CADENCE/SOURCE=SHARE"},
		{[]string{"--floor", "96h/discovered=0"}, "share must be within (0, 1]"},
		{[]string{"--floor", "1h/submitted=0.6", "--floor", "24h/submitted=0.6"}, "must not sum past 1"},
		{[]string{"--floor", "1h/submitted=0.1,60m/submitted=0.1"}, "more than one floor"},
		{[]string{"--reschedule", "phase"}, "unknown reschedule policy"},
		{[]string{"--verify-walk-rate", "-1"}, "--verify-walk-rate -1 is negative"},
		{[]string{"--procs", "-1"}, "--procs -1 is negative"},
	} {
		var out, errb bytes.Buffer
		if code := run(append(append([]string{}, base...), c.args...), &out, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("keeper %v: code %d, stderr %q, want %q", c.args, code, errb.String(), c.want)
		}
		if strings.Contains(errb.String(), "opening the store") {
			t.Errorf("keeper %v: reached the store before rejecting the policy", c.args)
		}
	}
}

// TestKeeperHTTPLimitFlags: negative HTTP limits stop the keeper before it connects to anything.
func TestKeeperHTTPLimitFlags(t *testing.T) {
	base := []string{"keeper", "--dsn", "host=/nonexistent", "--insecure-no-auth"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--http-read-timeout", "-1s"}, "read timeout -1s is negative"},
		{[]string{"--http-idle-timeout", "-5s"}, "idle timeout -5s is negative"},
		{[]string{"--max-in-flight", "-1"}, "max in-flight requests -1 is negative"},
		{[]string{"--max-in-flight-bytes", "-1"}, "max in-flight bytes -1 is negative"},
	} {
		var out, errb bytes.Buffer
		if code := run(append(append([]string{}, base...), c.args...), &out, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("keeper %v: code %d, stderr %q, want %q", c.args, code, errb.String(), c.want)
		}
	}
}

// TestKeeperProcs: the keeper's GOMAXPROCS comes from --procs when given, else from $GOMAXPROCS
// when set, else defaultKeeperProcs.
func TestKeeperProcs(t *testing.T) {
	for _, c := range []struct {
		name      string
		flagSet   bool   // --procs given
		flagValue int    // its value (the default when not given)
		env       string // $GOMAXPROCS
		wantSet   int    // what the keeper sets (0: the runtime's value stands)
		wantFrom  string
	}{
		{name: "nothing given", flagValue: defaultKeeperProcs, wantSet: 1, wantFrom: "the keeper's default"},
		{name: "the environment", flagValue: defaultKeeperProcs, env: "4", wantSet: 0, wantFrom: "$GOMAXPROCS"},
		{name: "the flag", flagSet: true, flagValue: 3, wantSet: 3, wantFrom: "--procs"},
		{name: "the flag over the environment", flagSet: true, flagValue: 2, env: "4", wantSet: 2, wantFrom: "--procs"},
		{name: "0: the runtime's choice", flagSet: true, flagValue: 0, wantSet: 0, wantFrom: "the Go runtime (--procs 0)"},
		{name: "0 with the environment", flagSet: true, flagValue: 0, env: "4", wantSet: 0, wantFrom: "the Go runtime (--procs 0)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			set, from := keeperProcs(c.flagSet, c.flagValue, c.env)
			if set != c.wantSet || from != c.wantFrom {
				t.Errorf("keeperProcs(%v, %d, %q) = %d, %q; want %d, %q", c.flagSet, c.flagValue, c.env, set, from, c.wantSet, c.wantFrom)
			}
		})
	}
}

// TestShardPodArgsAreKeeperFlags: the arguments the operator gives a shard's keeper container
// (controllers/specs, with every optional flag it may add) are flags `renderqueue keeper` takes:
// it parses them and stops at the missing DSN, not at a flag.
func TestShardPodArgsAreKeeperFlags(t *testing.T) {
	t.Setenv("RENDERQUEUE_DSN", "")
	for _, c := range []struct {
		name string
		edit func(*rqv1.RenderQueueSpec)
	}{
		{"defaults", func(*rqv1.RenderQueueSpec) {}},
		{"procs and TLS", func(s *rqv1.RenderQueueSpec) {
			s.Procs = ptr.To[int32](2)
			s.TLS.Mode = rqv1.ShardTLSOperatorIssued
		}},
	} {
		rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "prod"},
			Spec: rqv1.RenderQueueSpec{Shards: 1, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg"}}}}
		c.edit(&rq.Spec)
		pod := specs.ShardPod(rq, "img", "web-shard-0", specs.PodTemplateHash(rq, "img"))
		args := pod.Spec.Containers[0].Args
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code == 0 || !strings.Contains(errb.String(), "--dsn (or RENDERQUEUE_DSN) is required") {
			t.Errorf("%s: renderqueue %q: code %d, stderr %q, want it to stop at the missing DSN", c.name, args, code, errb.String())
		}
	}
}
