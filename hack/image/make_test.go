package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run the Makefile's targets, as a user does, into temporary directories.

// repoRoot is the renderqueue checkout hack/image belongs to.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "renderqueue")); err != nil {
		t.Fatalf("%s is not a renderqueue checkout: %v", root, err)
	}
	return root
}

// gitOr is the output of git args in root, or def when git fails (as in the Makefile).
func gitOr(t *testing.T, root, def string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
	if err != nil {
		return def
	}
	return strings.TrimSpace(string(out))
}

// makeTarget runs `make target vars...` in root and returns the digest it printed last, after
// checking that it is the one in the .digest file beside archive.
func makeTarget(t *testing.T, root, target, archive string, vars ...string) string {
	t.Helper()
	cmd := exec.Command("make", append([]string{"--no-print-directory", target}, vars...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s %s: %v\n%s", target, strings.Join(vars, " "), err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	printed := lines[len(lines)-1]
	written, err := os.ReadFile(archive + ".digest")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(printed, "sha256:") || strings.TrimSpace(string(written)) != printed {
		t.Fatalf("make %s printed %q last and wrote %q", target, printed, written)
	}
	return printed
}

// TestMakeImage runs `make image` four times: twice with the same inputs into two directories
// (the same digest, the same bytes), once with another VERSION (another digest) and once for this
// machine's platform only (that platform's image of the index, as the local cluster runs it); then
// checks the image's structure, its binaries, and that the Dockerfile describes the same image.
func TestMakeImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds renderqueue four times, three of them for two platforms")
	}
	root := repoRoot(t)
	const version = "v0.0.0-imagetest"
	d1, d2, d3 := t.TempDir(), t.TempDir(), t.TempDir()
	archive := func(dir string) string { return filepath.Join(dir, "renderqueue.oci.tar") }
	dig1 := makeTarget(t, root, "image", archive(d1), "IMAGE_DIR="+d1, "VERSION="+version)
	dig2 := makeTarget(t, root, "image", archive(d2), "IMAGE_DIR="+d2, "VERSION="+version)
	dig3 := makeTarget(t, root, "image", archive(d3), "IMAGE_DIR="+d3, "VERSION="+version+"-other")
	// The local cluster's node (hack/images.sh) builds this machine's platform only.
	host := "linux/" + runtime.GOARCH
	d4 := t.TempDir()
	dig4 := makeTarget(t, root, "image", archive(d4), "IMAGE_DIR="+d4, "VERSION="+version, "IMAGE_PLATFORMS="+host)
	t.Logf("make image: %s, again %s, another VERSION %s, %s only %s", dig1, dig2, dig3, host, dig4)

	t.Run("reproducible", func(t *testing.T) {
		b1, err := os.ReadFile(archive(d1))
		if err != nil {
			t.Fatal(err)
		}
		b2, err := os.ReadFile(archive(d2))
		if err != nil {
			t.Fatal(err)
		}
		if dig1 != dig2 || !bytes.Equal(b1, b2) {
			t.Errorf("two builds of one commit differ: %s vs %s (archives equal: %v)", dig1, dig2, bytes.Equal(b1, b2))
		}
		if dig3 == dig1 {
			t.Errorf("another VERSION gave the same digest %s", dig3)
		}
	})

	a := readArchive(t, archive(d1))
	if a.indexDigest != dig1 {
		t.Errorf("index.json points at %s, make printed %s", a.indexDigest, dig1)
	}

	// One platform's build is that platform's image of the two-platform index, byte for byte: the
	// image the local cluster's Pods run is the one a user pulls on this platform.
	t.Run("one-platform", func(t *testing.T) {
		one := readArchive(t, archive(d4))
		if len(one.images) != 1 || one.images[host] == nil {
			t.Fatalf("IMAGE_PLATFORMS=%s built %d images (want only %s)", host, len(one.images), host)
		}
		if a.images[host] == nil {
			t.Fatalf("the two-platform index has no %s image", host)
		}
		if got, want := one.images[host].digest, a.images[host].digest; got != want {
			t.Errorf("IMAGE_PLATFORMS=%s: image manifest %s; the two-platform index's %s image is %s", host, got, host, want)
		}
	})
	epoch, err := strconv.ParseInt(gitOr(t, root, "0", "log", "-1", "--format=%ct"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("structure", func(t *testing.T) {
		checkImages(t, a, imageWant{
			name:      "ghcr.io/renderqueue/renderqueue:" + version,
			platforms: []string{"linux/amd64", "linux/arm64"},
			path:      "/renderqueue",
			user:      "65532:65532",
			env:       []string{"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
			labels: map[string]string{
				"org.opencontainers.image.version":  version,
				"org.opencontainers.image.revision": gitOr(t, root, "unknown", "rev-parse", "HEAD"),
				"org.opencontainers.image.source":   "https://github.com/renderqueue/renderqueue",
				"org.opencontainers.image.title":    "renderqueue",
			},
			created: time.Unix(epoch, 0).UTC(),
			base:    true,
		})
	})

	t.Run("binaries", func(t *testing.T) {
		machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
		for p, img := range a.images {
			arch := strings.TrimPrefix(p, "linux/")
			bin := img.files["renderqueue"].data
			checkStatic(t, p, bin, machines[arch])
			if arch != runtime.GOARCH {
				continue
			}
			// The host's platform's binary, as the image holds it, prints the version.
			file := filepath.Join(t.TempDir(), "renderqueue")
			if err := os.WriteFile(file, bin, 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(file, "version").CombinedOutput()
			if err != nil || string(out) != "renderqueue "+version+"\n" {
				t.Errorf("%s: renderqueue version: %v, %q; want %q", p, err, out, "renderqueue "+version+"\n")
			}
		}
	})

	t.Run("dockerfile", func(t *testing.T) {
		checkDockerfile(t, filepath.Join(root, "Dockerfile"), filepath.Join(root, "Makefile"), a.images["linux/amd64"])
	})
}

// checkStatic checks that bin is a static, stripped ELF executable for machine.
func checkStatic(t *testing.T, platform string, bin []byte, machine elf.Machine) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Errorf("%s: the binary is not ELF: %v", platform, err)
		return
	}
	defer func() { _ = f.Close() }()
	if f.Machine != machine || f.Type != elf.ET_EXEC {
		t.Errorf("%s: ELF machine %v type %v, want %v ET_EXEC", platform, f.Machine, f.Type, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: the binary is dynamically linked (%v)", platform, p.Type)
		}
	}
	if f.Section(".symtab") != nil {
		t.Errorf("%s: the binary has a symbol table (built without -s?)", platform)
	}
}

// TestMakePauseImage builds the test node's sandbox image and runs its pause binary: it waits
// until SIGTERM and then exits 0.
func TestMakePauseImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the pause image")
	}
	root := repoRoot(t)
	dir := t.TempDir()
	archive := filepath.Join(dir, "pause.oci.tar")
	digest := makeTarget(t, root, "pause-image", archive, "IMAGE_DIR="+dir)
	a := readArchive(t, archive)
	if a.indexDigest != digest {
		t.Errorf("index.json points at %s, make printed %s", a.indexDigest, digest)
	}
	epoch, err := strconv.ParseInt(gitOr(t, root, "0", "log", "-1", "--format=%ct"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	checkImages(t, a, imageWant{
		name:      "localhost/renderqueue/pause:3.10",
		platforms: []string{"linux/amd64", "linux/arm64"},
		path:      "/pause",
		user:      "65535:65535",
		labels: map[string]string{
			"org.opencontainers.image.revision": gitOr(t, root, "unknown", "rev-parse", "HEAD"),
			"org.opencontainers.image.source":   "https://github.com/renderqueue/renderqueue",
			"org.opencontainers.image.title":    "pause",
		},
		created: time.Unix(epoch, 0).UTC(),
	})
	img, ok := a.images["linux/"+runtime.GOARCH]
	if !ok {
		t.Skipf("no pause binary for this machine's %s", runtime.GOARCH)
	}
	checkStatic(t, "pause", img.files["pause"].data, map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH])
	file := filepath.Join(t.TempDir(), "pause")
	if err := os.WriteFile(file, img.files["pause"].data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(file)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// pause prints its first line once its signal handlers are in place.
		r := bufio.NewReader(stderr)
		line, err := r.ReadString('\n')
		if err != nil || !strings.Contains(line, "waiting") {
			_ = cmd.Process.Kill()
			t.Fatalf("pause's first line: %q, %v", line, err)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		rest, _ := r.ReadString('\n')
		if err := cmd.Wait(); err != nil {
			t.Errorf("pause after %v: %v (%q)", sig, err, rest)
		}
	}
}
