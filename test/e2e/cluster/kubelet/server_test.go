package kubelet

import (
	"testing"
)

// TestTailLines: kubectl logs --tail.
func TestTailLines(t *testing.T) {
	if got := string(tailLines([]byte("a\nb\nc\n"), 2)); got != "b\nc\n" {
		t.Errorf("tailLines 2 = %q", got)
	}
	if got := string(tailLines([]byte("a\nb"), 5)); got != "a\nb" {
		t.Errorf("tailLines 5 = %q", got)
	}
}
