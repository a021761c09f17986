package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The tests read archives with archive/tar and encoding/json only, not with the code under test or
// go-containerregistry's readers, and check every digest themselves.

// ociArchive is an OCI image layout archive as read by readArchive.
type ociArchive struct {
	// raw is the archive's bytes.
	raw []byte
	// headers are the archive's entries, in order.
	headers []*tar.Header
	// top is index.json.
	top v1.IndexManifest
	// indexDigest and index are the image index index.json points at.
	indexDigest string
	index       v1.IndexManifest
	// images holds each platform's image, by "os/arch".
	images map[string]*ociImage
	// blobs holds every blob, by hex digest.
	blobs map[string][]byte
}

// ociImage is one platform's image.
type ociImage struct {
	digest   string
	manifest v1.Manifest
	config   v1.ConfigFile
	// layers holds each layer's entries, in layer order.
	layers [][]layerEntry
	// files is the image's file system: the layers applied in order (no whiteouts are expected).
	files map[string]layerEntry
}

// layerEntry is one entry of a layer.
type layerEntry struct {
	hdr  *tar.Header
	data []byte
}

// readArchive reads and checks the structure of the archive at file: the layout's files, every
// blob's name against its content, every descriptor's size and digest against its blob, the
// media types, and each config's diff IDs against its layers.
func readArchive(t *testing.T, file string) *ociArchive {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	a := &ociArchive{raw: raw, images: map[string]*ociImage{}, blobs: map[string][]byte{}}
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading %s: %v", file, err)
		}
		a.headers = append(a.headers, h)
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("reading %s in %s: %v", h.Name, file, err)
		}
		if h.Typeflag == tar.TypeReg {
			files[h.Name] = data
		}
		if hex, ok := strings.CutPrefix(h.Name, "blobs/sha256/"); ok && hex != "" {
			if got := sha256Hex(data); got != hex {
				t.Errorf("blob %s holds content with digest %s", h.Name, got)
			}
			a.blobs[hex] = data
		}
	}
	if got := string(files["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", got)
	}
	if err := json.Unmarshal(files["index.json"], &a.top); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(a.top.Manifests) != 1 {
		t.Fatalf("index.json has %d descriptors, want 1 (the image index)", len(a.top.Manifests))
	}
	desc := a.top.Manifests[0]
	a.indexDigest = desc.Digest.String()
	idxRaw := a.blob(t, desc, types.OCIImageIndex)
	if err := json.Unmarshal(idxRaw, &a.index); err != nil {
		t.Fatalf("the image index: %v", err)
	}
	if a.index.MediaType != types.OCIImageIndex || a.index.SchemaVersion != 2 {
		t.Errorf("the image index: media type %q, schema %d", a.index.MediaType, a.index.SchemaVersion)
	}
	for _, d := range a.index.Manifests {
		if d.Platform == nil {
			t.Fatalf("index entry %s has no platform", d.Digest)
		}
		img := &ociImage{digest: d.Digest.String(), files: map[string]layerEntry{}}
		if err := json.Unmarshal(a.blob(t, d, types.OCIManifestSchema1), &img.manifest); err != nil {
			t.Fatalf("manifest %s: %v", d.Digest, err)
		}
		if img.manifest.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %s: media type %q", d.Digest, img.manifest.MediaType)
		}
		if err := json.Unmarshal(a.blob(t, img.manifest.Config, types.OCIConfigJSON), &img.config); err != nil {
			t.Fatalf("config of %s: %v", d.Digest, err)
		}
		if img.config.OS != d.Platform.OS || img.config.Architecture != d.Platform.Architecture {
			t.Errorf("config of %s says %s/%s, the index %s/%s", d.Digest,
				img.config.OS, img.config.Architecture, d.Platform.OS, d.Platform.Architecture)
		}
		if len(img.config.RootFS.DiffIDs) != len(img.manifest.Layers) {
			t.Fatalf("config of %s: %d diff IDs for %d layers", d.Digest, len(img.config.RootFS.DiffIDs), len(img.manifest.Layers))
		}
		if len(img.config.History) != len(img.manifest.Layers) {
			t.Errorf("config of %s: %d history entries for %d layers", d.Digest, len(img.config.History), len(img.manifest.Layers))
		}
		for i, ld := range img.manifest.Layers {
			entries, diffID := readLayer(t, a.blob(t, ld, types.OCILayer))
			if diffID != img.config.RootFS.DiffIDs[i].String() {
				t.Errorf("layer %s: diff ID %s, the config says %s", ld.Digest, diffID, img.config.RootFS.DiffIDs[i])
			}
			img.layers = append(img.layers, entries)
			for _, e := range entries {
				name := strings.TrimSuffix(e.hdr.Name, "/")
				if strings.Contains(path.Base(name), ".wh.") {
					t.Errorf("layer %s has a whiteout %s", ld.Digest, e.hdr.Name)
				}
				img.files[name] = e
			}
		}
		key := d.Platform.OS + "/" + d.Platform.Architecture
		if d.Platform.Variant != "" {
			key += "/" + d.Platform.Variant
		}
		a.images[key] = img
	}
	return a
}

// blob returns the blob d names, checking its size and media type.
func (a *ociArchive) blob(t *testing.T, d v1.Descriptor, mt types.MediaType) []byte {
	t.Helper()
	if d.MediaType != mt {
		t.Errorf("descriptor %s: media type %q, want %q", d.Digest, d.MediaType, mt)
	}
	if d.Digest.Algorithm != "sha256" {
		t.Fatalf("descriptor %s: not sha256", d.Digest)
	}
	b, ok := a.blobs[d.Digest.Hex]
	if !ok {
		t.Fatalf("blob %s is not in the archive", d.Digest)
	}
	if int64(len(b)) != d.Size {
		t.Errorf("blob %s: %d bytes, the descriptor says %d", d.Digest, len(b), d.Size)
	}
	return b
}

// readLayer decompresses a gzip layer and returns its entries and diff ID. The gzip header must
// carry no name and no time.
func readLayer(t *testing.T, gz []byte) ([]layerEntry, string) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("a layer is not gzip: %v", err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" || zr.Comment != "" {
		t.Errorf("a layer's gzip header has time %v, name %q, comment %q; want none", zr.ModTime, zr.Name, zr.Comment)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("decompressing a layer: %v", err)
	}
	var entries []layerEntry
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading a layer: %v", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("reading %s in a layer: %v", h.Name, err)
		}
		entries = append(entries, layerEntry{hdr: h, data: data})
	}
	return entries, "sha256:" + sha256Hex(raw)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// imageWant is what checkImages expects of an archive.
type imageWant struct {
	name      string
	platforms []string
	path      string
	user      string
	// env is the environment expected after PATH.
	env []string
	// labels are the labels (and annotations) expected besides created.
	labels  map[string]string
	created time.Time
	base    bool
}

// fileWant is one file or directory expected in an image.
type fileWant struct {
	mode     fs.FileMode
	uid, gid int
}

// wantFiles is the file system an image must have: the base's entries (when base) and the
// binary, with these modes and owners, and nothing else.
func (w imageWant) wantFiles() map[string]fileWant {
	files := map[string]fileWant{}
	if w.base {
		files["etc"] = fileWant{mode: fs.ModeDir | 0o755}
		files["etc/passwd"] = fileWant{mode: 0o644}
		files["etc/group"] = fileWant{mode: 0o644}
		files["etc/ssl"] = fileWant{mode: fs.ModeDir | 0o755}
		files["etc/ssl/certs"] = fileWant{mode: fs.ModeDir | 0o755}
		files["etc/ssl/certs/ca-certificates.crt"] = fileWant{mode: 0o644}
		files["home"] = fileWant{mode: fs.ModeDir | 0o755}
		files["home/nonroot"] = fileWant{mode: fs.ModeDir | 0o700, uid: 65532, gid: 65532}
		files["tmp"] = fileWant{mode: fs.ModeDir | fs.ModeSticky | 0o777}
	}
	files[strings.TrimPrefix(w.path, "/")] = fileWant{mode: 0o755}
	return files
}

// checkImages checks everything the archive promises beyond its structure (readArchive): the
// names, the platforms, each config, the files with their modes and owners, the base's content,
// the timestamps, and no shell.
func checkImages(t *testing.T, a *ociArchive, w imageWant) {
	t.Helper()
	tagged := w.name[strings.LastIndex(w.name, ":")+1:]
	wantTop := map[string]string{annotationRefName: tagged, annotationImageName: w.name}
	if got := a.top.Manifests[0].Annotations; !reflect.DeepEqual(got, wantTop) {
		t.Errorf("index.json annotations = %v, want %v", got, wantTop)
	}
	for _, h := range a.headers {
		if !h.ModTime.Equal(time.Unix(0, 0)) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("archive entry %s: mtime %v, owner %d:%d (%q:%q); want the Unix epoch and 0:0 without names",
				h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname)
		}
	}

	labels := map[string]string{"org.opencontainers.image.created": w.created.UTC().Format(time.RFC3339)}
	for k, v := range w.labels {
		labels[k] = v
	}
	if !reflect.DeepEqual(a.index.Annotations, labels) {
		t.Errorf("the index's annotations = %v, want %v", a.index.Annotations, labels)
	}
	var platforms []string
	for p := range a.images {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)
	if !reflect.DeepEqual(platforms, w.platforms) {
		t.Fatalf("platforms = %v, want %v", platforms, w.platforms)
	}

	ca, err := caBundle()
	if err != nil {
		t.Fatal(err)
	}
	// Names no image may hold, anywhere.
	shells := map[string]bool{"sh": true, "bash": true, "dash": true, "ash": true, "zsh": true, "ksh": true, "busybox": true, "toybox": true}
	baseDigests := map[string]bool{}
	for _, p := range platforms {
		img := a.images[p]
		cfg := img.config
		if !reflect.DeepEqual(cfg.Config.Entrypoint, []string{w.path}) {
			t.Errorf("%s: entrypoint %q, want [%q]", p, cfg.Config.Entrypoint, w.path)
		}
		if len(cfg.Config.Cmd) != 0 {
			t.Errorf("%s: cmd %q, want none", p, cfg.Config.Cmd)
		}
		if cfg.Config.User != w.user {
			t.Errorf("%s: user %q, want %q", p, cfg.Config.User, w.user)
		}
		if wantEnv := append([]string{defaultPath}, w.env...); !reflect.DeepEqual(cfg.Config.Env, wantEnv) {
			t.Errorf("%s: env %q, want %q", p, cfg.Config.Env, wantEnv)
		}
		if !reflect.DeepEqual(cfg.Config.Labels, labels) {
			t.Errorf("%s: labels %v, want %v", p, cfg.Config.Labels, labels)
		}
		if !reflect.DeepEqual(img.manifest.Annotations, labels) {
			t.Errorf("%s: manifest annotations %v, want %v", p, img.manifest.Annotations, labels)
		}
		if !cfg.Created.Equal(w.created) {
			t.Errorf("%s: created %v, want %v", p, cfg.Created.Time, w.created)
		}
		for _, h := range cfg.History {
			if !h.Created.Equal(w.created) {
				t.Errorf("%s: history %q created %v, want %v", p, h.CreatedBy, h.Created.Time, w.created)
			}
		}

		want := w.wantFiles()
		for name, e := range img.files {
			fw, ok := want[name]
			if !ok {
				t.Errorf("%s: unexpected file /%s in the image", p, name)
				continue
			}
			if got := fileMode(e.hdr); got != fw.mode || e.hdr.Uid != fw.uid || e.hdr.Gid != fw.gid {
				t.Errorf("%s: /%s is %v %d:%d, want %v %d:%d", p, name, got, e.hdr.Uid, e.hdr.Gid, fw.mode, fw.uid, fw.gid)
			}
			if e.hdr.Uname != "" || e.hdr.Gname != "" || e.hdr.Format == tar.FormatPAX {
				t.Errorf("%s: /%s has owner names %q:%q or PAX records", p, name, e.hdr.Uname, e.hdr.Gname)
			}
		}
		for name := range want {
			if _, ok := img.files[name]; !ok {
				t.Errorf("%s: /%s is missing", p, name)
			}
		}
		for _, layer := range img.layers {
			for _, e := range layer {
				if shells[path.Base(strings.TrimSuffix(e.hdr.Name, "/"))] {
					t.Errorf("%s: a layer holds a shell: %s", p, e.hdr.Name)
				}
			}
		}

		// The layers: the base's files dated at the Unix epoch, the binary at the image's time.
		wantLayers := 1
		if w.base {
			wantLayers = 2
			baseDigests[img.manifest.Layers[0].Digest.String()] = true
			for _, e := range img.layers[0] {
				if !e.hdr.ModTime.Equal(time.Unix(0, 0)) {
					t.Errorf("%s: base entry %s dated %v, want the Unix epoch", p, e.hdr.Name, e.hdr.ModTime)
				}
			}
		}
		if len(img.layers) != wantLayers {
			t.Fatalf("%s: %d layers, want %d", p, len(img.layers), wantLayers)
		}
		for _, e := range img.layers[len(img.layers)-1] {
			if !e.hdr.ModTime.Equal(w.created) {
				t.Errorf("%s: %s dated %v, want %v", p, e.hdr.Name, e.hdr.ModTime, w.created)
			}
		}

		if w.base {
			checkBase(t, p, img, ca)
		}
	}
	if w.base && len(baseDigests) != 1 {
		t.Errorf("the platforms' base layers differ: %v", baseDigests)
	}
}

// checkBase checks the content of the base's files: the CA certificates, passwd and group.
func checkBase(t *testing.T, platform string, img *ociImage, ca []byte) {
	t.Helper()
	pemData := img.files["etc/ssl/certs/ca-certificates.crt"].data
	if !bytes.Equal(pemData, ca) {
		t.Errorf("%s: the CA certificates differ from the x509roots bundle's", platform)
	}
	n := 0
	for rest := pemData; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			if len(bytes.TrimSpace(rest)) != 0 {
				t.Errorf("%s: trailing bytes in the CA certificates", platform)
			}
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Errorf("%s: a CA certificate does not parse: %v", platform, err)
			continue
		}
		if !c.IsCA {
			t.Errorf("%s: %s is not a CA", platform, c.Subject)
		}
		n++
	}
	// Mozilla's store has well over 100 roots; a handful would mean a broken bundle.
	if n < 100 {
		t.Errorf("%s: %d CA certificates, want at least 100", platform, n)
	}

	wantUsers := map[string]string{"root": "0:0", "nobody": "65534:65534", "nonroot": "65532:65532"}
	users := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(img.files["etc/passwd"].data)), "\n") {
		f := strings.Split(line, ":")
		if len(f) != 7 {
			t.Errorf("%s: /etc/passwd line %q", platform, line)
			continue
		}
		users[f[0]] = f[2] + ":" + f[3]
		if f[6] != "/sbin/nologin" {
			t.Errorf("%s: %s's shell is %q", platform, f[0], f[6])
		}
		if f[0] == "nonroot" && f[5] != "/home/nonroot" {
			t.Errorf("%s: nonroot's home is %q", platform, f[5])
		}
	}
	if !reflect.DeepEqual(users, wantUsers) {
		t.Errorf("%s: /etc/passwd has %v, want %v", platform, users, wantUsers)
	}
	wantGroups := map[string]string{"root": "0", "nobody": "65534", "nonroot": "65532"}
	groups := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(img.files["etc/group"].data)), "\n") {
		f := strings.Split(line, ":")
		if len(f) != 4 {
			t.Errorf("%s: /etc/group line %q", platform, line)
			continue
		}
		groups[f[0]] = f[2]
	}
	if !reflect.DeepEqual(groups, wantGroups) {
		t.Errorf("%s: /etc/group has %v, want %v", platform, groups, wantGroups)
	}
}
