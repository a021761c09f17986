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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
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

// RenderQueue watches the RenderQueue namespace/name through the Kubernetes API (cfg)
// and takes its shards from status.shards: each shard with a url, with its due count. Shards
// added or removed by a rebalance are followed as the operator records them; the set is empty
// while the object does not exist. The worker's ServiceAccount needs get, list and watch on
// renderqueues with resourceNames [name] (config/samples/workers).
func RenderQueue(cfg *rest.Config, namespace, name string) (client.Discovery, error) {
	if namespace == "" || name == "" {
		return nil, errors.New("RenderQueue discovery: namespace and name are required")
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("RenderQueue discovery: %w", err)
	}
	return &rqDiscovery{dc: dc, namespace: namespace, name: name}, nil
}

type rqDiscovery struct {
	dc              dynamic.Interface
	namespace, name string
}

// renderQueues is the RenderQueue resource.
var renderQueues = rqv1.GroupVersion.WithResource("renderqueues")

// ShardsOf returns the shards of a RenderQueue's status that have a URL, in status order.
func ShardsOf(rq *rqv1.RenderQueue) []client.Shard {
	var out []client.Shard
	for _, s := range rq.Status.Shards {
		if s.URL == "" {
			continue
		}
		out = append(out, client.Shard{Name: s.Name, URL: s.URL, Due: s.Due, DueKnown: true})
	}
	return out
}

func (d *rqDiscovery) Run(ctx context.Context, update func([]client.Shard)) error {
	inf := dynamicinformer.NewFilteredDynamicInformer(d.dc, renderQueues, d.namespace, 0, toolscache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", d.name).String()
		}).Informer()
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return fmt.Errorf("watching renderqueue %s/%s: %w", d.namespace, d.name, err)
	}
	go inf.RunWithContext(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx done
	}
	var last []client.Shard
	first := true
	for {
		var list []client.Shard
		obj, exists, err := inf.GetStore().GetByKey(d.namespace + "/" + d.name)
		if err != nil {
			return fmt.Errorf("reading renderqueue %s/%s from the watch cache: %w", d.namespace, d.name, err)
		}
		if exists {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				return fmt.Errorf("renderqueue %s/%s: the watch cache holds a %T", d.namespace, d.name, obj)
			}
			var rq rqv1.RenderQueue
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &rq); err != nil {
				return fmt.Errorf("decoding renderqueue %s/%s: %w", d.namespace, d.name, err)
			}
			list = ShardsOf(&rq)
		}
		if first || !reflect.DeepEqual(list, last) {
			update(list)
			last, first = list, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
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
