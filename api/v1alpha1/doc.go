// Package v1alpha1 holds the renderqueue.dev/v1alpha1 API: the RenderQueue resource, its defaults
// and validation (kubebuilder markers, compiled by controller-gen into the CRD under
// config/crd/bases), and the condition types and reasons the operator reports.
//
// Fractional knobs (priority.submittedBoost, priority.urgentMaxShare, priority.floors[].share) are
// decimal strings such as "2" or "0.2" rather than floats: Kubernetes API conventions discourage
// floats in resources, and a string round-trips exactly. The API server checks their format and
// range; Go code reads them with Priority.SubmittedBoostValue, Priority.UrgentMaxShareValue and
// Floor.ShareValue.
//
// +kubebuilder:object:generate=true
// +groupName=renderqueue.dev
package v1alpha1
