package cluster

import "testing"

func TestRewriteListen(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{":8080", "127.0.0.7:8080"},
		{"0.0.0.0:8080", "127.0.0.7:8080"},
		{"--listen=:8080", "--listen=127.0.0.7:8080"},
		{"--listen", "--listen"},
		{"10.1.2.3:8080", "10.1.2.3:8080"},
		{"127.0.0.1:9", "127.0.0.1:9"},
		{"keeper", "keeper"},
		{":http", ":http"},
		{"/var/run/x:8080", "/var/run/x:8080"},
	} {
		if got := rewriteListen(c.in, "127.0.0.7"); got != c.want {
			t.Errorf("rewriteListen(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestExpandVars(t *testing.T) {
	env := map[string]string{"A": "1", "POD": "web-shard-0"}
	for _, c := range []struct{ in, want string }{
		{"$(A)", "1"},
		{"--name=$(POD)", "--name=web-shard-0"},
		{"$(B)", "$(B)"},
		{"$$(A)", "$(A)"},
		{"$(A", "$(A"},
		{"cost $5", "cost $5"},
		{"$", "$"},
	} {
		if got := expandVars(c.in, env); got != c.want {
			t.Errorf("expandVars(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
