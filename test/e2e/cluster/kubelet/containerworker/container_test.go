package containerworker

import (
	"fmt"
	"strings"
	"testing"
)

func TestTerminationMessageTails(t *testing.T) {
	var b strings.Builder
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	got := logTail([]byte(b.String()), 80, 2048)
	if !strings.HasPrefix(got, "line 21\n") || !strings.HasSuffix(got, "line 100\n") {
		t.Errorf("80 lines: %q", got)
	}
	long := strings.Repeat("x", 3000) + "\n"
	if got := logTail([]byte(long), 80, 2048); len(got) != 2048 {
		t.Errorf("2 KiB: %d bytes", len(got))
	}
}
