package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// TestReferenceCurrent checks that docs/crd-reference.md is what the generator makes of the API
// types now (`make crd-reference` rewrites it).
func TestReferenceCurrent(t *testing.T) {
	want, err := Generate(filepath.Join("..", "..", "api", "v1alpha1"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", "..", "docs", "crd-reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/crd-reference.md is not current: run `make crd-reference` and commit it")
	}
}

// TestReferenceCoversTheSpec checks the reference against the Go types through reflection: every
// JSON field of RenderQueueSpec and RenderQueueStatus has its row, under its type's section.
func TestReferenceCoversTheSpec(t *testing.T) {
	ref, err := Generate(filepath.Join("..", "..", "api", "v1alpha1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []reflect.Type{reflect.TypeOf(rqv1.RenderQueueSpec{}), reflect.TypeOf(rqv1.RenderQueueStatus{}),
		reflect.TypeOf(rqv1.ShardStatus{}), reflect.TypeOf(rqv1.Priority{})} {
		section, ok := sectionOf(string(ref), typ.Name())
		if !ok {
			t.Errorf("no section %s", typ.Name())
			continue
		}
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			if !strings.Contains(section, "| `"+name+"` |") {
				t.Errorf("%s.%s (%s) has no row in its section", typ.Name(), typ.Field(i).Name, name)
			}
		}
	}
	// what the markers say is there: a default, an enum, a CEL rule's message
	for _, want := range []string{"Default: `1`.", "One of: `Always`, `IfNotPresent`, `Never`.", "shards must be between 1 and 256"} {
		if !strings.Contains(string(ref), want) {
			t.Errorf("the reference lacks %q", want)
		}
	}
}

// sectionOf returns the text of the reference's section "## name".
func sectionOf(ref, name string) (string, bool) {
	_, rest, ok := strings.Cut(ref, "\n## "+name+"\n")
	if !ok {
		return "", false
	}
	section, _, _ := strings.Cut(rest, "\n## ")
	return section, true
}

// TestReferenceCatchesAChange generates the reference of a changed copy of the API package: a
// new field shows, so a stale file would differ.
func TestReferenceCatchesAChange(t *testing.T) {
	src := filepath.Join("..", "..", "api", "v1alpha1")
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join(src, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "renderqueue_types.go" {
			b = bytes.Replace(b, []byte("type RenderQueueSpec struct {\n"),
				[]byte("type RenderQueueSpec struct {\n\t// Colour of the queue.\n\t// +kubebuilder:default=blue\n\t// +optional\n\tColour string `json:\"colour,omitempty\"`\n\n"), 1)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	changed, err := Generate(filepath.Join(dir))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(changed), "| `colour` | string | Colour of the queue.<br>Default: `blue`. |") {
		t.Fatalf("the new field is not in the reference:\n%.2000s", changed)
	}
}
