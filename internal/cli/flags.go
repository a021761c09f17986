package cli

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
)

// FloorFlags collects repeated --floor flags (keeper, simulate): CADENCE/SOURCE=SHARE, repeated or
// comma-separated.
type FloorFlags []policy.Floor

func (f *FloorFlags) String() string {
	parts := make([]string, len(*f))
	for i, x := range *f {
		parts[i] = x.String()
	}
	return strings.Join(parts, ",")
}

func (f *FloorFlags) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		fl, err := policy.ParseFloor(strings.TrimSpace(part))
		if err != nil {
			return err
		}
		*f = append(*f, fl)
	}
	return nil
}

// RescheduleFlag is a policy.Reschedule flag (keeper, simulate).
type RescheduleFlag struct{ Policy policy.Reschedule }

func (r *RescheduleFlag) String() string { return r.Policy.String() }

func (r *RescheduleFlag) Set(s string) (err error) {
	r.Policy, err = policy.ParseReschedule(s)
	return err
}

// RESTConfig loads the Kubernetes client configuration: the kubeconfig file when given, else
// controller-runtime's usual order ($KUBECONFIG, in-cluster, ~/.kube/config).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the Kubernetes client configuration: %w", err)
	}
	return cfg, nil
}

// ReadToken reads the bearer token from a file, or from RENDERQUEUE_TOKEN when no file is given.
func ReadToken(file string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv("RENDERQUEUE_TOKEN")), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading the API token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", file)
	}
	return tok, nil
}

// DefaultOwnNamespace is the namespace OwnNamespace gives when nothing says where the process
// runs: config/default's.
const DefaultOwnNamespace = "renderqueue-system"

// serviceAccountNamespaceFile is where a Pod's service account token volume holds its namespace.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// OwnNamespace is the namespace this process runs in, and where that was learnt: $POD_NAMESPACE
// (the downward API, as config/manager sets it), else the Pod's service account namespace file,
// else DefaultOwnNamespace (a process outside a Pod).
func OwnNamespace() (namespace, source string) {
	return ownNamespace(os.Getenv("POD_NAMESPACE"), serviceAccountNamespaceFile)
}

func ownNamespace(env, file string) (namespace, source string) {
	if ns := strings.TrimSpace(env); ns != "" {
		return ns, "$POD_NAMESPACE"
	}
	if b, err := os.ReadFile(file); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns, file
		}
	}
	return DefaultOwnNamespace, "the default"
}

// NamespacedName parses v as namespace/name, or as a bare name in namespace ns; flag names the
// flag it came from, for the error.
func NamespacedName(flag, v, ns string) (types.NamespacedName, error) {
	n, name, ok := strings.Cut(v, "/")
	if !ok {
		n, name = ns, v
	}
	if len(validation.IsDNS1123Label(n)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("%s %q is not a name or namespace/name", flag, v)
	}
	return types.NamespacedName{Namespace: n, Name: name}, nil
}
