// Package releasetest builds a release with `make release` (hack/release.sh) into a temporary
// directory and checks that its pieces agree: one version, one image digest, checksums that
// verify, a krew manifest naming the archives it ships, an SBOM of the binary. It builds the
// image and the binaries for linux/amd64 only unless RENDERQUEUE_RELEASE_PLATFORMS says more
// (about a minute with a warm build cache); `go test -short` skips it.
package releasetest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	repoRoot = "../.."
	version  = "v0.2.0-test.1"
	repo     = "ghcr.io/renderqueue/renderqueue"
)

// makeRelease runs `make release` with VERSION=v and the CHANGELOG changelog into out.
func makeRelease(t *testing.T, v, changelog, out, platforms string) (string, error) {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", "release", "VERSION="+v, "RELEASE_DIR="+out,
		"IMAGE_PLATFORMS="+platforms, "RELEASE_PLATFORMS="+platforms)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CHANGELOG="+changelog)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

func writeChangelog(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "CHANGELOG.md")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReleaseRefuses checks what make release refuses before building anything: a version that
// is not semantic, and a version the changelog has no section for.
func TestReleaseRefuses(t *testing.T) {
	changelog := writeChangelog(t, "# Changelog\n\n## Unreleased\n\n## [v0.1.0] - 2026-11-01\n")
	out := filepath.Join(t.TempDir(), "release")
	for v, want := range map[string]string{
		"0.2.0":  "is not a semantic version",
		"v0.2":   "is not a semantic version",
		"v0.2.0": `has no section "## [v0.2.0] - YYYY-MM-DD"`,
	} {
		msg, err := makeRelease(t, v, changelog, out, "linux/amd64")
		if err == nil || !strings.Contains(msg, want) {
			t.Errorf("make release VERSION=%s: %v, want an error saying %q:\n%s", v, err, want, msg)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused release wrote its directory")
	}
}

// TestRelease builds a release and checks its pieces against each other.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a release (-short)")
	}
	platforms := os.Getenv("RENDERQUEUE_RELEASE_PLATFORMS")
	if platforms == "" {
		platforms = "linux/amd64"
	}
	changelog := writeChangelog(t, "# Changelog\n\n## Unreleased\n\n## ["+version+"] - 2026-12-05\n\n### Upgrading\n\n- Nothing to do.\n\n## [v0.1.0] - 2026-11-01\n\n- First.\n")
	out := filepath.Join(t.TempDir(), "release")
	if msg, err := makeRelease(t, version, changelog, out, platforms); err != nil {
		t.Fatalf("make release: %v\n%s", err, msg)
	}
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	// every file is in SHA256SUMS, and each sum verifies
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(read("SHA256SUMS"))), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		sums[name] = sum
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if e.Name() != "SHA256SUMS" {
			files = append(files, e.Name())
		}
	}
	if len(files) != len(sums) {
		t.Errorf("SHA256SUMS lists %d files, the release has %d: %v", len(sums), len(files), files)
	}
	for _, name := range files {
		if got := sha256Hex(read(name)); sums[name] != got {
			t.Errorf("%s: SHA256SUMS says %s, the file's is %s", name, sums[name], got)
		}
	}

	// the image: its digest, its name, its version label
	digest := strings.TrimSpace(string(read("renderqueue-" + version + ".oci.tar.digest")))
	layout := untar(t, read("renderqueue-"+version+".oci.tar"))
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(layout["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("the archive's index.json: %v %s", err, layout["index.json"])
	}
	if index.Manifests[0].Digest != digest {
		t.Errorf("the archive's image is %s, the .digest file says %s", index.Manifests[0].Digest, digest)
	}
	if name := index.Manifests[0].Annotations["io.containerd.image.name"]; name != repo+":"+version {
		t.Errorf("the image is named %s", name)
	}
	blob := layout["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if blob == nil || "sha256:"+sha256Hex(blob) != digest {
		t.Fatalf("the archive has no blob of %s matching it", digest)
	}
	var imageIndex struct {
		Manifests []struct {
			Platform struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
			} `json:"platform"`
		} `json:"manifests"`
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(blob, &imageIndex); err != nil {
		t.Fatal(err)
	}
	if v := imageIndex.Annotations["org.opencontainers.image.version"]; v != version {
		t.Errorf("the image index's version annotation is %q", v)
	}
	if n := len(imageIndex.Manifests); n != len(strings.Fields(platforms)) {
		t.Errorf("the image has %d platforms, want %s", n, platforms)
	}

	// the install manifests run that image, by digest
	for _, f := range []string{"install.yaml", "install-without-metrics-api.yaml"} {
		img, env := operatorImage(t, read(f))
		if want := repo + ":" + version + "@" + digest; img != want || env != want {
			t.Errorf("%s: the operator runs %s with RENDERQUEUE_IMAGE %s, want %s", f, img, env, want)
		}
	}

	// the Helm chart: the release's version, the image pinned by digest
	chart := untar(t, gunzip(t, read("renderqueue-"+strings.TrimPrefix(version, "v")+".tgz")))
	var meta struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(chart["renderqueue/Chart.yaml"], &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Version != strings.TrimPrefix(version, "v") || meta.AppVersion != version {
		t.Errorf("the chart is version %q, appVersion %q; want %s, %s", meta.Version, meta.AppVersion, strings.TrimPrefix(version, "v"), version)
	}
	var values struct {
		Image struct {
			Repository, Tag, Digest string
		} `json:"image"`
	}
	if err := yaml.Unmarshal(chart["renderqueue/values.yaml"], &values); err != nil {
		t.Fatal(err)
	}
	if values.Image.Repository != repo || values.Image.Tag != version || values.Image.Digest != digest {
		t.Errorf("the chart's image is %+v, want %s:%s@%s", values.Image, repo, version, digest)
	}
	if chart["renderqueue/crds/renderqueue.dev_renderqueues.yaml"] == nil {
		t.Error("the chart has no CRD")
	}

	// the binaries: the version they print, the plugin archives holding the same bytes, the krew
	// manifest naming those archives by checksum
	var krew struct {
		Metadata struct{ Name string } `json:"metadata"`
		Spec     struct {
			Version   string `json:"version"`
			Platforms []struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				URI    string `json:"uri"`
				SHA256 string `json:"sha256"`
				Bin    string `json:"bin"`
			} `json:"platforms"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(read("renderqueue.krew.yaml"), &krew); err != nil {
		t.Fatal(err)
	}
	if krew.Metadata.Name != "renderqueue" || krew.Spec.Version != version || len(krew.Spec.Platforms) != len(strings.Fields(platforms)) {
		t.Errorf("the krew manifest: %+v", krew)
	}
	for _, p := range strings.Fields(platforms) {
		osName, arch, _ := strings.Cut(p, "/")
		bin := read("renderqueue-" + osName + "-" + arch)
		archive := "kubectl-renderqueue-" + osName + "-" + arch + ".tar.gz"
		plugin := untar(t, gunzip(t, read(archive)))
		if !bytes.Equal(plugin["kubectl-renderqueue"], bin) || plugin["LICENSE"] == nil {
			t.Errorf("%s does not hold renderqueue-%s-%s as kubectl-renderqueue, with the LICENSE", archive, osName, arch)
		}
		found := false
		for _, kp := range krew.Spec.Platforms {
			if kp.Selector.MatchLabels["os"] == osName && kp.Selector.MatchLabels["arch"] == arch {
				found = true
				if kp.SHA256 != sums[archive] || !strings.HasSuffix(kp.URI, "/"+version+"/"+archive) || kp.Bin != "kubectl-renderqueue" {
					t.Errorf("krew's %s: %+v; the archive's sum is %s", p, kp, sums[archive])
				}
			}
		}
		if !found {
			t.Errorf("the krew manifest has no %s", p)
		}
		if osName == runtime.GOOS && arch == runtime.GOARCH {
			got, err := exec.Command(filepath.Join(out, "renderqueue-"+osName+"-"+arch), "version").Output()
			if err != nil || strings.TrimSpace(string(got)) != "renderqueue "+version {
				t.Errorf("renderqueue version: %q, %v", got, err)
			}
		}
	}

	// the SBOM: CycloneDX, of this version, listing the modules linked in
	var bom struct {
		BOMFormat string `json:"bomFormat"`
		Metadata  struct {
			Component struct{ Name, Version string } `json:"component"`
		} `json:"metadata"`
		Components []struct{ Name, Version string } `json:"components"`
	}
	if err := json.Unmarshal(read("renderqueue-"+version+".cdx.json"), &bom); err != nil {
		t.Fatal(err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Name != "github.com/renderqueue/renderqueue" || bom.Metadata.Component.Version != version {
		t.Errorf("the SBOM describes %+v (%s)", bom.Metadata.Component, bom.BOMFormat)
	}
	if !slices.ContainsFunc(bom.Components, func(c struct{ Name, Version string }) bool {
		return c.Name == "sigs.k8s.io/controller-runtime" && c.Version != ""
	}) {
		t.Errorf("the SBOM lists no sigs.k8s.io/controller-runtime among %d components", len(bom.Components))
	}

	// the release notes are the changelog's section
	if notes := string(read("RELEASE-NOTES.md")); !strings.HasPrefix(notes, "## ["+version+"] - 2026-12-05") ||
		!strings.Contains(notes, "Nothing to do.") || strings.Contains(notes, "v0.1.0") {
		t.Errorf("RELEASE-NOTES.md:\n%s", notes)
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// untar returns the regular files of a tar archive by name.
func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(h.Name, "./")] = data
	}
}

// operatorImage returns the operator Deployment's image and its RENDERQUEUE_IMAGE.
func operatorImage(t *testing.T, manifest []byte) (image, env string) {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if err == io.EOF {
				break
			}
			t.Fatal(err)
		}
		u := unstructured.Unstructured{Object: obj}
		if u.GetKind() != "Deployment" || u.GetName() != "renderqueue-operator" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(obj, "spec", "template", "spec", "containers")
		for _, c := range containers {
			c := c.(map[string]any)
			if c["name"] != "operator" {
				continue
			}
			image, _ = c["image"].(string)
			envs, _ := c["env"].([]any)
			for _, e := range envs {
				e := e.(map[string]any)
				if e["name"] == "RENDERQUEUE_IMAGE" {
					env, _ = e["value"].(string)
				}
			}
			return image, env
		}
	}
	t.Fatal("no operator Deployment")
	return "", ""
}
