package memlimit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fsys writes files (path relative to a temporary root → content) and returns the root.
func fsys(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
		ok    bool
	}{
		{"v2 with a cgroup namespace (a container's own cgroup at the root)", map[string]string{
			"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "536870912\n"}, 512 << 20, true},
		{"v2 without a namespace: the process's own cgroup", map[string]string{
			"proc/self/cgroup":                                     "0::/kubepods.slice/pod1/cri-abc\n",
			"sys/fs/cgroup/memory.max":                             "max\n",
			"sys/fs/cgroup/kubepods.slice/pod1/cri-abc/memory.max": "268435456\n"}, 256 << 20, true},
		{"v2 unlimited", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}, 0, false},
		{"v1: the process's own cgroup", map[string]string{
			"proc/self/cgroup":                                             "12:pids:/x\n4:memory:/kubepods/pod1/abc\n1:name=systemd:/x\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":                   "9223372036854771712\n",
			"sys/fs/cgroup/memory/kubepods/pod1/abc/memory.limit_in_bytes": "1073741824\n"}, 1 << 30, true},
		{"v1 in a container: the host's path is not mounted, its own cgroup is the mount's root", map[string]string{
			"proc/self/cgroup":                           "4:memory:/kubepods/pod1/abc\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "134217728\n"}, 128 << 20, true},
		{"v1 unlimited", map[string]string{
			"proc/self/cgroup": "4:memory:/\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0, false},
		{"v1 hybrid: the memory controller is v1's", map[string]string{
			"proc/self/cgroup": "4:memory:/a\n0::/a\n",
			"sys/fs/cgroup/memory/a/memory.limit_in_bytes": "1048576\n", "sys/fs/cgroup/unified/a/memory.max": "max\n"}, 1 << 20, true},
		{"no cgroup file system", map[string]string{"proc/self/cgroup": "0::/\n"}, 0, false},
		{"no /proc", map[string]string{}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fsys(t, tc.files)
			r := Reader{ProcSelfCgroup: filepath.Join(root, "proc/self/cgroup"), Root: filepath.Join(root, "sys/fs/cgroup")}
			got, ok, err := r.Limit()
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || ok != tc.ok {
				t.Fatalf("Limit() = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestLimitGarbage(t *testing.T) {
	root := fsys(t, map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "lots\n"})
	r := Reader{ProcSelfCgroup: filepath.Join(root, "proc/self/cgroup"), Root: filepath.Join(root, "sys/fs/cgroup")}
	if _, _, err := r.Limit(); err == nil || !strings.Contains(err.Error(), "memory.max") {
		t.Fatalf("a limit that is not a number: err %v", err)
	}
	// the collector leaves the series out rather than failing the scrape
	if n := testutil.CollectAndCount(NewCollector("x_memory_limit_bytes", r)); n != 0 {
		t.Fatalf("%d series from an unreadable limit", n)
	}
}

func TestCollector(t *testing.T) {
	root := fsys(t, map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "536870912\n"})
	r := Reader{ProcSelfCgroup: filepath.Join(root, "proc/self/cgroup"), Root: filepath.Join(root, "sys/fs/cgroup")}
	c := NewCollector("renderqueue_keeper_memory_limit_bytes", r)
	want := `# HELP renderqueue_keeper_memory_limit_bytes The memory limit of the process's cgroup (in a Pod: its container's resources.limits.memory), in bytes; absent when unlimited.
# TYPE renderqueue_keeper_memory_limit_bytes gauge
renderqueue_keeper_memory_limit_bytes 5.36870912e+08
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	// read at every scrape: a resized limit shows at once
	if err := os.WriteFile(filepath.Join(root, "sys/fs/cgroup/memory.max"), []byte("max\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Fatalf("%d series once unlimited", n)
	}
}

// TestLimitHere reads this machine's cgroup: whatever it says, it must parse.
func TestLimitHere(t *testing.T) {
	n, ok, err := Reader{}.Limit()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("this process's memory limit: %d (set: %v)", n, ok)
}
