package metricsapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/logkeys"
)

// The scaler endpoint serves one RenderQueue's due count as plain JSON, for autoscalers that read
// an HTTP API rather than external.metrics.k8s.io — KEDA's metrics-api trigger, in clusters where
// KEDA already owns the external metrics APIService:
//
//	GET /scaler/v1/namespaces/<namespace>/renderqueues/<name>
//	Authorization: Bearer <a Kubernetes token>
//
//	200 {"namespace":"render","name":"web","due":48210,"exact":true,"dueAsOf":"2026-05-04T10:30:00Z"}
//	503 {"namespace":"render","name":"web","exact":false,"dueLowerBound":48210,"dueAsOf":"…","error":"…"}
//
// The value is at the JSON path "due". It is the same figure and the same rule as renderqueue_due:
// while the count is not exact (or has never been computed) the answer is 503 with no "due" field,
// so the trigger fails and the HPA KEDA drives holds its replica count instead of scaling on a
// lower bound. The token is authenticated with a TokenReview and the caller must be allowed to
// get the RenderQueue (a SubjectAccessReview for verb get on renderqueues.renderqueue.dev/<name>
// in <namespace>), so whoever may read the RenderQueue may read its count and nobody else. Both
// reviews are cached (a minute for tokens, five minutes for allowed, thirty seconds for denied).
//
// The operator needs to create TokenReviews and SubjectAccessReviews for this (the kubebuilder
// RBAC markers are in controllers/metrics.go, whence config/rbac is generated).

// ScalerPathPrefix is the path prefix the scaler endpoint is served under.
const ScalerPathPrefix = "/scaler/"

// ScalerValueLocation is the JSON path of the value in a 200 answer (KEDA's valueLocation).
const ScalerValueLocation = "due"

// ScalerResponse is the JSON body of the scaler endpoint. Due is set only with status 200;
// DueLowerBound and Error only otherwise.
type ScalerResponse struct {
	Namespace     string     `json:"namespace"`
	Name          string     `json:"name"`
	Due           *int64     `json:"due,omitempty"`
	Exact         bool       `json:"exact"`
	DueLowerBound *int64     `json:"dueLowerBound,omitempty"`
	DueAsOf       *time.Time `json:"dueAsOf,omitempty"`
	Error         string     `json:"error,omitempty"`
}

// ScalerOptions configure NewScalerHandler.
type ScalerOptions struct {
	// Reader reads RenderQueues (the manager's client, which reads from its cache). Required.
	Reader client.Reader
	// Authenticator authenticates the bearer token; Authorizer decides whether the caller may
	// get the RenderQueue. Both required; NewDelegatingAuth builds them from a REST config.
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	// Metrics counts requests (api="scaler"); nil counts nothing.
	Metrics *RequestMetrics
	// Log receives refused and failed requests at V(1).
	Log logr.Logger
}

// NewDelegatingAuth returns an authenticator (TokenReview) and an authorizer
// (SubjectAccessReview) that delegate to the API server cfg reaches, with caches; anonymous
// requests are refused.
func NewDelegatingAuth(cfg *rest.Config) (authenticator.Request, authorizer.Authorizer, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("scaler endpoint: kubernetes client: %w", err)
	}
	backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: false},
		TokenAccessReviewClient:  kube.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      backoff,
		CacheTTL:                 time.Minute,
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("scaler endpoint: authenticator: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: kube.AuthorizationV1(),
		AllowCacheTTL:             5 * time.Minute,
		DenyCacheTTL:              30 * time.Second,
		WebhookRetryBackoff:       backoff,
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("scaler endpoint: authorizer: %w", err)
	}
	return authn, authz, nil
}

// NewScalerHandler returns the scaler endpoint's handler, to be served under ScalerPathPrefix.
func NewScalerHandler(opts ScalerOptions) (http.Handler, error) {
	if opts.Reader == nil || opts.Authenticator == nil || opts.Authorizer == nil {
		return nil, errors.New("scaler endpoint: Reader, Authenticator and Authorizer are required")
	}
	h := &scalerHandler{opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ScalerPathPrefix+"v1/namespaces/{namespace}/renderqueues/{name}", h.serve)
	mux.HandleFunc(ScalerPathPrefix, func(w http.ResponseWriter, r *http.Request) {
		h.opts.Metrics.observeUnauthorized(APIScaler, ReasonBadRequest)
		writeScalerError(w, http.StatusNotFound, ScalerResponse{
			Error: fmt.Sprintf("no such endpoint %s %s: use GET %sv1/namespaces/<namespace>/renderqueues/<name>", r.Method, r.URL.Path, ScalerPathPrefix)})
	})
	return mux, nil
}

type scalerHandler struct {
	opts ScalerOptions
}

func (h *scalerHandler) serve(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	log := h.opts.Log.WithValues(logkeys.Namespace, ns, logkeys.RenderQueue, name)
	resp := ScalerResponse{Namespace: ns, Name: name}

	// Authenticate and authorize before anything about the request is trusted or counted by
	// namespace.
	res, ok, err := h.opts.Authenticator.AuthenticateRequest(r)
	if err != nil || !ok {
		log.V(1).Info("scaler request not authenticated", "error", fmt.Sprint(err))
		h.opts.Metrics.observeUnauthorized(APIScaler, ReasonUnauthenticated)
		w.Header().Set("WWW-Authenticate", `Bearer realm="renderqueue"`)
		resp.Namespace, resp.Name = "", ""
		resp.Error = "unauthenticated: send a Kubernetes token (a ServiceAccount token) as Authorization: Bearer <token>"
		writeScalerError(w, http.StatusUnauthorized, resp)
		return
	}
	if errs := append(validation.IsDNS1123Label(ns), validation.IsDNS1123Subdomain(name)...); len(errs) > 0 {
		h.opts.Metrics.observeUnauthorized(APIScaler, ReasonBadRequest)
		resp.Namespace, resp.Name = "", ""
		resp.Error = fmt.Sprintf("bad namespace %q or RenderQueue name %q: %s", ns, name, strings.Join(errs, "; "))
		writeScalerError(w, http.StatusBadRequest, resp)
		return
	}
	decision, reason, err := h.opts.Authorizer.Authorize(r.Context(), authorizer.AttributesRecord{
		User: res.User, Verb: "get", Namespace: ns, APIGroup: rqv1.Group, APIVersion: rqv1.GroupVersion.Version,
		Resource: "renderqueues", Name: name, ResourceRequest: true,
	})
	if err != nil {
		log.Error(err, "scaler request authorization failed", "user", res.User.GetName())
		h.opts.Metrics.observeUnauthorized(APIScaler, ReasonInternal)
		resp.Error = fmt.Sprintf("authorizing %s: %v", res.User.GetName(), err)
		writeScalerError(w, http.StatusInternalServerError, resp)
		return
	}
	if decision != authorizer.DecisionAllow {
		log.V(1).Info("scaler request forbidden", "user", res.User.GetName(), "reason", reason)
		h.opts.Metrics.observeUnauthorized(APIScaler, ReasonForbidden)
		resp.Error = fmt.Sprintf("%s may not get renderqueues.%s %q in namespace %q", res.User.GetName(), rqv1.Group, name, ns)
		writeScalerError(w, http.StatusForbidden, resp)
		return
	}

	var rq rqv1.RenderQueue
	if err := h.opts.Reader.Get(r.Context(), types.NamespacedName{Namespace: ns, Name: name}, &rq); err != nil {
		if apierrors.IsNotFound(err) {
			err = fmt.Errorf("%w: RenderQueue %q not found in namespace %q", ErrNoneSelected, name, ns)
			h.opts.Metrics.observe(APIScaler, ns, err)
			resp.Error = err.Error()
			writeScalerError(w, http.StatusNotFound, resp)
			return
		}
		err = fmt.Errorf("reading RenderQueue %s/%s: %w", ns, name, err)
		log.Error(err, "scaler request failed")
		h.opts.Metrics.observe(APIScaler, ns, err)
		resp.Error = err.Error()
		writeScalerError(w, http.StatusInternalServerError, resp)
		return
	}
	if rq.Status.DueAsOf != nil {
		asOf := rq.Status.DueAsOf.UTC()
		resp.DueAsOf = &asOf
	}
	resp.Exact = rq.Status.DueExact
	_, err = Values([]rqv1.RenderQueue{rq}, MetricDue, nil)
	h.opts.Metrics.observe(APIScaler, ns, err)
	if err != nil {
		log.V(1).Info("scaler request failed", "error", err.Error())
		if rq.Status.DueAsOf != nil {
			lb := rq.Status.Due
			resp.DueLowerBound = &lb
		}
		resp.Error = err.Error()
		writeScalerError(w, http.StatusServiceUnavailable, resp)
		return
	}
	due := rq.Status.Due
	resp.Due = &due
	writeScalerJSON(w, http.StatusOK, resp)
}

func writeScalerError(w http.ResponseWriter, code int, resp ScalerResponse) {
	resp.Due = nil // never a value an autoscaler could read on an error
	writeScalerJSON(w, code, resp)
}

func writeScalerJSON(w http.ResponseWriter, code int, resp ScalerResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(resp)
}
