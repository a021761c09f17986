package shardtls_test

import (
	"testing"

	"github.com/renderqueue/renderqueue/controllers/shardtls"
)

func TestClients(t *testing.T) {
	a, b := newCA(t, t0), newCA(t, t0)
	var c shardtls.Clients
	first, err := c.Get("web-shards.team-a.svc", a.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := c.Get("web-shards.team-a.svc", a.Bundle); again != first {
		t.Error("the same name and bundle built another client")
	}
	if other, _ := c.Get("web-shards.team-a.svc", b.Bundle); other == first {
		t.Error("a changed bundle kept the old client")
	}
	cur, _ := c.Get("web-shards.team-a.svc", b.Bundle)
	c.Forget("web-shards.team-a.svc")
	if after, _ := c.Get("web-shards.team-a.svc", b.Bundle); after == cur {
		t.Error("Forget kept the client")
	}
}
