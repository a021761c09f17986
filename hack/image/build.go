package main

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The annotations on the index.json descriptor of the image: the tag (OCI), and the full name
// under which `ctr images import` (containerd) stores the image.
const (
	annotationRefName   = "org.opencontainers.image.ref.name"
	annotationImageName = "io.containerd.image.name"
	// labelCreated is set from Spec.Created on every image.
	labelCreated = "org.opencontainers.image.created"
)

// defaultPath is the PATH in the image's environment: the one Docker gives an image built FROM
// scratch (and distroless has), so that the Dockerfile's image and this one agree.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Spec describes one image: a single static binary per platform on an optional base.
type Spec struct {
	// Name is the full reference the image is stored under by `ctr images import`
	// (io.containerd.image.name), with a tag: "ghcr.io/renderqueue/renderqueue:v0.1.0".
	Name string
	// Binaries maps a platform ("linux/amd64", "linux/arm/v7") to the file on this machine that
	// becomes the binary of that platform's image.
	Binaries map[string]string
	// Path is where the binary goes in the image ("/renderqueue").
	Path string
	// Entrypoint is the image's ENTRYPOINT; empty means [Path].
	Entrypoint []string
	// Cmd is the image's CMD (arguments to the entrypoint); may be empty.
	Cmd []string
	// Env is the image's environment ("KEY=value") after PATH (defaultPath).
	Env []string
	// User is the image's USER ("65532:65532").
	User string
	// Labels are the config's labels, and the annotations of every manifest and of the index.
	// org.opencontainers.image.created is set from Created unless given.
	Labels map[string]string
	// Created is the one time in the image: the configs' created, the history's, the created
	// label, and the binary's mtime (the base layer's files are dated at the Unix epoch, so that
	// the base layer is the same blob in every build).
	Created time.Time
	// Base adds the base layer (baseEntries: passwd, group, CA certificates, /tmp,
	// /home/nonroot) under the binary's.
	Base bool
}

// Result is what Build produced.
type Result struct {
	// Digest is the image index's digest ("sha256:..."): what a registry reports after a push.
	Digest v1.Hash
	// Images holds each platform's image manifest digest, by platform.
	Images map[string]v1.Hash
}

// tag is the tag of a reference "host/repo:tag" ("" when it has none).
func tag(name string) string {
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		return name[i+1:]
	}
	return ""
}

// check reports the first thing wrong with s.
func (s Spec) check() error {
	if s.Name == "" || tag(s.Name) == "" || strings.Contains(s.Name, "@") {
		return fmt.Errorf("image name %q: want a full name with a tag (host/repository:tag)", s.Name)
	}
	if len(s.Binaries) == 0 {
		return fmt.Errorf("no binary: give at least one platform=file")
	}
	for p := range s.Binaries {
		if _, err := parsePlatform(p); err != nil {
			return err
		}
	}
	if !path.IsAbs(s.Path) || path.Clean(s.Path) != s.Path || s.Path == "/" {
		return fmt.Errorf("binary path %q: want an absolute file path such as /renderqueue", s.Path)
	}
	if s.User == "" {
		return fmt.Errorf("no user: give the image's USER (uid:gid)")
	}
	for _, e := range s.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" || k == "PATH" {
			return fmt.Errorf("env %q: want KEY=value, KEY not PATH", e)
		}
	}
	return nil
}

// parsePlatform parses "os/arch" or "os/arch/variant".
func parsePlatform(p string) (v1.Platform, error) {
	parts := strings.Split(p, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return v1.Platform{}, fmt.Errorf("platform %q: want os/arch or os/arch/variant", p)
	}
	pl := v1.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		pl.Variant = parts[2]
	}
	return pl, nil
}

// Build builds the image index that s describes and writes it, as an OCI image layout in a tar
// archive, to out (through a temporary file beside it, renamed into place). The same Spec and
// the same binaries give the same bytes, hence the same digest.
func Build(s Spec, out string) (Result, error) {
	if err := s.check(); err != nil {
		return Result{}, err
	}
	labels := map[string]string{labelCreated: s.Created.UTC().Format(time.RFC3339)}
	for k, v := range s.Labels {
		labels[k] = v
	}

	var base *layer
	if s.Base {
		entries, err := baseEntries()
		if err != nil {
			return Result{}, err
		}
		if base, err = newLayer(entries, time.Unix(0, 0)); err != nil {
			return Result{}, fmt.Errorf("building the base layer: %w", err)
		}
	}

	platforms := make([]string, 0, len(s.Binaries))
	for p := range s.Binaries {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)

	// The platforms' images are built (their binary layers compressed) concurrently.
	images := make([]v1.Image, len(platforms))
	errs := make([]error, len(platforms))
	var wg sync.WaitGroup
	for i, p := range platforms {
		wg.Go(func() {
			images[i], errs[i] = s.image(p, base, labels)
		})
	}
	wg.Wait()

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	res := Result{Images: map[string]v1.Hash{}}
	for i, p := range platforms {
		if errs[i] != nil {
			return Result{}, fmt.Errorf("building the %s image: %w", p, errs[i])
		}
		pl, _ := parsePlatform(p)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        images[i],
			Descriptor: v1.Descriptor{Platform: &pl},
		})
		d, err := images[i].Digest()
		if err != nil {
			return Result{}, fmt.Errorf("the %s image's digest: %w", p, err)
		}
		res.Images[p] = d
	}
	idx, ok := mutate.Annotations(idx, labels).(v1.ImageIndex)
	if !ok {
		return Result{}, fmt.Errorf("annotating the index: not an index")
	}
	d, err := idx.Digest()
	if err != nil {
		return Result{}, fmt.Errorf("the index's digest: %w", err)
	}
	res.Digest = d
	if err := writeArchive(idx, map[string]string{
		annotationRefName:   tag(s.Name),
		annotationImageName: s.Name,
	}, out); err != nil {
		return Result{}, err
	}
	return res, nil
}

// image builds the image of one platform: the base layer (if any), then the binary's layer.
func (s Spec) image(platform string, base *layer, labels map[string]string) (v1.Image, error) {
	pl, err := parsePlatform(platform)
	if err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(s.Binaries[platform])
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	var entries []entry
	for dir := path.Dir(s.Path); dir != "/"; dir = path.Dir(dir) {
		entries = append(entries, entry{Path: dir[1:], Mode: fs.ModeDir | 0o755})
	}
	entries = append(entries, entry{Path: s.Path[1:], Mode: 0o755, Data: bin})
	binLayer, err := newLayer(entries, s.Created)
	if err != nil {
		return nil, fmt.Errorf("building the binary's layer: %w", err)
	}

	entrypoint := s.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = []string{s.Path}
	}
	created := v1.Time{Time: s.Created.UTC()}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: pl.Architecture,
		OS:           pl.OS,
		Variant:      pl.Variant,
		Created:      created,
		Config: v1.Config{
			Entrypoint: entrypoint,
			Cmd:        s.Cmd,
			User:       s.User,
			Env:        append([]string{defaultPath}, s.Env...),
			Labels:     labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, fmt.Errorf("setting the config: %w", err)
	}
	var adds []mutate.Addendum
	if base != nil {
		adds = append(adds, mutate.Addendum{Layer: base, History: v1.History{
			Created:   created,
			CreatedBy: "hack/image: base (/etc/passwd, /etc/group, /" + caPath + ", /tmp, /home/nonroot)",
			Comment:   "CA certificates: golang.org/x/crypto/x509roots/fallback",
		}})
	}
	adds = append(adds, mutate.Addendum{Layer: binLayer, History: v1.History{
		Created:   created,
		CreatedBy: "hack/image: " + s.Path,
	}})
	img, err = mutate.Append(img, adds...)
	if err != nil {
		return nil, fmt.Errorf("adding the layers: %w", err)
	}
	img, ok := mutate.Annotations(img, labels).(v1.Image)
	if !ok {
		return nil, fmt.Errorf("annotating the manifest: not an image")
	}
	return img, nil
}

// layer is a gzip-compressed OCI layer held in memory (a v1.Layer).
type layer struct {
	gz             []byte
	digest, diffID v1.Hash
}

var _ v1.Layer = (*layer)(nil)

// newLayer builds the layer holding entries (every mtime set to mtime).
func newLayer(entries []entry, mtime time.Time) (*layer, error) {
	raw, err := layerTar(entries, mtime)
	if err != nil {
		return nil, err
	}
	gz, err := gzipBytes(raw)
	if err != nil {
		return nil, err
	}
	return &layer{gz: gz, digest: sha256Hash(gz), diffID: sha256Hash(raw)}, nil
}

func sha256Hash(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// Digest is the compressed layer's digest.
func (l *layer) Digest() (v1.Hash, error) { return l.digest, nil }

// DiffID is the uncompressed layer's digest.
func (l *layer) DiffID() (v1.Hash, error) { return l.diffID, nil }

// Compressed returns the gzip-compressed layer.
func (l *layer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.gz)), nil
}

// Uncompressed returns the layer's tar.
func (l *layer) Uncompressed() (io.ReadCloser, error) {
	zr, err := gzip.NewReader(bytes.NewReader(l.gz))
	if err != nil {
		return nil, fmt.Errorf("decompressing layer %s: %w", l.digest, err)
	}
	return zr, nil
}

// Size is the compressed layer's size.
func (l *layer) Size() (int64, error) { return int64(len(l.gz)), nil }

// MediaType is the OCI gzip layer type.
func (l *layer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
