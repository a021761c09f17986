//go:build e2e

package e2e

// TestUpgrade: the operator and the keepers of this tree (version N) take over from version N−1
// in place, as a user upgrades, with writers and render workers running throughout.
//
// Version N−1 is the commit named in test/e2e/upgrade-from. The test builds it from the
// repository's history (git archive; its image with its own `make image`, its binary, its chart),
// caches what it built under the user's cache directory by commit, and the node imports both
// images. Then, on TestChaos's load (chaos_test.go: a writer, four render workers, the audit
// trigger):
//
//  1. install N−1 as a Helm user does (its chart, its image; two operator replicas), migrate the
//     schema with its binary, apply a 3-shard RenderQueue; every Pod runs N−1 (`/renderqueue
//     version` in a shard says so); a quiescent sample;
//  2. upgrade as README.md ("Installing", "Upgrading") says: apply N's CRD, `helm upgrade` to N's
//     chart; the operator Deployment rolls, and the operator of N replaces the shard Pods one at a
//     time (its rolling update); the test waits until every Pod runs N, then migrates the schema
//     with N's binary;
//  3. a quiescent sample on N, then a rescale 3 → 4 on N and a sample after it;
//  4. TestChaos's verify: every acknowledged completion persisted, no overlapping leases, no
//     duplicate renders, every quiescent sample exact and equal to the SQL count.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// rollTimeout bounds the operator of N replacing every shard Pod of N−1.
const rollTimeout = 6 * time.Minute

// previous is version N−1, built (buildPrevious).
type previous struct {
	commit  string // the full commit hash
	version string // the version its binary and image carry: its Makefile's VERSION, "-", the short hash
	image   string // its image's name (ghcr.io/renderqueue/renderqueue:<version>)
	archive string // its image as an OCI archive
	bin     string // its renderqueue binary for this machine
	chart   string // its charts/renderqueue
}

// TestUpgrade upgrades N−1 to N in place under load; see above.
func TestUpgrade(t *testing.T) {
	skipUnlessRunnable(t)
	prev := buildPrevious(t, repoRoot(t))
	e := startEnv(t, prev.archive)
	tag := prev.image[strings.LastIndex(prev.image, ":")+1:]
	ch := &chaos{e: e, opNS: helmNS, horizon: chaosHorizon(0), leases: map[string][]*leaseRec{}, refused: map[string]int{},
		migrateBin: prev.bin, chart: prev.chart,
		helmArgs: []string{"--set", "image.tag=" + tag, "--set", "operator.replicas=2"}}
	t.Cleanup(func() {
		if ch.pool != nil {
			ch.pool.Close()
		}
	})
	step := func(name string, f func(t *testing.T)) { e.runSteps(t, []envStep{{name, f}}) }
	nVersion := e.images.Renderqueue[strings.LastIndex(e.images.Renderqueue, ":")+1:]

	step("install-previous", func(t *testing.T) {
		ch.setup(t)
		ch.checkRunning(t, prev.image, prev.version)
	})
	t.Cleanup(ch.stopLoad) // before the pool closes and the cluster stops
	step("load", ch.startLoad)
	step("sample-previous", func(t *testing.T) { ch.sample(t, "version N−1, "+prev.version) })
	step("upgrade-operator", func(t *testing.T) { ch.upgradeOperator(t, e.images.Renderqueue) })
	step("roll-shards", func(t *testing.T) { ch.waitShardsRolled(t, e.images.Renderqueue, nVersion) })
	step("sample-upgraded", func(t *testing.T) { ch.sample(t, "version N, "+nVersion) })
	step("migrate", func(t *testing.T) {
		out, err := execOut(e.bin, "schema", "migrate", "--dsn", e.c.Postgres.DSN)
		if err != nil {
			ch.e.fatalf(t, "renderqueue schema migrate (N): %v\n%s", err, out)
		}
		t.Logf("renderqueue schema migrate (N): %s", strings.TrimSpace(out))
		ch.sample(t, "version N, schema migrated")
	})
	step("rescale-on-upgraded", func(t *testing.T) {
		ch.scale(4)
		ch.waitSettled(t, 4)
		ch.sample(t, "version N, 4 shards")
	})
	step("verify", ch.verify)
}

// buildPrevious builds version N−1 (test/e2e/upgrade-from), or takes it from the cache.
func buildPrevious(t *testing.T, root string) *previous {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "test", "e2e", "upgrade-from"))
	if err != nil {
		t.Fatalf("reading the version to upgrade from: %v", err)
	}
	var commit string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			commit = line
			break
		}
	}
	if len(commit) != 40 {
		t.Fatalf("test/e2e/upgrade-from names %q, not a full commit hash", commit)
	}
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if _, err := git("cat-file", "-e", commit+"^{commit}"); err != nil {
		out, ferr := git("fetch", "--quiet", "origin", commit)
		if ferr != nil {
			if shallow, _ := git("rev-parse", "--is-shallow-repository"); shallow == "true" {
				t.Skipf("upgrade: this clone is shallow and lacks %s, the version to upgrade from (git fetch: %s): clone with its history", commit, out)
			}
			t.Fatalf("upgrade: the repository lacks %s, the version to upgrade from (test/e2e/upgrade-from), and git fetch origin failed: %s", commit, out)
		}
	}
	short := commit[:7]
	mk, err := git("show", commit+":Makefile")
	if err != nil {
		t.Fatalf("reading the Makefile of %s: %v\n%s", short, err, mk)
	}
	base := ""
	for _, line := range strings.Split(mk, "\n") {
		if v, ok := strings.CutPrefix(line, "VERSION ?= "); ok {
			base = strings.TrimSpace(v)
			break
		}
	}
	if base == "" {
		t.Fatalf("the Makefile of %s sets no VERSION", short)
	}
	p := &previous{commit: commit, version: base + "-" + short}
	p.image = "ghcr.io/renderqueue/renderqueue:" + p.version

	cacheRoot, err := os.UserCacheDir()
	if err != nil {
		t.Fatalf("the cache directory: %v", err)
	}
	cache := filepath.Join(cacheRoot, "renderqueue", "upgrade-from", commit+"-"+runtime.GOARCH)
	p.archive, p.bin = filepath.Join(cache, "renderqueue.oci.tar"), filepath.Join(cache, "renderqueue")

	// The tree of N−1, for its chart (always) and its build (unless cached).
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", commit, src)
	archive.Dir = root
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", short, err, out)
	}
	p.chart = filepath.Join(src, "charts", "renderqueue")
	if _, errA := os.Stat(p.archive); errA == nil {
		if _, errB := os.Stat(p.bin); errB == nil {
			t.Logf("version N−1 %s (%s): image and binary from the cache %s", p.version, short, cache)
			return p
		}
	}
	start := time.Now()
	epoch, err := git("log", "-1", "--format=%ct", commit)
	if err != nil {
		t.Fatalf("the date of %s: %v", short, err)
	}
	build := filepath.Join(t.TempDir(), "build")
	makeImage := exec.Command("make", "--no-print-directory", "-C", src, "image",
		"VERSION="+p.version, "IMG="+p.image, "IMAGE_DIR="+build, "IMAGE_PLATFORMS=linux/"+runtime.GOARCH,
		"SOURCE_DATE_EPOCH="+epoch, "REVISION="+commit)
	if out, err := makeImage.CombinedOutput(); err != nil {
		t.Fatalf("make image of %s: %v\n%s", short, err, out)
	}
	// The binary the test runs on this machine (the schema migration) is the image's own: static,
	// for this architecture (the Makefile's image_bin). A second go build with other flags would
	// compile every dependency again, minutes on a cold cache.
	if err := os.Rename(filepath.Join(build, "linux_"+runtime.GOARCH, "renderqueue"), filepath.Join(build, "renderqueue")); err != nil {
		t.Fatalf("the binary of %s's image: %v", short, err)
	}
	// into the cache whole or not at all
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
		t.Fatal(err)
	}
	staged := cache + ".new"
	_ = os.RemoveAll(staged)
	if err := os.MkdirAll(staged, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"renderqueue.oci.tar", "renderqueue"} {
		if err := os.Rename(filepath.Join(build, f), filepath.Join(staged, f)); err != nil {
			t.Fatalf("caching %s: %v", f, err)
		}
	}
	_ = os.RemoveAll(cache)
	if err := os.Rename(staged, cache); err != nil {
		t.Fatalf("caching version N−1: %v", err)
	}
	t.Logf("version N−1 %s (%s) built in %s: %s, %s", p.version, short, time.Since(start).Round(time.Second), p.archive, p.bin)
	return p
}

// checkRunning checks that the operator's Pods and the shard Pods all run image, and that a
// shard's binary says it is version.
func (ch *chaos) checkRunning(t *testing.T, image, version string) {
	t.Helper()
	pods := ch.operatorPods(t)
	pods = append(pods, ch.shardPods(t)...)
	for _, p := range pods {
		if got := p.Spec.Containers[0].Image; got != image {
			ch.e.errorf(t, "Pod %s/%s runs %s, want %s", p.Namespace, p.Name, got, image)
		}
	}
	shard := ch.shardNames()[0]
	out := strings.TrimSpace(ch.e.kubectl("-n", namespace, "exec", shard, "--", "/renderqueue", "version"))
	if out != "renderqueue "+version {
		ch.e.errorf(t, "kubectl exec %s -- /renderqueue version: %q, want %q", shard, out, "renderqueue "+version)
	}
	t.Logf("%d Pods run %s; kubectl exec %s -- /renderqueue version: %s", len(pods), image, shard, out)
}

// operatorPods are the operator Deployment's live Pods.
func (ch *chaos) operatorPods(t *testing.T) []corev1.Pod {
	return ch.livePods(t, ch.opNS, labels.SelectorFromSet(labels.Set{rqv1.LabelComponent: "operator"}).String())
}

// shardPods are the queue's live shard Pods.
func (ch *chaos) shardPods(t *testing.T) []corev1.Pod {
	return ch.livePods(t, namespace, labels.SelectorFromSet(labels.Set{rqv1.LabelQueue: queueName, rqv1.LabelComponent: "keeper"}).String())
}

func (ch *chaos) livePods(t *testing.T, ns, selector string) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := ch.e.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		ch.e.fatalf(t, "listing Pods %s in %s: %v", selector, ns, err)
	}
	var live []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	slices.SortFunc(live, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return live
}

// upgradeOperator upgrades as README.md says: N's CRD first (Helm never upgrades a chart's
// CRDs), then helm upgrade to N's chart; it waits for the operator Deployment's rollout and
// checks its Pods run image.
func (ch *chaos) upgradeOperator(t *testing.T, image string) {
	e := ch.e
	crds := filepath.Join(e.root, "charts", "renderqueue", "crds")
	t.Logf("kubectl apply --server-side -f charts/renderqueue/crds/ (N):\n%s", e.kubectl("apply", "--server-side", "-f", crds))
	start := time.Now()
	args := []string{"upgrade", "renderqueue", filepath.Join(e.root, "charts", "renderqueue"), "--namespace", ch.opNS,
		"--set", "operator.replicas=2", "--set", chaosShardPollSet}
	out, err := execOut(ch.helm(t), append(args, "--kubeconfig", e.c.Kubeconfig)...)
	if err != nil {
		ch.e.fatalf(t, "helm upgrade: %v\n%s", err, out)
	}
	t.Logf("helm %s:\n%s", strings.Join(args, " "), out)
	e.kubectl("-n", ch.opNS, "rollout", "status", "deployment/renderqueue-operator", "--timeout=180s")
	ch.e.eventually(t, time.Minute, 500*time.Millisecond, "the operator's old Pods gone", func() (bool, string) {
		var imgs []string
		for _, p := range ch.operatorPods(t) {
			imgs = append(imgs, p.Name+"="+p.Spec.Containers[0].Image)
		}
		return len(imgs) == 2 && !slices.ContainsFunc(imgs, func(s string) bool { return !strings.HasSuffix(s, "="+image) }),
			strings.Join(imgs, " ")
	})
	t.Logf("%s operator rolled to %s in %s (the leader Lease passes to a new replica once the old holder's ends)",
		time.Now().Format("15:04:05.000"), image, time.Since(start).Round(100*time.Millisecond))
}

// waitShardsRolled waits until the operator of N has replaced every shard Pod with one of image
// (logging each change of the shards' images), all ready and the queue exact, then checks a
// shard's binary is version.
func (ch *chaos) waitShardsRolled(t *testing.T, image, version string) {
	start := time.Now()
	last := ""
	ch.e.eventually(t, rollTimeout, 500*time.Millisecond, "every shard Pod replaced by one of "+image, func() (bool, string) {
		pods := ch.shardPods(t)
		var parts []string
		done := len(pods) == 3
		for _, p := range pods {
			ready, _ := podIsReady(&p)
			img := p.Spec.Containers[0].Image
			parts = append(parts, fmt.Sprintf("%s=%s ready=%v", p.Name, img[strings.LastIndex(img, ":")+1:], ready))
			done = done && img == image && ready
		}
		now := strings.Join(parts, ", ")
		if now != last {
			t.Logf("%s +%s %s", time.Now().Format("15:04:05.000"), time.Since(start).Round(100*time.Millisecond), now)
			last = now
		}
		st := ch.e.queue().Status
		return done && st.ReadyShards == 3 && st.DueExact, fmt.Sprintf("%s; ready=%d exact=%v; %s", now, st.ReadyShards, st.DueExact, conds(st.Conditions))
	})
	holder, pod := ch.leader(t)
	t.Logf("every shard Pod runs %s after %s; operator leader %s (pod %s)", image, time.Since(start).Round(100*time.Millisecond), holder, pod)
	ch.checkRunning(t, image, version)
}
