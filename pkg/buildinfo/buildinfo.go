// Package buildinfo exports renderqueue_build_info, the Prometheus info metric every renderqueue
// process (operator and keeper) serves: a constant 1 whose labels say which build is running.
package buildinfo

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricName is the name of the build info metric.
const MetricName = "renderqueue_build_info"

// Info is what renderqueue_build_info reports about a build.
type Info struct {
	// Version is the release version (set at link time; "dev" otherwise).
	Version string
	// Revision is the VCS revision the binary was built from, "unknown" when the build did not
	// record one (go build outside a checkout, -buildvcs=false).
	Revision string
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string
}

// Read returns the Info of the running binary with the given version.
func Read(version string) Info {
	info := Info{Version: version, Revision: "unknown", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				info.Revision = s.Value
			}
		}
	}
	return info
}

// NewCollector returns a collector of renderqueue_build_info{component, version, revision,
// goversion} = 1. component says which part of renderqueue the process is ("operator", "keeper").
func NewCollector(component string, info Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricName,
		Help: "A constant 1 labelled with the running build: component (operator, keeper), version, revision, goversion.",
		ConstLabels: prometheus.Labels{
			"component": component, "version": info.Version, "revision": info.Revision, "goversion": info.GoVersion,
		},
	})
	g.Set(1)
	return g
}
