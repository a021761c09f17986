package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// completeName is the name under which the binary completes the plugin's arguments: kubectl
// runs kubectl_complete-renderqueue, found on PATH, with the words of `kubectl renderqueue ...`
// typed so far, the last one the word being completed (k8s.io/kubectl's plugin completion).
const completeName = "kubectl_complete-renderqueue"

// Cobra's shell completion directives, printed as the last line (":4").
const (
	compNoFileComp = 4 // complete no file names
)

// pluginFlagsWithValue are the plugin's flags that take a value as the next word.
var pluginFlagsWithValue = []string{"-n", "--namespace", "--context", "--kubeconfig", "--cluster", "--user", "--timeout",
	"--url", "--token-file", "--shard-ca-file", "--shard-server-name", "--renderqueue"}

// pluginFlags are the flags offered when the word being completed starts with "-".
var pluginFlags = []string{"--namespace", "--context", "--kubeconfig", "--json", "--timeout"}

// runComplete prints the completions of the plugin's arguments (args: the words typed, the last
// the one to complete), one per line, then the directive: RenderQueue names (of the namespace
// the flags typed say, else the kubeconfig's) for NAME, "explain" beside them for the first word,
// namespaces after -n, flag names after "-"; nothing for a KEY. A listing that fails completes
// nothing (a completion must not print errors into the user's command line).
func runComplete(ctx context.Context, args []string, stdout io.Writer) {
	if len(args) == 0 {
		args = []string{""}
	}
	word, before := args[len(args)-1], args[:len(args)-1]
	kube := genericclioptions.NewConfigFlags(false)
	fs := pflag.NewFlagSet("complete", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	fs.SetOutput(io.Discard)
	kube.AddFlags(fs)
	_ = fs.Parse(before)
	positional := fs.Args()

	var out []string
	switch {
	case len(before) > 0 && slices.Contains(pluginFlagsWithValue, before[len(before)-1]):
		if prev := before[len(before)-1]; prev == "-n" || prev == "--namespace" {
			out = listNames(ctx, kube, namespaces)
		}
	case strings.HasPrefix(word, "-"):
		out = pluginFlags
	case len(positional) == 0:
		out = append([]string{"explain"}, listNames(ctx, kube, renderQueues)...)
	case len(positional) == 1 && positional[0] == "explain":
		out = listNames(ctx, kube, renderQueues)
	}
	for _, s := range out {
		if strings.HasPrefix(s, word) {
			_, _ = fmt.Fprintln(stdout, s)
		}
	}
	_, _ = fmt.Fprintf(stdout, ":%d\n", compNoFileComp)
}

// The resources listNames lists: namespaces, and RenderQueues in the flags' namespace.
var (
	namespaces   = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	renderQueues = rqv1.GroupVersion.WithResource("renderqueues")
)

// listNames lists the names of res (in the flags' namespace unless it is namespaces), sorted, or
// nothing when it cannot.
func listNames(ctx context.Context, kube *genericclioptions.ConfigFlags, res schema.GroupVersionResource) []string {
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return nil
	}
	cfg.Timeout = 5 * time.Second
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil
	}
	var ri dynamic.ResourceInterface = dc.Resource(res)
	if res != namespaces {
		ns, _, err := kube.ToRawKubeConfigLoader().Namespace()
		if err != nil {
			return nil
		}
		ri = dc.Resource(res).Namespace(ns)
	}
	list, err := ri.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(list.Items))
	for _, it := range list.Items {
		names = append(names, it.GetName())
	}
	slices.Sort(names)
	return names
}
