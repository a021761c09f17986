//go:build e2e

package e2e

// TestChaos's faults that only a real node makes possible: a keeper's network cut from
// PostgreSQL (iptables in its Pod's network namespace), the leading operator cut from a shard
// during a handoff, the kubelet and containerd restarted under running Pods, and a shard Pod
// evicted through the Eviction API.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/node"
)

// cutFor is how long a network cut lasts at least.
const cutFor = 30 * time.Second

// seenCutWithin bounds how long a shard cut from PostgreSQL may still be reported exact: its
// change-event connection is checked with a round trip after 5 s without an event
// (changes.Config.HealthInterval) that fails within 5 s more, and the operator polls the shards
// every 10 s (config/manager's --shard-poll-interval); a margin on top.
const seenCutWithin = 30 * time.Second

// iptablesIn adds rules (each an iptables argument list after -I CHAIN) in the network namespace
// of a Pod and returns the function that removes them again (idempotent; a Pod that is gone by
// then took its namespace, and the rules, with it).
func (ch *chaos) iptablesIn(t *testing.T, ns, pod string, rules [][]string) (undo func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range rules {
		if out, err := ch.e.c.Node.InPodNetwork(ctx, ns, pod, append([]string{"iptables", "-w", "-I"}, r...)...); err != nil {
			ch.e.fatalf(t, "iptables -I %s in %s/%s: %v\n%s", strings.Join(r, " "), ns, pod, err, out)
		}
	}
	done := false
	undo = func() {
		if done {
			return
		}
		done = true
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, r := range rules {
			if out, err := ch.e.c.Node.InPodNetwork(ctx, ns, pod, append([]string{"iptables", "-w", "-D"}, r...)...); err != nil {
				t.Logf("iptables -D %s in %s/%s: %v\n%s", strings.Join(r, " "), ns, pod, err, out)
			}
		}
	}
	t.Cleanup(undo)
	return undo
}

// shardNames are the names of the queue's shards now, sorted.
func (ch *chaos) shardNames() []string {
	var names []string
	for _, s := range ch.e.queue().Status.Shards {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	return names
}

// caseCutKeeperFromPostgres: spec.shards unchanged; one shard's Pod loses PostgreSQL for 30 s or
// more (every packet between it and the database dropped, as in a network partition). The shard
// must say it is inexact (a count it cannot keep is not exact) within seenCutWithin, and be exact
// again once the network is back; the samples and the final audit check that the count is true
// and nothing acknowledged is lost.
func (ch *chaos) caseCutKeeperFromPostgres(t *testing.T) string {
	shard := ch.shardNames()[0]
	port := ch.e.c.Postgres.Port()
	undo := ch.iptablesIn(t, namespace, shard, [][]string{
		{"OUTPUT", "-p", "tcp", "-d", node.NodeIP, "--dport", port, "-j", "DROP"},
		{"INPUT", "-p", "tcp", "-s", node.NodeIP, "--sport", port, "-j", "DROP"},
	})
	cut := time.Now()
	var inexactAfter time.Duration
	ch.e.eventually(t, seenCutWithin, 250*time.Millisecond, shard+" inexact while cut from PostgreSQL", func() (bool, string) {
		for _, s := range ch.e.queue().Status.Shards {
			if s.Name == shard {
				if !s.Exact {
					inexactAfter = time.Since(cut)
					return true, ""
				}
				return false, fmt.Sprintf("%s: exact, due %d, state %s", s.Name, s.Due, s.State)
			}
		}
		return false, shard + " not in status.shards"
	})
	t.Logf("%s cut from PostgreSQL (port %s): inexact in status after %s", shard, port, inexactAfter.Round(100*time.Millisecond))
	// the fault's length: the keeper lives without its database this long
	time.Sleep(time.Until(cut.Add(max(cutFor, inexactAfter+5*time.Second))))
	lasted := time.Since(cut)
	undo()
	st := ch.waitSettled(t, int(ch.e.queue().Spec.Shards))
	return fmt.Sprintf("%s inexact %s after the cut; cut for %s; exact again %s after (due %d)", shard,
		inexactAfter.Round(100*time.Millisecond), lasted.Round(100*time.Millisecond), (time.Since(cut) - lasted).Round(100*time.Millisecond), st.Due)
}

// caseCutOperatorFromShard: n→n±1; the leading operator's packets to a giving shard are reset
// while the handoff prepares, for 30 s; the handoff must wait (it cannot commit what it cannot
// confirm) and finish once the network is back.
func (ch *chaos) caseCutOperatorFromShard(t *testing.T) string {
	before := ch.e.queue()
	from := int(before.Spec.Shards)
	to := from + 1
	if from >= 6 {
		to = from - 1
	}
	_, leader := ch.leader(t)
	if leader == "" {
		ch.e.fatalf(t, "no operator holds the leader Lease")
	}
	// The shard that gives slots in either direction: the last of the current ones gives when
	// shrinking; when growing every current shard gives some, the first among them.
	names := ch.shardNames()
	giver := names[0]
	if to < from {
		giver = names[len(names)-1]
	}
	ip := ch.e.pod(t, namespace, giver).Status.PodIP
	undo := ch.iptablesIn(t, ch.opNS, leader, [][]string{
		{"OUTPUT", "-p", "tcp", "-d", ip, "-j", "REJECT", "--reject-with", "tcp-reset"},
	})
	cut := time.Now()
	ch.scale(to)
	st, preparing := ch.waitHandoff(t, before.Status.Membership.Epoch)
	time.Sleep(time.Until(cut.Add(cutFor)))
	stillPreparing := ch.e.queue().Status.Membership.HandoffInProgress()
	undo()
	st = ch.waitSettled(t, to)
	return fmt.Sprintf("leader %s cut from %s (%s) for 30 s; handoff to epoch %d seen preparing=%v, still in flight at the end of the cut=%v; settled %s after",
		leader, giver, ip, st.Membership.Epoch, preparing, stillPreparing, time.Since(cut.Add(cutFor)).Round(100*time.Millisecond))
}

// shardPIDs are the keeper processes' pids, by shard.
func (ch *chaos) shardPIDs(t *testing.T) map[string]int {
	pids := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range ch.shardNames() {
		pid, err := ch.e.c.Node.ContainerPID(ctx, namespace, s, "")
		if err != nil {
			ch.e.fatalf(t, "%v", err)
		}
		pids[s] = pid
	}
	return pids
}

// caseRestartKubelet: the kubelet is killed and started again; the Pods, and the keepers in them,
// run on (the same processes), and the queue stays settled.
func (ch *chaos) caseRestartKubelet(t *testing.T) string {
	return ch.restartNodePart(t, "kubelet", ch.e.c.Node.RestartKubelet)
}

// caseRestartContainerd: containerd is killed and started again; its shims keep the containers,
// and the keepers in them, running.
func (ch *chaos) caseRestartContainerd(t *testing.T) string {
	return ch.restartNodePart(t, "containerd", ch.e.c.Node.RestartContainerd)
}

func (ch *chaos) restartNodePart(t *testing.T, what string, restart func(context.Context) error) string {
	before := ch.shardPIDs(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := restart(ctx); err != nil {
		ch.e.fatalf(t, "restarting %s: %v", what, err)
	}
	took := time.Since(start)
	after := ch.shardPIDs(t)
	for s, pid := range before {
		if after[s] != pid {
			ch.e.fatalf(t, "restarting %s restarted %s's keeper (pid %d → %d)", what, s, pid, after[s])
		}
	}
	st := ch.waitSettled(t, int(ch.e.queue().Spec.Shards))
	return fmt.Sprintf("%s back in %s; %d keepers ran on (due %d)", what, took.Round(100*time.Millisecond), len(before), st.Due)
}

// caseEvictShard: a shard Pod is evicted through the Eviction API (as `kubectl drain` does); the
// operator makes it again and the queue settles exact.
func (ch *chaos) caseEvictShard(t *testing.T) string {
	names := ch.shardNames()
	shard := names[len(names)/2]
	old := ch.e.pod(t, namespace, shard)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := ch.e.c.Client.PolicyV1().Evictions(namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: shard, Namespace: namespace},
	})
	if err != nil {
		ch.e.fatalf(t, "evicting %s: %v", shard, err)
	}
	start := time.Now()
	ch.e.eventually(t, 2*time.Minute, 250*time.Millisecond, shard+" made again after its eviction", func() (bool, string) {
		p, err := ch.e.c.Client.CoreV1().Pods(namespace).Get(context.Background(), shard, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.UID != old.UID, "the evicted Pod is still there"
	})
	st := ch.waitSettled(t, int(ch.e.queue().Spec.Shards))
	return fmt.Sprintf("evicted %s; made again and settled in %s (due %d)", shard, time.Since(start).Round(100*time.Millisecond), st.Due)
}
