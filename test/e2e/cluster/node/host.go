package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The node's fixed names and paths: one node per machine, so that a run can find what a killed
// run left behind.
const (
	// Name is the Node's name.
	Name = "rq-node"
	// Bridge is the Pods' bridge; its address (NodeIP) is the node's address.
	Bridge = "rq-br0"
	// NodeIP is the node's address, on Bridge: the API server, the kubelet and PostgreSQL listen
	// on it, and the Pods reach it as their gateway.
	NodeIP = "10.244.0.1"
	// PodCIDR is the Pods' address range (the host-local IPAM's subnet).
	PodCIDR = "10.244.0.0/24"
	// ServiceCIDR is the Services' cluster IP range.
	ServiceCIDR = "10.96.0.0/24"
	// DNSServiceIP is the kube-dns Service's cluster IP (the kubelet's clusterDNS).
	DNSServiceIP = "10.96.0.10"
	// ClusterDomain is the cluster's DNS domain.
	ClusterDomain = "cluster.local"
	// CgroupName is the node's cgroup (the kubelet's cgroupRoot) under each hierarchy.
	CgroupName = "renderqueue-node"
	// EgressChain is the iptables chain (filter table) that rejects Pod traffic leaving the
	// node's ranges.
	EgressChain = "RQ-NODE-EGRESS"
	// StateDir holds containerd's root (images, snapshots), the kubelet's root, the CNI IPAM's
	// data and the Pods' logs.
	StateDir = "/var/lib/renderqueue-node"
	// RunDir holds containerd's state (sockets, the Pods' network namespaces) and runc's.
	RunDir = "/run/renderqueue-node"
	// LockPath is the lock a running node holds.
	LockPath = "/run/renderqueue-node.lock"
	// recordPath keeps what the first run found on the machine (the sysctl's value, the host
	// paths that existed), for the sweep that restores it.
	recordPath = "/run/renderqueue-node.host"
)

// hostPaths are paths outside StateDir and RunDir that containerd 1.6 (its shims' sockets, fifos
// and a runc directory), the CNI plugins (their result cache) and the kubelet (its log links)
// write to whatever their configuration says; the sweep removes each one the machine did not
// have before the node's first run, and the node's entries from one it had.
var hostPaths = []string{"/run/containerd", "/var/lib/cni", "/var/log/containers"}

// Host is this machine prepared for the node: the lock held, leftovers of an earlier run swept
// away, IPv4 forwarding on, the bridge up with NodeIP and the egress rule in place. Release undoes
// all of it.
type Host struct {
	lock *os.File
	logf func(format string, args ...any)
}

// HostOptions configure Prepare.
type HostOptions struct {
	// Wait makes Prepare wait for another run's lock (up to the context's deadline) instead of
	// refusing at once.
	Wait bool
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
}

// ErrBusy is returned (wrapped) by Prepare when another run holds the node's lock.
var ErrBusy = errors.New("another local cluster runs on this machine")

// Prepare takes the machine for the node: it takes the lock (or says who has it), sweeps up what
// a killed run left, and sets up forwarding, the bridge and the egress rule. It needs root.
func Prepare(ctx context.Context, o HostOptions) (_ *Host, err error) {
	h, err := lockHost(ctx, o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			h.Release()
		}
	}()
	if err := Sweep(h.logf); err != nil {
		return nil, err
	}
	if err := recordHost(); err != nil {
		return nil, err
	}
	if err := setupNetwork(); err != nil {
		return nil, err
	}
	return h, nil
}

// SweepMachine takes the node's lock (refusing, or waiting with o.Wait, while another run holds
// it), sweeps away what a killed run left (Sweep) and drops the lock, setting nothing up: what
// `hack/node.sh sweep` does. Unlike Prepare followed by Release, it reports only what was left
// behind, not the bridge and rules Prepare would have just made.
func SweepMachine(ctx context.Context, o HostOptions) error {
	h, err := lockHost(ctx, o)
	if err != nil {
		return err
	}
	h.Release()
	return nil
}

// lockHost takes the node's lock for a Host (Prepare's, SweepMachine's); it needs root.
func lockHost(ctx context.Context, o HostOptions) (*Host, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("node: a real node needs root (containerd, the kubelet, network namespaces, iptables)")
	}
	h := &Host{logf: o.Logf}
	if h.logf == nil {
		h.logf = func(string, ...any) {}
	}
	var err error
	if h.lock, err = takeLock(ctx, o.Wait, h.logf); err != nil {
		return nil, err
	}
	return h, nil
}

// Release sweeps everything the node put on the machine away (Sweep) and drops the lock.
func (h *Host) Release() {
	if h.lock == nil {
		return
	}
	if err := Sweep(h.logf); err != nil {
		h.logf("sweeping the node: %v", err)
	}
	_ = os.Remove(recordPath)
	_ = h.lock.Close()
	h.lock = nil
}

// takeLock takes LockPath's exclusive lock and writes this process's pid into it.
func takeLock(ctx context.Context, wait bool, logf func(string, ...any)) (*os.File, error) {
	f, err := os.OpenFile(LockPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("node: opening the lock %s: %w", LockPath, err)
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("node: locking %s: %w", LockPath, err)
		}
		holder, _ := os.ReadFile(LockPath)
		who := strings.TrimSpace(string(holder))
		if who == "" {
			who = "unknown"
		}
		if !wait {
			_ = f.Close()
			return nil, fmt.Errorf("%w (pid %s holds %s): stop it first, or wait for it to end", ErrBusy, who, LockPath)
		}
		if !said {
			logf("waiting for the local cluster of pid %s to end (it holds %s)", who, LockPath)
			said = true
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("%w (pid %s holds %s): %w", ErrBusy, who, LockPath, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// record is what the machine looked like before the node's first run.
type record struct {
	ipForward string
	existed   map[string]bool
}

// recordHost writes recordPath unless a killed run's record is still there (then that one is
// the truth: the machine as it was before that run).
func recordHost() error {
	if _, err := os.Stat(recordPath); err == nil {
		return nil
	}
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return fmt.Errorf("node: reading net.ipv4.ip_forward: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ip_forward %s\n", strings.TrimSpace(string(fwd)))
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err == nil {
			fmt.Fprintf(&b, "existed %s\n", p)
		}
	}
	if err := os.WriteFile(recordPath, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("node: writing %s: %w", recordPath, err)
	}
	return nil
}

func readRecord() (*record, error) {
	b, err := os.ReadFile(recordPath)
	if err != nil {
		return nil, err
	}
	r := &record{existed: map[string]bool{}}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		switch k {
		case "ip_forward":
			r.ipForward = v
		case "existed":
			r.existed[v] = true
		}
	}
	return r, nil
}

// setupNetwork turns IPv4 forwarding on, makes the bridge with NodeIP and adds the egress rule.
func setupNetwork() error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("node: turning net.ipv4.ip_forward on: %w", err)
	}
	// Service traffic between two Pods on the bridge must pass iptables (kube-proxy's DNAT).
	if b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil || strings.TrimSpace(string(b)) != "1" {
		return fmt.Errorf("node: net.bridge.bridge-nf-call-iptables is not 1 (is br_netfilter loaded?): %q, %v", bytes.TrimSpace(b), err)
	}
	_, pods, err := net.ParseCIDR(PodCIDR)
	if err != nil {
		return fmt.Errorf("node: parsing %s: %w", PodCIDR, err)
	}
	ones, _ := pods.Mask.Size()
	for _, args := range [][]string{
		{"link", "add", Bridge, "type", "bridge"},
		{"addr", "add", NodeIP + "/" + strconv.Itoa(ones), "dev", Bridge},
		{"link", "set", Bridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("node: ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	for _, args := range [][]string{
		{"-N", EgressChain},
		// Within the node's ranges: the Pods, the Services (before kube-proxy's DNAT, which in
		// practice happens first), the node itself.
		{"-A", EgressChain, "-d", PodCIDR, "-j", "RETURN"},
		{"-A", EgressChain, "-d", ServiceCIDR, "-j", "RETURN"},
		// Anything else a Pod sends out is refused at once (no route either: see the CNI
		// configuration).
		{"-A", EgressChain, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"},
		{"-A", EgressChain, "-j", "REJECT", "--reject-with", "icmp-net-unreachable"},
		{"-I", "FORWARD", "1", "-s", PodCIDR, "-j", EgressChain},
	} {
		if out, err := exec.Command("iptables", append([]string{"-w", "-t", "filter"}, args...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("node: iptables %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	return nil
}

// Sweep removes everything a node (this run's, or a killed one's) put on the machine: its
// processes and the processes in its cgroups, its mounts, its iptables chains, the bridge, the
// cgroups, StateDir and RunDir, what it wrote to the host paths, and it restores IPv4
// forwarding. It does nothing on a clean machine and may be called any number of times.
func Sweep(logf func(string, ...any)) error {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var errs []error
	if n := killNodeProcesses(); n > 0 {
		logf("sweep: killed %d processes of the node", n)
	}
	if n, err := unmountUnder(StateDir, RunDir); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		logf("sweep: unmounted %d mounts", n)
	}
	if n, err := removeChains(); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		logf("sweep: removed %d iptables chains", n)
	}
	if _, err := net.InterfaceByName(Bridge); err == nil {
		if out, err := exec.Command("ip", "link", "del", Bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", Bridge, err, bytes.TrimSpace(out)))
		} else {
			logf("sweep: deleted the bridge %s", Bridge)
		}
	}
	if err := removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []string{StateDir, RunDir} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", d, err))
		}
	}
	if r, err := readRecord(); err == nil {
		cleanHostPaths(r)
		if r.ipForward != "" {
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte(r.ipForward), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restoring net.ipv4.ip_forward: %w", err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node: sweep: %w", err)
	}
	return nil
}

// killNodeProcesses SIGKILLs the node's daemons and shims (found by their command lines, which
// name StateDir or RunDir) and every process in the node's cgroups, until none is left (at most
// 10 s); it returns how many it killed.
func killNodeProcesses() int {
	killed := map[int]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := nodePids()
		if len(pids) == 0 || time.Now().After(deadline) {
			return len(killed)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed[pid] = true
		}
		time.Sleep(100 * time.Millisecond) // a killed process takes a moment to leave /proc
	}
}

// nodePids lists the processes of the node: those whose command line names StateDir or RunDir
// (containerd, its shims, the kubelet) and those in the node's cgroups (the containers).
func nodePids() []int {
	self := os.Getpid()
	seen := map[int]bool{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(cmd, []byte(StateDir)) || bytes.Contains(cmd, []byte(RunDir)) {
			seen[pid] = true
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err == nil && inNodeCgroup(string(cg)) {
			seen[pid] = true
		}
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// inNodeCgroup says whether a /proc/PID/cgroup file puts the process in the node's cgroup (or
// one below it) in any hierarchy.
func inNodeCgroup(procCgroup string) bool {
	for _, line := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[2] == "/"+CgroupName || strings.HasPrefix(parts[2], "/"+CgroupName+"/")) {
			return true
		}
	}
	return false
}

// unmountUnder detaches every mount point under the given directories, deepest first.
func unmountUnder(dirs ...string) (int, error) {
	n := 0
	for round := 0; round < 5; round++ {
		points, err := mountPointsUnder(dirs...)
		if err != nil {
			return n, err
		}
		if len(points) == 0 {
			return n, nil
		}
		for _, p := range points {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err == nil {
				n++
			}
		}
	}
	points, _ := mountPointsUnder(dirs...)
	if len(points) > 0 {
		return n, fmt.Errorf("still mounted after unmounting: %s", strings.Join(points, ", "))
	}
	return n, nil
}

// mountPointsUnder lists the mount points at or under dirs (from /proc/self/mountinfo), deepest
// first.
func mountPointsUnder(dirs ...string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := unescapeMount(f[4])
		for _, d := range dirs {
			if p == d || strings.HasPrefix(p, d+"/") {
				points = append(points, p)
				break
			}
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	return points, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ourChain says whether an iptables chain is the node's: the kubelet's and kube-proxy's KUBE-*,
// the CNI plugins' CNI-*, and EgressChain.
func ourChain(name string) bool {
	return strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-") || name == EgressChain
}

// removeChains deletes the rules that jump to the node's chains and the chains themselves, in
// every table, for IPv4 and IPv6; it returns how many chains it removed.
func removeChains() (int, error) {
	n := 0
	var errs []error
	for _, cmd := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(cmd + "-save"); err != nil {
			continue
		}
		out, err := exec.Command(cmd + "-save").Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s-save: %w", cmd, err))
			continue
		}
		script, chains := sweepScript(string(out))
		if chains == 0 {
			continue
		}
		restore := exec.Command(cmd+"-restore", "--noflush", "-w")
		restore.Stdin = strings.NewReader(script)
		if out, err := restore.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s-restore: %w: %s\n%s", cmd, err, bytes.TrimSpace(out), script))
			continue
		}
		n += chains
	}
	return n, errors.Join(errs...)
}

// sweepScript turns iptables-save output into an iptables-restore --noflush script that deletes
// every rule in a built-in chain that jumps to one of the node's chains, then flushes and deletes
// those chains; it also returns how many chains the script deletes.
func sweepScript(save string) (string, int) {
	var b strings.Builder
	total := 0
	var table string
	var rules, chains []string
	flush := func() {
		if table == "" || (len(rules) == 0 && len(chains) == 0) {
			return
		}
		fmt.Fprintf(&b, "*%s\n", table)
		for _, r := range rules {
			fmt.Fprintf(&b, "-D %s\n", r)
		}
		for _, c := range chains {
			fmt.Fprintf(&b, "-F %s\n", c)
		}
		for _, c := range chains {
			fmt.Fprintf(&b, "-X %s\n", c)
		}
		b.WriteString("COMMIT\n")
		total += len(chains)
	}
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			flush()
			table, rules, chains = strings.TrimPrefix(line, "*"), nil, nil
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(strings.TrimPrefix(line, ":"), " ")
			if ourChain(name) {
				chains = append(chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) < 2 || ourChain(f[1]) {
				continue // flushed with its chain
			}
			for i := 2; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g") && ourChain(f[i+1]) {
					rules = append(rules, strings.TrimPrefix(line, "-A "))
					break
				}
			}
		}
	}
	flush()
	return b.String(), total
}

// cgroupHierarchies lists the directories the node's cgroup is made in: one per cgroup v1
// hierarchy, or the unified hierarchy's root under cgroup v2.
func cgroupHierarchies() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var dirs []string
	for _, e := range entries {
		d := filepath.Join("/sys/fs/cgroup", e.Name())
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// removeCgroups removes the node's cgroup directories, deepest first (their processes are
// already killed).
func removeCgroups() error {
	var errs []error
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, CgroupName)
		if _, err := os.Stat(root); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for try := 0; try < 50; try++ { // a cgroup whose last process just died may be busy a moment
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// cleanHostPaths removes from the fixed host paths what the node put there: each one the record
// says did not exist before, whole (the node's processes are gone by now); from one that did,
// shim sockets nobody listens on, the CNI results of the node's network and the kubelet's log
// links into StateDir.
func cleanHostPaths(r *record) {
	for _, p := range hostPaths {
		if !r.existed[p] {
			_ = os.RemoveAll(p)
		}
	}
	if entries, err := os.ReadDir("/run/containerd/s"); err == nil {
		listening := unixListeners()
		for _, e := range entries {
			p := filepath.Join("/run/containerd/s", e.Name())
			if !listening[p] {
				_ = os.Remove(p)
			}
		}
	}
	if entries, err := os.ReadDir("/var/lib/cni/results"); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), cniNetwork+"-") {
				_ = os.Remove(filepath.Join("/var/lib/cni/results", e.Name()))
			}
		}
	}
	if entries, err := os.ReadDir("/var/log/containers"); err == nil {
		for _, e := range entries {
			p := filepath.Join("/var/log/containers", e.Name())
			if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, StateDir+"/") {
				_ = os.Remove(p)
			}
		}
	}
}

// unixListeners is the set of unix socket paths some process listens on (/proc/net/unix).
func unixListeners() map[string]bool {
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }()
	m := map[string]bool{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 8 && strings.HasPrefix(fields[7], "/") {
			m[fields[7]] = true
		}
	}
	return m
}
