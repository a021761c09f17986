//go:build e2e

package e2e

// Steps for what goes wrong in a real install: the store Secret missing, and a DSN pointing at a
// closed port. They run after the main steps (the sample queue `web` at 4 shards, exact, the
// store Secret renderqueue-db holding e.c.Postgres.PodDSN) and leave the stack as they found it.

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/node"
)

const storeSecret = "renderqueue-db" // config/samples' store Secret

// stepMissingSecret deletes the store Secret and one shard Pod: the recreated Pod cannot start
// (its container waits in CreateContainerConfigError), and `kubectl describe renderqueue` names
// the missing Secret, from the Pod's container status. With the Secret back the shard starts and
// the queue is exact with the SQL count again.
func (e *env) stepMissingSecret(t *testing.T) {
	pod := queueName + "-shard-0"
	e.kubectl("-n", namespace, "delete", "secret", storeSecret)
	restored := false
	defer func() {
		if !restored {
			_, _ = e.c.Kubectl(context.Background(), nil, "-n", namespace, "create", "secret", "generic", storeSecret,
				"--from-literal=dsn="+e.c.Postgres.PodDSN)
		}
	}()
	e.kubectl("-n", namespace, "delete", "pod", pod, "--wait=true")
	t.Logf("deleted Secret %s and Pod %s", storeSecret, pod)

	var described string
	e.eventually(t, 90*time.Second, time.Second, "kubectl describe to name the missing Secret", func() (bool, string) {
		st := e.queue().Status
		var shard rqv1.ShardStatus
		for _, s := range st.Shards {
			if s.Name == pod {
				shard = s
			}
		}
		ready := meta.FindStatusCondition(st.Conditions, rqv1.ConditionReady)
		if shard.State != "Failing" || !strings.Contains(shard.Error, "CreateContainerConfigError") ||
			!strings.Contains(shard.Error, `"`+storeSecret+`" not found`) ||
			ready == nil || !strings.Contains(ready.Message, pod+" cannot run: CreateContainerConfigError") {
			return false, fmt.Sprintf("shard %s: %s %q; %s", pod, shard.State, shard.Error, conds(st.Conditions))
		}
		described = e.kubectl("describe", "renderqueue", queueName)
		for _, want := range []string{"CreateContainerConfigError", `"` + storeSecret + `" not found`, "ShardFailing"} {
			if !strings.Contains(described, want) {
				return false, fmt.Sprintf("kubectl describe does not show %q yet", want)
			}
		}
		return true, ""
	})
	t.Logf("kubectl describe renderqueue %s (store Secret missing):\n%s", queueName, described)

	e.kubectl("-n", namespace, "create", "secret", "generic", storeSecret, "--from-literal=dsn="+e.c.Postgres.PodDSN)
	restored = true
	t.Logf("recreated Secret %s", storeSecret)
	e.exactAndTrue(2*time.Minute, 4)
}

// stepBadDSN applies a second RenderQueue whose store Secret points at a closed port (with a
// password the server never asks for): its shard starts, serves, and `kubectl describe` shows
// the keeper's database error — host and port, never the password. Then PostgreSQL appears on
// that port (a TCP proxy to the test server): the keeper's retries connect, it loads, and the
// queue is exact with the SQL count. The queue and its Secret are deleted at the end.
func (e *env) stepBadDSN(t *testing.T) {
	const name, secret, password = "broken", "renderqueue-db-broken", "e2e-not-the-password"
	cfg, err := pgconn.ParseConfig(e.c.Postgres.DSN)
	if err != nil {
		t.Fatalf("parsing the test DSN: %v", err)
	}
	port := freePort(t)
	// The node's address (the Pods reach PostgreSQL there): nothing listens on this port yet.
	dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s password=%s sslmode=disable", node.NodeIP, port, cfg.User, cfg.Database, password)
	e.kubectl("-n", namespace, "create", "secret", "generic", secret, "--from-literal=dsn="+dsn)
	manifest := fmt.Sprintf(`apiVersion: renderqueue.dev/v1alpha1
kind: RenderQueue
metadata: {name: %s, namespace: %s}
spec:
  shards: 1
  window: 24h
  store: {secretRef: {name: %s, key: dsn}}
`, name, namespace, secret)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := e.c.Kubectl(ctx, []byte(manifest), "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer func() {
		_, _ = e.c.Kubectl(context.Background(), nil, "-n", namespace, "delete", "renderqueue", name, "--wait=true")
		_, _ = e.c.Kubectl(context.Background(), nil, "-n", namespace, "delete", "secret", secret)
	}()
	broken := func() *rqv1.RenderQueue {
		var rq rqv1.RenderQueue
		gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
		defer gcancel()
		if err := e.k8s.Get(gctx, client.ObjectKey{Namespace: namespace, Name: name}, &rq); err != nil {
			t.Fatalf("reading RenderQueue %s: %v", name, err)
		}
		return &rq
	}

	shard := rqv1.ShardName(name, 0)
	addr := net.JoinHostPort(node.NodeIP, strconv.Itoa(port))
	var described string
	e.eventually(t, 90*time.Second, time.Second, "kubectl describe to show the keeper's database error", func() (bool, string) {
		st := broken().Status
		ready := meta.FindStatusCondition(st.Conditions, rqv1.ConditionReady)
		if len(st.Shards) != 1 || st.Shards[0].State != "unready" || !strings.Contains(st.Shards[0].Error, addr) ||
			ready == nil || !strings.Contains(ready.Message, shard+" is unready: connecting to the database") {
			return false, fmt.Sprintf("shards %+v; %s", st.Shards, conds(st.Conditions))
		}
		described = e.kubectl("describe", "renderqueue", name)
		for _, want := range []string{"connecting to the database", addr, "connection refused"} {
			if !strings.Contains(described, want) {
				return false, fmt.Sprintf("kubectl describe does not show %q yet", want)
			}
		}
		return true, ""
	})
	t.Logf("kubectl describe renderqueue %s (DSN at a closed port):\n%s", name, described)
	if strings.Contains(described, password) || strings.Contains(e.kubectl("get", "renderqueue", name, "-o", "yaml"), password) {
		t.Errorf("the DSN's password is in the RenderQueue's status")
	}

	stop := proxyPostgres(t, port, cfg)
	defer stop()
	t.Logf("PostgreSQL now answers on %s", addr)
	want := e.sqlDue()
	e.eventually(t, 2*time.Minute, time.Second, name+" exact with the SQL count", func() (bool, string) {
		st := broken().Status
		return st.DueExact && st.Due == want && st.ReadyShards == 1,
			fmt.Sprintf("due=%d (SQL %d) dueExact=%v ready=%d; %s", st.Due, want, st.DueExact, st.ReadyShards, conds(st.Conditions))
	})
	e.kubectl("-n", namespace, "delete", "renderqueue", name, "--wait=true")
	e.exactAndTrue(time.Minute, 4)
}

// proxyPostgres listens on the node's address at port and forwards every connection to the PostgreSQL
// server of cfg (its Unix socket, or its TCP address). stop closes the listener and every
// connection.
func proxyPostgres(t *testing.T, port int, cfg *pgconn.Config) (stop func()) {
	t.Helper()
	network, target := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(node.NodeIP, strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("proxy on port %d: %v", port, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				up, err := (&net.Dialer{}).DialContext(ctx, network, target)
				if err != nil {
					_ = c.Close()
					return
				}
				stopped := context.AfterFunc(ctx, func() {
					_ = c.Close()
					_ = up.Close()
				})
				defer stopped()
				done := make(chan struct{})
				go func() {
					_, _ = io.Copy(up, c)
					_ = up.Close()
					close(done)
				}()
				_, _ = io.Copy(c, up)
				_ = c.Close()
				<-done
			})
		}
	})
	return func() {
		cancel()
		_ = ln.Close()
		wg.Wait()
	}
}

// freePort is a TCP port of the node's address that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(node.NodeIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}
