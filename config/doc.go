// Package config holds the kustomize configuration of renderqueue (crd, rbac, manager, the
// metrics-api component, and the overlays default and without-metrics-api); it has no Go code.
// Its tests check the install manifests rendered from it into dist/ by `make dist`: that
// dist/install.yaml installs everything config/default declares with the image pinned, that
// dist/install-without-metrics-api.yaml is the same minus the metrics API component, and (with
// envtest) that kubectl applies both to a real kube-apiserver. `make verify-dist` checks that
// dist/ is the current rendering.
package config
