package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// repo is the repository root, from this package's directory.
const repo = "../.."

// EnvPromtool names the variable holding promtool's path; hack/test.sh sets it after installing
// Prometheus when it is missing (hack/prometheus.sh promtool).
const EnvPromtool = "RENDERQUEUE_PROMTOOL"

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// prometheusRule reads config/prometheus/prometheusrule.yaml, the one source of the rules.
func prometheusRule(t *testing.T) (ruleFile, map[string]any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "config", "prometheus", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       ruleFile       `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(b, &obj); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	if obj.APIVersion != "monitoring.coreos.com/v1" || obj.Kind != "PrometheusRule" {
		t.Fatalf("prometheusrule.yaml is a %s %s", obj.APIVersion, obj.Kind)
	}
	var generic map[string]any
	if err := yaml.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	spec, _ := generic["spec"].(map[string]any)
	return obj.Spec, spec
}

// promtool returns promtool's path: $RENDERQUEUE_PROMTOOL (which must then work), else PATH. It
// skips the test, saying how to run it, only when neither is there: `make test` always sets it.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvPromtool); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s=%s: %v", EnvPromtool, p, err)
		}
		return p
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	t.Skipf("promtool is not installed and %s is not set: run `make test` (hack/test.sh installs it with "+
		"hack/prometheus.sh) or `export %s=$(hack/prometheus.sh promtool | tail -n 1)`", EnvPromtool, EnvPromtool)
	return ""
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules checks the alerts users install: the rule file hack/prometheus.sh derives is
// the PrometheusRule's spec, promtool accepts it, and its unit tests (one at least for every
// alert) pass; every alert has a summary, a description and a runbook section that exists.
func TestAlertRules(t *testing.T) {
	spec, generic := prometheusRule(t)
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "renderqueue-alerts.yaml")
	run(t, repo, filepath.Join("hack", "prometheus.sh"), "rules", rulesPath)

	t.Run("the plain rule file is the PrometheusRule's spec", func(t *testing.T) {
		b, err := os.ReadFile(rulesPath)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := yaml.Unmarshal(b, &got); err != nil {
			t.Fatalf("hack/prometheus.sh rules: %v", err)
		}
		if !reflect.DeepEqual(got, generic) {
			t.Fatalf("hack/prometheus.sh rules differs from the PrometheusRule's spec:\n%s", b)
		}
	})

	alerts := map[string]rule{}
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts[r.Alert] = r
			}
		}
	}
	if len(alerts) < 7 {
		t.Fatalf("%d alerts", len(alerts))
	}

	t.Run("annotations, severity and runbook sections", func(t *testing.T) {
		runbook, err := os.ReadFile(filepath.Join(repo, "docs", "runbook.md"))
		if err != nil {
			t.Fatal(err)
		}
		anchors := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(runbook), -1) {
			anchors[githubAnchor(m[1])] = true
		}
		const prefix = "https://github.com/renderqueue/renderqueue/blob/main/docs/runbook.md#"
		for name, r := range alerts {
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s has no %s", name, a)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", name, s)
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], prefix)
			if !ok || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q is not a section of docs/runbook.md", name, r.Annotations["runbook_url"])
			}
			if anchor != strings.ToLower(name) {
				t.Errorf("%s: its runbook section should be titled %s", name, name)
			}
		}
	})

	t.Run("every metric an alert reads is exported", func(t *testing.T) {
		names := exportedMetrics(t)
		for name, r := range alerts {
			used, err := metricNames(t, r.Expr)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			for _, m := range used {
				if _, ok := names[m]; !ok {
					t.Errorf("%s reads %s, which neither the keeper nor the operator exports", name, m)
				}
			}
		}
	})

	tool := promtool(t)
	t.Run("promtool check rules", func(t *testing.T) {
		out := run(t, dir, tool, "check", "rules", rulesPath)
		if !strings.Contains(out, "SUCCESS") {
			t.Fatalf("promtool check rules: %s", out)
		}
	})

	t.Run("promtool test rules", func(t *testing.T) {
		tests, err := filepath.Glob(filepath.Join(repo, "config", "prometheus", "tests", "*.test.yaml"))
		if err != nil || len(tests) == 0 {
			t.Fatalf("no promtool tests in config/prometheus/tests (%v)", err)
		}
		tested := map[string]bool{}
		var args []string
		for _, f := range tests {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range regexp.MustCompile(`(?m)^\s*alertname:\s*(\S+)`).FindAllStringSubmatch(string(b), -1) {
				tested[m[1]] = true
			}
			dst := filepath.Join(dir, filepath.Base(f))
			if err := os.WriteFile(dst, b, 0o644); err != nil {
				t.Fatal(err)
			}
			args = append(args, dst)
		}
		for name := range alerts {
			if !tested[name] {
				t.Errorf("alert %s has no promtool unit test in config/prometheus/tests", name)
			}
		}
		out := run(t, dir, tool, append([]string{"test", "rules"}, args...)...)
		if !strings.Contains(out, "SUCCESS") {
			t.Fatalf("promtool test rules: %s", out)
		}
	})
}

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case, spaces to hyphens,
// punctuation other than hyphens and underscores dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}
