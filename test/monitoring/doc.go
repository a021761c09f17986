// Package monitoring tests what users install to monitor renderqueue against the code that
// exports the metrics: the alert rules of config/prometheus (promtool check rules and the
// promtool unit tests) and the Grafana dashboard of config/grafana (every panel's PromQL parsed
// with Prometheus's own parser, every metric it names exported by the keeper or the operator).
//
// It is a module of its own so that the Prometheus server module, which the PromQL parser comes
// from, stays out of the main module's dependencies. hack/test.sh runs it with the whole suite.
package monitoring
