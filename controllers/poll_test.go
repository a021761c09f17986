package controllers

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func TestPollShards(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(shardapi.Status{Shard: "s-ok", Status: shardapi.StatusEmpty})
	}))
	defer ok.Close()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers before the poll gives up
	}))
	defer slow.Close()
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("<html>"))
	}))
	defer garbage.Close()

	pod := func(name, ip string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.PodStatus{PodIP: ip}}
	}
	urls := map[string]string{"s-ok": ok.URL, "s-slow": slow.URL, "s-garbage": garbage.URL, "s-impostor": ok.URL}
	resolve := func(p *corev1.Pod) (string, error) {
		if p.Status.PodIP == "" {
			return PodIPResolver(p)
		}
		return urls[p.Name], nil
	}
	pods := map[string]*corev1.Pod{
		"s-ok": pod("s-ok", "1"), "s-slow": pod("s-slow", "1"), "s-garbage": pod("s-garbage", "1"),
		"s-impostor": pod("s-impostor", "1"), "s-noip": pod("s-noip", ""),
	}
	names := []string{"s-ok", "s-slow", "s-garbage", "s-impostor", "s-noip", "s-nopod"}
	reports := pollShards(context.Background(), http.DefaultClient, resolve, 200*time.Millisecond, names, pods)
	if len(reports) != len(names) {
		t.Fatalf("%d reports for %d shards", len(reports), len(names))
	}
	want := map[string]struct {
		reachable, asked bool
		err              string
	}{
		"s-ok":       {true, true, ""},
		"s-slow":     {false, true, "unreachable"},
		"s-garbage":  {false, true, "decoding the status"},
		"s-impostor": {false, true, `reports shard "s-ok", not "s-impostor"`},
		"s-noip":     {false, false, "no IP"},
		"s-nopod":    {false, false, "no Pod"},
	}
	for i, rep := range reports {
		if rep.Name != names[i] {
			t.Errorf("report %d is %s, want %s (order of names)", i, rep.Name, names[i])
		}
		w := want[rep.Name]
		if rep.Reachable() != w.reachable || rep.Asked != w.asked {
			t.Errorf("%s: reachable %v asked %v, want %v %v (err %v)", rep.Name, rep.Reachable(), rep.Asked, w.reachable, w.asked, rep.Err)
		}
		if w.err == "" && rep.Err != nil || w.err != "" && (rep.Err == nil || !strings.Contains(rep.Err.Error(), w.err)) {
			t.Errorf("%s: error %v, want one containing %q", rep.Name, rep.Err, w.err)
		}
	}
}

func TestPodIPResolver(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		tls  string // the Pod's renderqueue.dev/tls label
		want string
	}{
		{"10.0.0.7", "", "http://10.0.0.7:8080"},
		{"fd00:10:244::7", "", "http://[fd00:10:244::7]:8080"},
		{"::1", "", "http://[::1]:8080"},
		{"10.0.0.7", "true", "https://10.0.0.7:8080"},
		{"fd00:10:244::7", "true", "https://[fd00:10:244::7]:8080"},
		{"10.0.0.7", "false", "http://10.0.0.7:8080"},
	} {
		pod := &corev1.Pod{Status: corev1.PodStatus{PodIP: tc.ip}}
		if tc.tls != "" {
			pod.Labels = map[string]string{rqv1.LabelTLS: tc.tls}
		}
		got, err := PodIPResolver(pod)
		if err != nil || got != tc.want {
			t.Errorf("PodIPResolver(%s) = %q, %v; want %q", tc.ip, got, err, tc.want)
		}
		if _, err := url.Parse(got + "/v1/status"); err != nil {
			t.Errorf("%s/v1/status is not a URL: %v", got, err)
		}
	}
	if _, err := PodIPResolver(&corev1.Pod{}); err == nil {
		t.Error("a Pod without an IP must not resolve")
	}
}
