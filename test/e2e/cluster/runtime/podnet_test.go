package runtime

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestRoutedPrefixes(t *testing.T) {
	out := `default via 192.0.2.1 dev eth0
192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2
local 127.0.0.0/8 dev lo table local proto kernel scope host src 127.0.0.1
local 10.244.7.0/24 dev lo table local proto 190 scope host
broadcast 127.255.255.255 dev lo table local proto kernel scope link src 127.0.0.1
10.244.9.5 via 192.0.2.1 dev eth0
`
	got := routedPrefixes(out)
	for _, p := range []string{"10.244.7.0/24", "10.244.9.5/32", "127.0.0.0/8"} {
		if !overlapsAny(netip.MustParsePrefix(p), got) {
			t.Errorf("%s not found in %v", p, got)
		}
	}
	if overlapsAny(netip.MustParsePrefix("10.244.8.0/24"), got) {
		t.Errorf("10.244.8.0/24 reported routed: %v", got)
	}
}

func TestPodNetworkAllocate(t *testing.T) {
	n := &PodNetwork{CIDR: netip.MustParsePrefix("10.244.5.0/24"), inUse: map[netip.Addr]string{}}
	a, _ := n.Allocate("a")
	b, _ := n.Allocate("b")
	if a.String() != "10.244.5.1" || b.String() != "10.244.5.2" {
		t.Fatalf("first addresses %s, %s", a, b)
	}
	n.Release(a)
	if c, _ := n.Allocate("c"); c != a {
		t.Errorf("the lowest free address is %s, got %s", a, c)
	}
	for i := 0; i < 252; i++ { // .3 to .254
		if _, err := n.Allocate("x"); err != nil {
			t.Fatalf("allocation %d: %v", i+3, err)
		}
	}
	if x, err := n.Allocate("full"); err == nil {
		t.Errorf("a full /24 handed out %s", x)
	}
}

// TestPodNetworkReclaim: the route and claim of a pod network whose owner died are removed.
func TestPodNetworkReclaim(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (routes)")
	}
	n, err := AddPodNetwork()
	if err != nil {
		t.Fatal(err)
	}
	routed := func() bool {
		out, err := exec.Command("ip", "-4", "route", "show", "table", "local", n.CIDR.String()).Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(out), n.CIDR.String())
	}
	if !routed() {
		t.Fatalf("%s is not routed", n.CIDR)
	}
	// a pid that ran and is gone
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(claimPath(n.CIDR), []byte(fmt.Sprintf("%d\n", cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	reclaimPodNetworks()
	if routed() {
		_ = n.Remove()
		t.Fatalf("the route of %s, whose owner is gone, is still there", n.CIDR)
	}
	if _, err := os.Stat(claimPath(n.CIDR)); !os.IsNotExist(err) {
		t.Errorf("the claim of %s is still there: %v", n.CIDR, err)
	}
}
