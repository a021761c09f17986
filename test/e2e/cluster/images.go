package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Images are the images the local cluster's node runs (hack/images.sh): OCI image layout
// archives, imported into containerd, and the names the Pods refer to them by.
type Images struct {
	// Archives are the archives to import (Options.Images).
	Archives []string
	// Renderqueue is the renderqueue image of `make image` (the operator's and the shards').
	Renderqueue string
	// Sandbox is the Pods' sandbox image (Options.SandboxImage).
	Sandbox string
	// CoreDNS is the cluster DNS's image (Options.CoreDNSImage).
	CoreDNS string
	// Probe is the tests' probe image (test/e2e/cmd/probe).
	Probe string
	// Binary is the renderqueue image's own binary (static, this platform's), for what the tests
	// run on this machine rather than in a Pod.
	Binary string
}

// BuildImages runs repo/hack/images.sh with the assets directory (for CoreDNS's binary) and
// returns what it built: the archives and the renderqueue image's binary.
func BuildImages(ctx context.Context, repo, assets string, logf func(string, ...any)) (*Images, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "hack", "images.sh"), assets)
	cmd.Dir = repo
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("hack/images.sh: %w\n%s", err, stderr.String())
	}
	im := &Images{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		role, name, archive := f[0], f[1], f[2]
		if _, err := os.Stat(archive); err != nil {
			return nil, fmt.Errorf("hack/images.sh named %s, which is not there: %w", archive, err)
		}
		if role == "binary" {
			im.Binary = archive
			continue
		}
		switch role {
		case "renderqueue":
			im.Renderqueue = name
		case "sandbox":
			im.Sandbox = name
		case "coredns":
			im.CoreDNS = name
		case "probe":
			im.Probe = name
		default:
			continue
		}
		im.Archives = append(im.Archives, archive)
		if logf != nil {
			logf("image %s: %s (%s)", role, name, archive)
		}
	}
	if im.Renderqueue == "" || im.Sandbox == "" || im.CoreDNS == "" || im.Probe == "" || im.Binary == "" {
		return nil, fmt.Errorf("hack/images.sh did not name every image:\n%s\n%s", out.String(), stderr.String())
	}
	return im, nil
}
