package kube

import (
	"context"
	"errors"
	"fmt"
	"reflect"

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
