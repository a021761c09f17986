package specs

import (
	"strings"
	"testing"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

func TestSortShards(t *testing.T) {
	rq := &rqv1.RenderQueue{}
	rq.Name = "web"
	names := []string{"web-shard-10", "other", "web-shard-2", "web-shard-0"}
	SortShards(rq, names)
	if strings.Join(names, " ") != "web-shard-0 web-shard-2 web-shard-10 other" {
		t.Errorf("SortShards = %v", names)
	}
	for name, want := range map[string]bool{"web-shard-3": true, "web-shard-03": false, "web-shard--1": false, "webx-shard-1": false} {
		if _, ok := shardIndex(rq, name); ok != want {
			t.Errorf("shardIndex(%q) ok = %v, want %v", name, ok, want)
		}
	}
}
