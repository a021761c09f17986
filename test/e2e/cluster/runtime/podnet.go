package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// NodeIP is the Node's address, this machine's loopback address: every Pod's hostIP, and the Pod
// IP of hostNetwork Pods (every container shares this machine's network; a Pod of the pod network
// differs only in having an address of its own).
const NodeIP = "127.0.0.1"

// PodNetwork is the local cluster's pod CIDR, 10.244.N.0/24, made host-local with an AnyIP route
// (`ip route add local 10.244.N.0/24 dev lo`): a process can bind to and reach every address in
// it without a network interface per Pod. The API server accepts these addresses in
// EndpointSlices (it rejects loopback ones), so Services that select Pods get real endpoints.
type PodNetwork struct {
	// CIDR is the pod network, e.g. 10.244.37.0/24.
	CIDR netip.Prefix

	mu    sync.Mutex
	inUse map[netip.Addr]string
}

// podNetworkProto tags the routes AddPodNetwork adds (`ip route ... proto 190`), so a route left
// behind by a cluster whose process died can be recognised and removed.
const podNetworkProto = "190"

// PodNetworkStateDir holds a file per pod network in use, named after its /24 and holding the
// pid of the process that owns it.
const PodNetworkStateDir = "/run/renderqueue-local-cluster"

// AddPodNetwork picks a free 10.244.N.0/24 (N random, skipping any that overlaps a route already
// on the machine, in any table), claims it in PodNetworkStateDir and adds the local route for
// it; Remove takes both away. Routes and claims left by clusters whose process is gone are
// removed first. It needs root (CAP_NET_ADMIN) and the ip command (iproute2).
func AddPodNetwork() (*PodNetwork, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("pod network: the ip command (iproute2) is needed: %w", err)
	}
	if err := os.MkdirAll(PodNetworkStateDir, 0o755); err != nil {
		return nil, fmt.Errorf("pod network: %w", err)
	}
	reclaimPodNetworks()
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("pod network: listing routes: %w: %s", err, bytes.TrimSpace(out))
	}
	routed := routedPrefixes(string(out))
	start := rand.IntN(254)
	var lastErr error
	for i := 0; i < 254; i++ {
		n := (start+i)%254 + 1
		cidr := netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", n))
		if overlapsAny(cidr, routed) {
			continue
		}
		claim := claimPath(cidr)
		f, err := os.OpenFile(claim, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			continue // another cluster's
		}
		_, werr := fmt.Fprintf(f, "%d\n", os.Getpid())
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			_ = os.Remove(claim)
			return nil, fmt.Errorf("pod network: writing %s: %w", claim, werr)
		}
		out, err := exec.Command("ip", "route", "add", "local", cidr.String(), "dev", "lo", "proto", podNetworkProto).CombinedOutput()
		if err != nil {
			_ = os.Remove(claim)
			// "File exists": something else routed it between the listing and now.
			lastErr = fmt.Errorf("ip route add local %s dev lo: %w: %s", cidr, err, bytes.TrimSpace(out))
			if strings.Contains(string(out), "File exists") {
				continue
			}
			return nil, fmt.Errorf("pod network: %w", lastErr)
		}
		return &PodNetwork{CIDR: cidr, inUse: map[netip.Addr]string{}}, nil
	}
	if lastErr == nil {
		lastErr = errors.New("every 10.244.N.0/24 overlaps an existing route or is claimed")
	}
	return nil, fmt.Errorf("pod network: no free 10.244.N.0/24: %w", lastErr)
}

func claimPath(cidr netip.Prefix) string {
	return filepath.Join(PodNetworkStateDir, "podnet-"+cidr.Addr().String())
}

// reclaimPodNetworks removes the routes and claims of pod networks whose owning process is gone:
// a claim whose pid does not run, and a tagged route without a claim (its owner removes the route
// before the claim, and claims before it routes).
func reclaimPodNetworks() {
	out, err := exec.Command("ip", "-4", "route", "show", "table", "local", "proto", podNetworkProto).Output()
	if err != nil {
		return
	}
	for _, p := range routedPrefixes(string(out)) {
		if !strings.HasPrefix(p.String(), "10.244.") || p.Bits() != 24 {
			continue
		}
		claim := claimPath(p)
		b, err := os.ReadFile(claim)
		if err == nil {
			pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
			if perr == nil && pid > 0 && syscall.Kill(pid, 0) == nil {
				continue // alive
			}
		} else if !os.IsNotExist(err) {
			continue
		}
		_ = exec.Command("ip", "route", "del", "local", p.String(), "dev", "lo", "table", "local").Run()
		_ = os.Remove(claim)
	}
	// claims without a route (the owner died between claiming and routing, or after removing it)
	entries, _ := os.ReadDir(PodNetworkStateDir)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(PodNetworkStateDir, e.Name()))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err == nil && pid > 0 && syscall.Kill(pid, 0) != nil {
			_ = os.Remove(filepath.Join(PodNetworkStateDir, e.Name()))
		}
	}
}

// routedPrefixes parses the destinations of `ip -4 route show table all`.
func routedPrefixes(out string) []netip.Prefix {
	var ps []netip.Prefix
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		switch dst {
		case "local", "broadcast", "unicast", "blackhole", "unreachable", "prohibit", "throw", "anycast", "multicast", "nat":
			if len(f) < 2 {
				continue
			}
			dst = f[1]
		}
		if dst == "default" {
			continue
		}
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		if p, err := netip.ParsePrefix(dst); err == nil {
			ps = append(ps, p.Masked())
		}
	}
	return ps
}

func overlapsAny(p netip.Prefix, ps []netip.Prefix) bool {
	for _, q := range ps {
		if p.Overlaps(q) {
			return true
		}
	}
	return false
}

// Remove deletes the local route, then the claim. Addresses still bound by processes stop
// working.
func (n *PodNetwork) Remove() error {
	out, err := exec.Command("ip", "route", "del", "local", n.CIDR.String(), "dev", "lo", "table", "local").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip route del local %s: %w: %s", n.CIDR, err, bytes.TrimSpace(out))
	}
	if err := os.Remove(claimPath(n.CIDR)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing the claim of %s: %w", n.CIDR, err)
	}
	return nil
}

// Allocate returns the lowest free address of the network (from .1; .0 and .255 are never
// handed out) and records it as owner's.
func (n *PodNetwork) Allocate(owner string) (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for a := n.CIDR.Addr().Next(); n.CIDR.Contains(a); a = a.Next() {
		if a.As4()[3] == 255 {
			break
		}
		if _, used := n.inUse[a]; !used {
			n.inUse[a] = owner
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("pod network %s is full", n.CIDR)
}

// Release frees a.
func (n *PodNetwork) Release(a netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.inUse, a)
}

// Contains reports whether ip is in the pod network.
func (n *PodNetwork) Contains(ip net.IP) bool {
	a, ok := netip.AddrFromSlice(ip)
	return ok && n.CIDR.Contains(a.Unmap())
}
