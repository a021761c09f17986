package podconfig

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRewriteListen(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{":8080", "127.0.0.7:8080"},
		{"0.0.0.0:8080", "127.0.0.7:8080"},
		{"--listen=:8080", "--listen=127.0.0.7:8080"},
		{"--listen", "--listen"},
		{"10.1.2.3:8080", "10.1.2.3:8080"},
		{"127.0.0.1:9", "127.0.0.1:9"},
		{"keeper", "keeper"},
		{":http", ":http"},
		{"/var/run/x:8080", "/var/run/x:8080"},
	} {
		if got := rewriteListen(c.in, "127.0.0.7"); got != c.want {
			t.Errorf("rewriteListen(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestExpandVars(t *testing.T) {
	env := map[string]string{"A": "1", "POD": "web-shard-0"}
	for _, c := range []struct{ in, want string }{
		{"$(A)", "1"},
		{"--name=$(POD)", "--name=web-shard-0"},
		{"$(B)", "$(B)"},
		{"$$(A)", "$(A)"},
		{"$(A", "$(A"},
		{"cost $5", "cost $5"},
		{"$", "$"},
	} {
		if got := expandVars(c.in, env); got != c.want {
			t.Errorf("expandVars(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestBoundingSet(t *testing.T) {
	caps := func(add, drop []corev1.Capability) *corev1.Capabilities {
		return &corev1.Capabilities{Add: add, Drop: drop}
	}
	for _, c := range []struct {
		caps       *corev1.Capabilities
		privileged bool
		want       string
		err        bool
	}{
		{caps(nil, []corev1.Capability{"ALL"}), false, "-all", false},
		{caps([]corev1.Capability{"NET_BIND_SERVICE"}, []corev1.Capability{"ALL"}), false, "-all,+net_bind_service", false},
		{caps([]corev1.Capability{"CAP_SYS_ADMIN"}, []corev1.Capability{"all"}), false, "-all,+sys_admin", false},
		{caps(nil, []corev1.Capability{"NET_RAW", "MKNOD", "SETPCAP", "SETFCAP", "AUDIT_WRITE", "SYS_CHROOT", "KILL", "FSETID", "FOWNER", "DAC_OVERRIDE", "SETUID", "SETGID"}), false,
			"-all,+chown,+net_bind_service", false},
		{nil, false, "-all,+audit_write,+chown,+dac_override,+fowner,+fsetid,+kill,+mknod,+net_bind_service,+net_raw,+setfcap,+setgid,+setpcap,+setuid,+sys_chroot", false},
		{caps([]corev1.Capability{"ALL"}, []corev1.Capability{"CHOWN"}), false, "", false}, // checked below
		{caps(nil, []corev1.Capability{"ALL"}), true, "", false},
		{caps([]corev1.Capability{"NOT_A_CAP"}, nil), false, "", true},
	} {
		got, err := boundingSet(c.caps, c.privileged)
		if c.caps != nil && len(c.caps.Add) == 1 && c.caps.Add[0] == "ALL" {
			if strings.Contains(got, "+chown") || !strings.Contains(got, "+sys_admin") {
				t.Errorf("add ALL, drop CHOWN: %q", got)
			}
			continue
		}
		if (err != nil) != c.err || got != c.want {
			t.Errorf("boundingSet(%+v, %v) = %q, %v; want %q (error %v)", c.caps, c.privileged, got, err, c.want, c.err)
		}
	}
}

func TestTokenNeedsRefresh(t *testing.T) {
	issued := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	exp := issued.Add(time.Hour)
	for _, c := range []struct {
		after time.Duration
		want  bool
	}{{0, false}, {47 * time.Minute, false}, {48 * time.Minute, true}, {59 * time.Minute, true}} {
		if got := tokenNeedsRefresh(issued, exp, issued.Add(c.after)); got != c.want {
			t.Errorf("a 1 h token after %s: refresh %v, want %v", c.after, got, c.want)
		}
	}
	if !tokenNeedsRefresh(issued, issued.Add(48*time.Hour), issued.Add(25*time.Hour)) {
		t.Error("a token older than 24 h is not refreshed")
	}
}

func TestWriteAtomic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	files := map[string]volFile{"token": {data: []byte("a"), mode: 0o600}, "sub/ca.crt": {data: []byte("ca"), mode: 0o644}}
	if err := writeAtomic(dir, files, nil); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	}
	if read("token") != "a" || read("sub/ca.crt") != "ca" {
		t.Fatalf("token %q, sub/ca.crt %q", read("token"), read("sub/ca.crt"))
	}
	if fi, err := os.Stat(filepath.Join(dir, "token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("token mode %v (%v), want 0600", fi.Mode(), err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "token")); err != nil || target != "..data/token" {
		t.Errorf("token is not a link into ..data: %q %v", target, err)
	}
	first, _ := os.Readlink(filepath.Join(dir, "..data"))
	// unchanged: nothing is written
	if err := writeAtomic(dir, files, nil); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Readlink(filepath.Join(dir, "..data")); again != first {
		t.Errorf("an unchanged volume was rewritten (%s → %s)", first, again)
	}
	// changed: a new ..data, the old directory and a dropped file are gone
	if err := writeAtomic(dir, map[string]volFile{"token": {data: []byte("b"), mode: 0o600}}, nil); err != nil {
		t.Fatal(err)
	}
	second, _ := os.Readlink(filepath.Join(dir, "..data"))
	if second == first || read("token") != "b" {
		t.Errorf("after a change: ..data %s (was %s), token %q", second, first, read("token"))
	}
	if _, err := os.Lstat(filepath.Join(dir, "sub")); !os.IsNotExist(err) {
		t.Errorf("a file no longer in the volume is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, first)); !os.IsNotExist(err) {
		t.Errorf("the old data directory %s is still there: %v", first, err)
	}
	// fsGroup: group-owned, group-readable
	if os.Geteuid() == 0 {
		g := int64(4321)
		if err := writeAtomic(dir, map[string]volFile{"token": {data: []byte("c"), mode: 0o400}}, &g); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(dir, "token"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); int64(st.Gid) != g || fi.Mode().Perm() != 0o440 {
			t.Errorf("with fsGroup: gid %d mode %v, want %d and 0440", st.Gid, fi.Mode().Perm(), g)
		}
	}
	for _, bad := range []string{"../escape", "/abs", "a/../b", "..data", ""} {
		if err := writeAtomic(dir, map[string]volFile{bad: {data: []byte("x")}}, nil); err == nil {
			t.Errorf("the volume file path %q was accepted", bad)
		}
	}
}

func TestHostsFile(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-shard-0", Namespace: "default"},
		Spec: corev1.PodSpec{Hostname: "web-shard-0", Subdomain: "web-shards", HostAliases: []corev1.HostAlias{{IP: "10.1.2.3", Hostnames: []string{"db", "db.local"}}}}}
	got := hostsFile(pod, "10.244.3.2")
	for _, want := range []string{"127.0.0.1\tlocalhost\n", "10.244.3.2\tweb-shard-0.web-shards.default.svc.cluster.local\tweb-shard-0\n", "10.1.2.3\tdb\tdb.local\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("hosts file lacks %q:\n%s", want, got)
		}
	}
	if h := podHostname(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("a", 62) + "-b"}}); len(h) != 62 {
		t.Errorf("a 64-character Pod name gives hostname %q (want 63 characters at most, no trailing '-')", h)
	}
}
