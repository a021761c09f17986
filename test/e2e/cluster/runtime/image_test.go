package runtime

import (
	"strings"
	"testing"
)

func TestRepositoryName(t *testing.T) {
	for ref, want := range map[string]string{
		"ghcr.io/renderqueue/renderqueue:latest":                   "renderqueue",
		"registry.example.com:5000/team/renderqueue@sha256:abcdef": "renderqueue",
		"registry.example.com:5000/renderqueue":                    "renderqueue",
		"renderqueue:e2e":                                          "renderqueue",
		"renderqueue":                                              "renderqueue",
		"ghcr.io/renderqueue/renderqueue-tools:v1":                 "renderqueue-tools",
		"localhost:5000/x/y/renderqueue:v1@sha256:00":              "renderqueue",
		"registry.k8s.io/pause:3.10":                               "pause",
	} {
		if got := RepositoryName(ref); got != want {
			t.Errorf("RepositoryName(%q) = %q, want %q", ref, got, want)
		}
	}
}

func TestPauseImageMatch(t *testing.T) {
	m, err := PauseImage()
	if err != nil {
		t.Skip(err)
	}
	for ref, want := range map[string]bool{
		"registry.k8s.io/pause:3.10": true, "registry.k8s.io/pause": true, "k8s.gcr.io/pause:3.2": true,
		"registry.k8s.io/pause@sha256:00": true, "example.com/pause:1": false, "registry.k8s.io/pause-x:1": false,
	} {
		if got := m.Match(ref); got != want {
			t.Errorf("pause matches %q: %v, want %v", ref, got, want)
		}
	}
}

func TestResolveArgv(t *testing.T) {
	img := Image{Entrypoint: []string{"/renderqueue"}, Cmd: []string{"help"}}
	for _, c := range []struct {
		command, args, want []string
		err                 bool
	}{
		{nil, nil, []string{"/renderqueue", "help"}, false},
		{nil, []string{"keeper", "--listen", ":8080"}, []string{"/renderqueue", "keeper", "--listen", ":8080"}, false},
		{[]string{"/renderqueue"}, []string{"operator"}, []string{"/renderqueue", "operator"}, false},
		{[]string{"/renderqueue", "operator"}, nil, []string{"/renderqueue", "operator"}, false},
		{[]string{"/bin/sh", "-c", "x"}, nil, nil, true},
		{[]string{"renderqueue"}, nil, nil, true},
	} {
		got, err := ResolveArgv(img, c.command, c.args)
		if (err != nil) != c.err || (!c.err && strings.Join(got, " ") != strings.Join(c.want, " ")) {
			t.Errorf("ResolveArgv(%q, %q) = %q, %v; want %q (error %v)", c.command, c.args, got, err, c.want, c.err)
		}
	}
	if _, err := ResolveArgv(Image{}, nil, nil); err == nil {
		t.Error("an image without entrypoint and a container without command ran")
	}
}
