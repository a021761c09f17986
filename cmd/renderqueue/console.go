package main

import (
	"flag"
	"fmt"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/renderqueue/renderqueue/controllers"
	"github.com/renderqueue/renderqueue/pkg/console"
)

// consoleExtension serves the read-only web console (pkg/console) from the operator.
type consoleExtension struct {
	opts console.Options
}

// Flags registers --console and its options.
func (e *consoleExtension) Flags(fs *flag.FlagSet) { e.opts.BindFlags(fs) }

// Setup adds the console's sampler and server to mgr when --console is set; shards are asked at
// their Pod IP, as the reconciler does.
func (e *consoleExtension) Setup(mgr ctrl.Manager, log logr.Logger, _ string) error {
	if err := console.AddToManager(mgr, e.opts, controllers.PodIPResolver, log.WithName("console")); err != nil {
		return fmt.Errorf("web console: %w", err)
	}
	return nil
}
