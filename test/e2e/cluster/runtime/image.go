package runtime

import (
	"fmt"
	"os/exec"
	"path"
	"strings"
)

// Image is what the runtime knows of a container image: the local program that stands in for the
// image's one executable, and the parts of the image config that decide how a container runs.
// There are no image layers: a container's root filesystem is this machine's root filesystem
// (see the package documentation), with Binary mounted at Entrypoint[0].
type Image struct {
	// Binary is the local executable mounted (read-only) at Entrypoint[0] in the container.
	Binary string
	// BinaryArgs are inserted before the container's arguments (after argv[0]); for stand-ins
	// that need them (the pause image runs `sleep infinity`).
	BinaryArgs []string
	// Entrypoint and Cmd are the image's ENTRYPOINT and CMD. Entrypoint[0] must be absolute.
	Entrypoint, Cmd []string
	// UID and GID are the image's USER (the default of runAsUser and runAsGroup).
	UID, GID int64
	// Env is the image's ENV (NAME=value).
	Env []string
	// WorkingDir is the image's WORKDIR ("" is /).
	WorkingDir string
}

// ImageMapping maps the images Match accepts to Image.
type ImageMapping struct {
	// Name describes the mapping in messages ("renderqueue", "pause").
	Name string
	// Match reports whether an image reference (as in a Pod's spec) is this image.
	Match func(ref string) bool
	// Image is how such a container runs.
	Image Image
}

// Images are the image mappings of a Node, in order: the first match wins.
type Images []ImageMapping

// Find returns the first mapping that matches ref: false when none does (the image cannot be
// "pulled").
func (is Images) Find(ref string) (ImageMapping, bool) {
	for _, m := range is {
		if m.Match(ref) {
			return m, true
		}
	}
	return ImageMapping{}, false
}

// Names lists the mappings' names, for messages ("renderqueue, pause").
func (is Images) Names() string {
	names := make([]string, 0, len(is))
	for _, m := range is {
		names = append(names, m.Name)
	}
	return strings.Join(names, ", ")
}

// distrolessEnv is the ENV of gcr.io/distroless/static (the renderqueue image's base).
var distrolessEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
}

// RepositoryName is the last path element of an image reference's repository, without registry,
// tag or digest: "renderqueue" for ghcr.io/renderqueue/renderqueue:v1,
// registry.example.com:5000/team/renderqueue@sha256:..., renderqueue:e2e.
func RepositoryName(ref string) string {
	repo := ref
	if i := strings.IndexByte(repo, '@'); i >= 0 {
		repo = repo[:i]
	}
	// A tag is after the last colon that follows the last slash (a colon before it is a
	// registry port).
	if i := strings.LastIndexByte(repo, ':'); i > strings.LastIndexByte(repo, '/') {
		repo = repo[:i]
	}
	return path.Base(repo)
}

// RenderqueueImage maps every image whose repository's last path element is "renderqueue" (any
// registry, tag or digest) to binary, as the Dockerfile builds it: ENTRYPOINT ["/renderqueue"],
// USER 65532:65532 on gcr.io/distroless/static.
func RenderqueueImage(binary string) ImageMapping {
	return ImageMapping{
		Name:  "renderqueue",
		Match: func(ref string) bool { return RepositoryName(ref) == "renderqueue" },
		Image: Image{Binary: binary, Entrypoint: []string{"/renderqueue"}, UID: 65532, GID: 65532, Env: distrolessEnv},
	}
}

// PauseImage maps registry.k8s.io/pause (any tag; also k8s.gcr.io/pause) to a process that waits
// until it is signalled (`sleep infinity`), as /pause does: ENTRYPOINT ["/pause"], USER
// 65535:65535. It needs sleep (coreutils) on PATH.
func PauseImage() (ImageMapping, error) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		return ImageMapping{}, fmt.Errorf("pause image: sleep not found: %w", err)
	}
	return ImageMapping{
		Name: "pause",
		Match: func(ref string) bool {
			if i := strings.IndexByte(ref, '@'); i >= 0 {
				ref = ref[:i]
			}
			if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
				ref = ref[:i]
			}
			return ref == "registry.k8s.io/pause" || ref == "k8s.gcr.io/pause"
		},
		Image: Image{Binary: sleep, BinaryArgs: []string{"infinity"}, Entrypoint: []string{"/pause"}, UID: 65535, GID: 65535,
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
	}, nil
}

// ResolveArgv applies Kubernetes' command/args rules to an image: command replaces ENTRYPOINT
// (and drops CMD), args replace CMD. The result's argv[0] must be the image's entrypoint path,
// the one executable the image holds.
func ResolveArgv(img Image, command, args []string) ([]string, error) {
	var argv []string
	switch {
	case len(command) > 0:
		argv = append(append(argv, command...), args...)
	case len(args) > 0:
		argv = append(append(argv, img.Entrypoint...), args...)
	default:
		argv = append(append(argv, img.Entrypoint...), img.Cmd...)
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("no command specified")
	}
	if len(img.Entrypoint) == 0 || argv[0] != img.Entrypoint[0] {
		want := "(none)"
		if len(img.Entrypoint) > 0 {
			want = img.Entrypoint[0]
		}
		return argv, fmt.Errorf("exec: %q: stat %s: no such file or directory (the local runner's image holds only %s)", argv[0], argv[0], want)
	}
	return argv, nil
}
