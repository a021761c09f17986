package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestOwnNamespace: $POD_NAMESPACE first, then the service account's namespace file, then the
// default; each says where it came from.
func TestOwnNamespace(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "namespace")
	missing := filepath.Join(dir, "missing")
	if err := os.WriteFile(file, []byte("platform-rq\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		// env is $POD_NAMESPACE, file the service account namespace file's path.
		env, file string
		// want and from: the namespace and where it is said to come from.
		want, from string
	}{
		{name: "downward API", env: "team-a", file: file, want: "team-a", from: "$POD_NAMESPACE"},
		{name: "service account", env: "", file: file, want: "platform-rq", from: file},
		{name: "blank env", env: "  ", file: file, want: "platform-rq", from: file},
		{name: "outside a Pod", env: "", file: missing, want: DefaultOwnNamespace, from: "the default"},
		{name: "empty file", env: "", file: empty, want: DefaultOwnNamespace, from: "the default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, from := ownNamespace(tc.env, tc.file)
			if ns != tc.want || from != tc.from {
				t.Errorf("ownNamespace = %q from %q, want %q from %q", ns, from, tc.want, tc.from)
			}
		})
	}
}

// TestNamespacedName: a bare name is in the namespace given; namespace/name as written; anything
// else is refused naming the flag.
func TestNamespacedName(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want types.NamespacedName
		err  bool
	}{
		{v: "renderqueue-shard-ca", want: types.NamespacedName{Namespace: "platform-rq", Name: "renderqueue-shard-ca"}},
		{v: "other/ca.v2", want: types.NamespacedName{Namespace: "other", Name: "ca.v2"}},
		{v: "a/b/c", err: true},
		{v: "Upper/ca", err: true},
		{v: "/ca", err: true},
		{v: "ns/", err: true},
		{v: "ca_x", err: true},
	} {
		got, err := NamespacedName("--shard-ca-secret", tc.v, "platform-rq")
		switch {
		case tc.err && (err == nil || !strings.Contains(err.Error(), "--shard-ca-secret")):
			t.Errorf("%q: err = %v, want an error naming the flag", tc.v, err)
		case !tc.err && (err != nil || got != tc.want):
			t.Errorf("%q: %v, %v; want %v", tc.v, got, err, tc.want)
		}
	}
}
