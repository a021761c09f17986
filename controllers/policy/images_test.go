package policy

import (
	"strings"
	"testing"
)

func TestImageAllowlist(t *testing.T) {
	a, err := ParseImageAllowlist([]string{"registry.example.com/renderqueue:*", " mirror.example/team/* ", "",
		"docker.io/library/renderqueue:v1", "registry.example.com/pinned@*"})
	if err != nil {
		t.Fatal(err)
	}
	for image, want := range map[string]bool{
		"registry.example.com/renderqueue:v0.2.0":               true,
		"registry.example.com/renderqueue:":                     false, // a prefix alone is not an image
		"registry.example.com/renderqueue-evil:v1":              false,
		"registry.example.com/renderqueue":                      false,
		"registry.example.com/other:v1":                         false,
		"mirror.example/team/renderqueue:v1":                    true,
		"mirror.example/team/sub/renderqueue@sha256:abc":        true,
		"mirror.example/teammate/x:v1":                          false,
		"docker.io/library/renderqueue:v1":                      true,
		"renderqueue:v1":                                        false, // compared as written
		"registry.example.com/pinned@sha256:0123":               true,
		"registry.example.com/pinned:latest":                    false,
		"evil.example/registry.example.com/renderqueue:v0.2.0":  false,
		"registry.example.com/renderqueue:v1 registry.evil/x:1": true, // the API refuses whitespace in spec.image
	} {
		if got := a.Allows(image); got != want {
			t.Errorf("Allows(%q) = %v, want %v", image, got, want)
		}
	}
	if !(ImageAllowlist{}).Allows("anything:at-all") {
		t.Error("the empty allowlist refuses an image")
	}
	if got := a.String(); got != "registry.example.com/renderqueue:*,mirror.example/team/*,docker.io/library/renderqueue:v1,registry.example.com/pinned@*" {
		t.Errorf("String() = %q", got)
	}

	for _, bad := range []string{"registry.example.com/render*", "*", "registry.example.com/*/renderqueue:v1", "a b", "/*x"} {
		if _, err := ParseImageAllowlist([]string{bad}); err == nil {
			t.Errorf("ParseImageAllowlist(%q) accepted it", bad)
		} else if !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseImageAllowlist(%q) = %v, which does not name the entry", bad, err)
		}
	}
}
