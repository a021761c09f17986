// Package memlimit reads the memory limit of the cgroup the process runs in — in a Pod, its
// container's resources.limits.memory, which the kernel enforces with the OOM killer — and
// exports it as a Prometheus gauge, so that an alert can compare the process's own
// process_resident_memory_bytes with it without cAdvisor (config/prometheus,
// RenderQueueKeeperMemoryNearLimit).
//
// Both cgroup versions are read: v2's memory.max and v1's memory.limit_in_bytes, in the process's
// own cgroup as /proc/self/cgroup names it, else at the root of the mount (a container whose
// cgroup is mounted as the root, with or without a cgroup namespace). "max" (v2) and v1's
// near-2^63 sentinel mean no limit.
package memlimit

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// KeeperMetric is the name under which the keeper exports its limit.
const KeeperMetric = "renderqueue_keeper_memory_limit_bytes"

// Reader reads the limit from a file system laid out as Linux's. The zero value reads this
// machine's: /proc/self/cgroup and /sys/fs/cgroup.
type Reader struct {
	// ProcSelfCgroup is the path of the process's cgroup list (default /proc/self/cgroup).
	ProcSelfCgroup string
	// Root is where the cgroup file systems are mounted (default /sys/fs/cgroup): v2's unified
	// hierarchy at Root itself (or Root/unified in hybrid mode), v1's memory controller at
	// Root/memory.
	Root string
}

// v1Unlimited: cgroup v1 reports no limit as PAGE_COUNTER_MAX pages in bytes, just under 2^63;
// any value from 2^62 on is treated as none.
const v1Unlimited = int64(1) << 62

// Limit returns the memory limit in bytes and true, or false when there is none (no limit set,
// or no memory controller: not Linux, or no cgroup mounted).
func (r Reader) Limit() (int64, bool, error) {
	self := r.ProcSelfCgroup
	if self == "" {
		self = "/proc/self/cgroup"
	}
	root := r.Root
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	v1Path, v2Path, err := cgroupPaths(self)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, false, nil
		}
		return 0, false, err
	}
	type candidate struct{ dir, file string }
	var cands []candidate
	if v1Path != "" {
		mount := filepath.Join(root, "memory")
		cands = append(cands, candidate{filepath.Join(mount, v1Path), "memory.limit_in_bytes"},
			candidate{mount, "memory.limit_in_bytes"})
	}
	if v2Path != "" || v1Path == "" {
		for _, mount := range []string{root, filepath.Join(root, "unified")} {
			cands = append(cands, candidate{filepath.Join(mount, v2Path), "memory.max"}, candidate{mount, "memory.max"})
		}
	}
	for _, c := range cands {
		b, err := os.ReadFile(filepath.Join(c.dir, c.file))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, fmt.Errorf("reading the cgroup memory limit: %w", err)
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("reading the cgroup memory limit %s: %w", filepath.Join(c.dir, c.file), err)
		}
		if n <= 0 || n >= v1Unlimited {
			return 0, false, nil
		}
		return n, true, nil
	}
	return 0, false, nil
}

// cgroupPaths returns the process's cgroup path in the v1 memory hierarchy and in the v2 unified
// hierarchy (either empty when the process is in none) from a /proc/self/cgroup file.
func cgroupPaths(path string) (v1, v2 string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case containsController(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", fmt.Errorf("reading %s: %w", path, err)
	}
	return v1, v2, nil
}

func containsController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// Collector exports the limit as a gauge, read at every scrape (a Pod's limits can be resized
// in place). The series is absent when there is no limit or it cannot be read: an unreadable
// file must not fail the whole scrape.
type Collector struct {
	r    Reader
	desc *prometheus.Desc
}

// NewCollector returns a collector of the gauge name (for example
// renderqueue_keeper_memory_limit_bytes) read through r.
func NewCollector(name string, r Reader) *Collector {
	return &Collector{r: r, desc: prometheus.NewDesc(name,
		"The memory limit of the process's cgroup (in a Pod: its container's resources.limits.memory), in bytes; absent when unlimited.",
		nil, nil)}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if n, ok, err := c.r.Limit(); err == nil && ok {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n))
	}
}
