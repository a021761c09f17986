package httpserve

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestBearerOrProxied: the token is taken from Authorization or from the proxied header, "Bearer
// <token>" in either; a wrong or missing one is 401 and the handler does not run; no token
// guards nothing.
func TestBearerOrProxied(t *testing.T) {
	const proxied = "X-Proxied-Authorization"
	ran := false
	h := BearerOrProxied("tok", proxied, func(w http.ResponseWriter, _ *http.Request) { ran = true })
	for _, tc := range []struct {
		name    string
		headers map[string]string
		code    int
	}{
		{"Authorization", map[string]string{"Authorization": "Bearer tok"}, 200},
		{"proxied", map[string]string{proxied: "Bearer tok"}, 200},
		{"proxied, a wrong Authorization beside it", map[string]string{proxied: "Bearer tok", "Authorization": "Basic x"}, 200},
		{"none", nil, 401},
		{"wrong", map[string]string{"Authorization": "Bearer tik"}, 401},
		{"wrong proxied", map[string]string{proxied: "Bearer tik"}, 401},
		{"without Bearer", map[string]string{proxied: "tok"}, 401},
	} {
		ran = false
		req := httptest.NewRequest(http.MethodGet, "/v1/rows?key=a", nil)
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h(rec, req)
		if rec.Code != tc.code || ran != (tc.code == 200) {
			t.Errorf("%s: %d (handler ran %v), want %d", tc.name, rec.Code, ran, tc.code)
		}
	}
	open := BearerOrProxied("", proxied, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })
	rec := httptest.NewRecorder()
	open(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != 204 {
		t.Errorf("without a token: %d, want the handler's 204", rec.Code)
	}
}
