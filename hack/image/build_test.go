package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeSpec is a renderqueue-like Spec whose binaries are small files written into dir.
func fakeSpec(t *testing.T, dir string) Spec {
	t.Helper()
	bins := map[string]string{}
	for _, p := range []string{"linux/amd64", "linux/arm64"} {
		f := filepath.Join(dir, strings.ReplaceAll(p, "/", "_"))
		if err := os.WriteFile(f, []byte("not really a binary for "+p), 0o755); err != nil {
			t.Fatal(err)
		}
		bins[p] = f
	}
	return Spec{
		Name:     "ghcr.io/renderqueue/renderqueue:v1.2.3",
		Binaries: bins,
		Path:     "/renderqueue",
		User:     "65532:65532",
		Env:      []string{"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		Labels: map[string]string{
			"org.opencontainers.image.version":  "v1.2.3",
			"org.opencontainers.image.revision": "0123456789abcdef",
			"org.opencontainers.image.title":    "renderqueue",
		},
		Created: time.Unix(1700000000, 0).UTC(),
		Base:    true,
	}
}

func buildInto(t *testing.T, s Spec, dir string) (Result, []byte) {
	t.Helper()
	out := filepath.Join(dir, "out", "image.oci.tar")
	res, err := Build(s, out)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

func TestBuildStructure(t *testing.T) {
	dir := t.TempDir()
	s := fakeSpec(t, dir)
	res, _ := buildInto(t, s, dir)
	a := readArchive(t, filepath.Join(dir, "out", "image.oci.tar"))
	if a.indexDigest != res.Digest.String() {
		t.Errorf("index.json points at %s, Build returned %s", a.indexDigest, res.Digest)
	}
	checkImages(t, a, imageWant{
		name: s.Name, platforms: []string{"linux/amd64", "linux/arm64"}, path: "/renderqueue",
		user: "65532:65532", env: s.Env, labels: s.Labels, created: s.Created, base: true,
	})
	for p, img := range a.images {
		if got, want := string(img.files["renderqueue"].data), "not really a binary for "+p; got != want {
			t.Errorf("%s: /renderqueue holds %q, want %q", p, got, want)
		}
		if res.Images[p].String() != img.digest {
			t.Errorf("%s: Build reported image %s, the index holds %s", p, res.Images[p], img.digest)
		}
	}
	// The base layer is stored once for both platforms: 1 index + 2 × (manifest, config, binary
	// layer) + 1 base layer.
	if len(a.blobs) != 8 {
		t.Errorf("%d blobs, want 8", len(a.blobs))
	}
}

func TestBuildWithoutBase(t *testing.T) {
	dir := t.TempDir()
	s := fakeSpec(t, dir)
	s.Base = false
	s.Path = "/usr/bin/pause"
	s.User = "65535:65535"
	buildInto(t, s, dir)
	a := readArchive(t, filepath.Join(dir, "out", "image.oci.tar"))
	img := a.images["linux/amd64"]
	var names []string
	for name := range img.files {
		names = append(names, name)
	}
	// The binary's directories are in its layer, root's and 0755.
	want := map[string]fileWant{"usr": {mode: 0o755 | os.ModeDir}, "usr/bin": {mode: 0o755 | os.ModeDir}, "usr/bin/pause": {mode: 0o755}}
	if len(img.files) != len(want) {
		t.Fatalf("files %v, want %v", names, want)
	}
	for name, fw := range want {
		e, ok := img.files[name]
		if !ok || fileMode(e.hdr) != fw.mode || e.hdr.Uid != 0 || e.hdr.Gid != 0 {
			t.Errorf("/%s: %+v, want %v 0:0", name, e.hdr, fw.mode)
		}
	}
	if img.config.Config.User != "65535:65535" || img.config.Config.Entrypoint[0] != "/usr/bin/pause" {
		t.Errorf("config %+v", img.config.Config)
	}
}

// TestBuildReproducible builds the same Spec from two copies of its inputs and gets the same
// bytes; each input that is part of the image changes the digest; the name, which is only in
// index.json, changes the archive but not the digest.
func TestBuildReproducible(t *testing.T) {
	d1, d2 := t.TempDir(), t.TempDir()
	s1, s2 := fakeSpec(t, d1), fakeSpec(t, d2)
	r1, b1 := buildInto(t, s1, d1)
	r2, b2 := buildInto(t, s2, d2)
	if r1.Digest != r2.Digest || !bytes.Equal(b1, b2) {
		t.Fatalf("two builds of the same inputs differ: %s vs %s (archives equal: %v)", r1.Digest, r2.Digest, bytes.Equal(b1, b2))
	}

	changes := map[string]func(s *Spec){
		"version label": func(s *Spec) { s.Labels["org.opencontainers.image.version"] = "v1.2.4" },
		"time":          func(s *Spec) { s.Created = s.Created.Add(time.Second) },
		"user":          func(s *Spec) { s.User = "65534:65534" },
		"env":           func(s *Spec) { s.Env = nil },
		"path":          func(s *Spec) { s.Path = "/rq" },
		"no base":       func(s *Spec) { s.Base = false },
		"binary": func(s *Spec) {
			if err := os.WriteFile(s.Binaries["linux/arm64"], []byte("another binary"), 0o755); err != nil {
				t.Fatal(err)
			}
		},
		"platforms": func(s *Spec) { delete(s.Binaries, "linux/arm64") },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := fakeSpec(t, dir)
			change(&s)
			r, _ := buildInto(t, s, dir)
			if r.Digest == r1.Digest {
				t.Errorf("changing the %s left the digest at %s", name, r.Digest)
			}
		})
	}
	t.Run("name", func(t *testing.T) {
		dir := t.TempDir()
		s := fakeSpec(t, dir)
		s.Name = "localhost/renderqueue:dev"
		r, b := buildInto(t, s, dir)
		if r.Digest != r1.Digest {
			t.Errorf("the name changed the digest: %s vs %s", r.Digest, r1.Digest)
		}
		if bytes.Equal(b, b1) {
			t.Error("the name did not change index.json")
		}
	})
}

func TestBuildRejects(t *testing.T) {
	cases := map[string]func(s *Spec){
		"no tag":         func(s *Spec) { s.Name = "ghcr.io/renderqueue/renderqueue" },
		"port, no tag":   func(s *Spec) { s.Name = "localhost:5000/renderqueue" },
		"digest":         func(s *Spec) { s.Name = "ghcr.io/renderqueue/renderqueue:v1@sha256:00" },
		"no binary":      func(s *Spec) { s.Binaries = nil },
		"bad platform":   func(s *Spec) { s.Binaries["amd64"] = s.Binaries["linux/amd64"] },
		"relative path":  func(s *Spec) { s.Path = "renderqueue" },
		"root path":      func(s *Spec) { s.Path = "/" },
		"no user":        func(s *Spec) { s.User = "" },
		"PATH in env":    func(s *Spec) { s.Env = []string{"PATH=/bin"} },
		"env, no value":  func(s *Spec) { s.Env = []string{"GODEBUG"} },
		"missing binary": func(s *Spec) { s.Binaries["linux/amd64"] = "/nonexistent/renderqueue" },
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := fakeSpec(t, dir)
			change(&s)
			out := filepath.Join(dir, "image.oci.tar")
			if _, err := Build(s, out); err == nil {
				t.Fatal("Build accepted it")
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("a failed build left %s (%v)", out, err)
			}
		})
	}
}

// TestRunBuild drives the command line as make does and checks the digest it prints and writes.
func TestRunBuild(t *testing.T) {
	dir := t.TempDir()
	s := fakeSpec(t, dir)
	out := filepath.Join(dir, "renderqueue.oci.tar")
	args := []string{"build", "-out", out, "-name", s.Name, "-path", s.Path, "-user", s.User,
		"-binary", "linux/amd64=" + s.Binaries["linux/amd64"], "-binary", "linux/arm64=" + s.Binaries["linux/arm64"],
		"-epoch", "1700000000", "-env", s.Env[0]}
	for k, v := range s.Labels {
		args = append(args, "-label", k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	digestFile, err := os.ReadFile(out + ".digest")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := buildInto(t, s, t.TempDir())
	if stdout.String() != want.Digest.String()+"\n" || string(digestFile) != stdout.String() {
		t.Errorf("printed %q, wrote %q; Build of the same Spec gives %s", stdout.String(), digestFile, want.Digest)
	}

	for _, bad := range [][]string{
		{},
		{"push"},
		{"build", "-name", s.Name},
		{"build", "-out", out, "-binary", "linux/amd64"},
		{"build", "-out", out, "-label", "novalue"},
		{"build", "-out", out, "-epoch", "yesterday"},
		{"build", "-out", out, "-binary", "linux/amd64=a", "-binary", "linux/amd64=b"},
		{"build", "-out", out, "extra"},
	} {
		if err := run(bad, &stdout, &stderr); err == nil {
			t.Errorf("run(%q) succeeded", bad)
		}
	}
}

func TestTag(t *testing.T) {
	for name, want := range map[string]string{
		"ghcr.io/renderqueue/renderqueue:v0.1.0": "v0.1.0",
		"localhost:5000/pause:3.10":              "3.10",
		"localhost:5000/pause":                   "",
		"pause":                                  "",
	} {
		if got := tag(name); got != want {
			t.Errorf("tag(%q) = %q, want %q", name, got, want)
		}
	}
}
