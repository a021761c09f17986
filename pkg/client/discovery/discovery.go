package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/client"
)

// Static is a fixed list of shard base URLs, e.g. http://10.0.0.7:8080.
func Static(urls ...string) (client.Discovery, error) {
	if len(urls) == 0 {
		return nil, errors.New("static discovery: no shard URL")
	}
	seen := map[string]bool{}
	var list []client.Shard
	for _, u := range urls {
		base, err := checkBaseURL(u)
		if err != nil {
			return nil, fmt.Errorf("static discovery: %w", err)
		}
		if seen[base] {
			return nil, fmt.Errorf("static discovery: shard URL %s given twice", base)
		}
		seen[base] = true
		list = append(list, client.Shard{Name: base, URL: base})
	}
	return staticDiscovery(list), nil
}

type staticDiscovery []client.Shard

func (s staticDiscovery) Run(ctx context.Context, update func([]client.Shard)) error {
	update(append([]client.Shard(nil), s...))
	<-ctx.Done()
	return nil
}

// DNS resolves host (the headless Service <name>-shards, e.g.
// "web-shards.default.svc.cluster.local") every refresh (default 10 s) and takes every address
// as a shard at http://<address>:port. The Service lists the shards whose Pods are Ready. DNS
// knows no due counts, so claims weigh the shards alike; a failed lookup keeps the last set.
func DNS(host string, port int, refresh time.Duration) (client.Discovery, error) {
	if host == "" {
		return nil, errors.New("DNS discovery: no host name")
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("DNS discovery: port %d is not within 1..65535", port)
	}
	if refresh < 0 {
		return nil, fmt.Errorf("DNS discovery: negative refresh %v", refresh)
	}
	if refresh == 0 {
		refresh = 10 * time.Second
	}
	return &dnsDiscovery{scheme: "http", host: host, port: port, refresh: refresh, lookup: net.DefaultResolver.LookupHost}, nil
}

// DNSHTTPS is DNS for shards that serve HTTPS (spec.tls OperatorIssued): https://<address>:port.
// Verify them for the Service's name (client.TLSOptions.ServerName: host, when it is
// <name>-shards.<namespace>.svc, or rqv1.ShardServerName), not the address dialled.
func DNSHTTPS(host string, port int, refresh time.Duration) (client.Discovery, error) {
	d, err := DNS(host, port, refresh)
	if err != nil {
		return nil, err
	}
	d.(*dnsDiscovery).scheme = "https"
	return d, nil
}

type dnsDiscovery struct {
	scheme  string // http or https
	host    string
	port    int
	refresh time.Duration
	lookup  func(ctx context.Context, host string) ([]string, error)
}

func (d *dnsDiscovery) Run(ctx context.Context, update func([]client.Shard)) error {
	var last []client.Shard
	first := true
	for {
		lctx, cancel := context.WithTimeout(ctx, min(d.refresh, 5*time.Second))
		addrs, err := d.lookup(lctx, d.host)
		cancel()
		var nf *net.DNSError
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && (!errors.As(err, &nf) || !nf.IsNotFound):
			// keep the last set: a DNS hiccup must not empty the worker fleet
		default:
			sort.Strings(addrs)
			list := make([]client.Shard, 0, len(addrs))
			for _, a := range addrs {
				u := d.scheme + "://" + net.JoinHostPort(a, strconv.Itoa(d.port))
				list = append(list, client.Shard{Name: a, URL: u})
			}
			if first || !reflect.DeepEqual(list, last) {
				update(list)
				last, first = list, false
			}
		}
		t := time.NewTimer(d.refresh)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// checkBaseURL validates a shard base URL and returns it without a trailing slash.
func checkBaseURL(s string) (string, error) {
	s = strings.TrimRight(strings.TrimSpace(s), "/")
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("shard URL %q is not an http(s) URL", s)
	}
	return s, nil
}
