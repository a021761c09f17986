package controllers

import (
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// ChildSelector selects the objects the operator manages: every child of a RenderQueue carries
// the label renderqueue.dev/queue (its RenderQueue's name).
func ChildSelector() labels.Selector {
	req, err := labels.NewRequirement(rqv1.LabelQueue, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant, valid label key
	}
	return labels.NewSelector().Add(*req)
}

// CacheOptions scope the manager's cache to what the operator manages: of the child kinds it
// reads (Pods, ConfigMaps, Services, ServiceAccounts, Roles, RoleBindings, PodDisruptionBudgets) only
// objects labelled renderqueue.dev/queue are listed, watched and held, never every Pod of the
// cluster; RenderQueues are held whole. Secrets are not read at all: the token and certificate
// Secrets are only written, and the store Secret a RenderQueue names is only referenced from the
// shard Pods (the operator's own shard CA Secret is read by name, uncached).
//
// namespaces, when given (--watch-namespaces), limits every cached kind to those namespaces, so
// that the operator needs its RBAC only there; none means every namespace.
func CacheOptions(namespaces ...string) cache.Options {
	children := cache.ByObject{Label: ChildSelector()}
	var defaults map[string]cache.Config
	if len(namespaces) > 0 {
		defaults = map[string]cache.Config{}
		for _, ns := range namespaces {
			defaults[ns] = cache.Config{}
		}
	}
	return cache.Options{DefaultNamespaces: defaults, ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:                   children,
		&corev1.ConfigMap{}:             children,
		&corev1.Service{}:               children,
		&corev1.ServiceAccount{}:        children,
		&rbacv1.Role{}:                  children,
		&rbacv1.RoleBinding{}:           children,
		&policyv1.PodDisruptionBudget{}: children,
	}}
}
