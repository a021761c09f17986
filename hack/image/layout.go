package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ociLayout is the content of the layout's oci-layout file.
const ociLayout = `{"imageLayoutVersion":"1.0.0"}`

// blob is one content-addressed file of the layout.
type blob struct {
	digest v1.Hash
	open   func() (io.ReadCloser, error)
	size   int64
}

// writeArchive writes idx as an OCI image layout in a tar archive to out: oci-layout,
// index.json (one descriptor, the index's, with annotations) and blobs/sha256/<hex> for the index,
// every manifest, config and layer (each blob once: the base layer is shared by the platforms).
// The archive is reproducible: fixed entry order, mtimes at the Unix epoch, owner 0:0, mode 0644
// (0755 for directories).
func writeArchive(idx v1.ImageIndex, annotations map[string]string, out string) error {
	blobs, err := collectBlobs(idx)
	if err != nil {
		return err
	}
	rawIdx, err := idx.RawManifest()
	if err != nil {
		return fmt.Errorf("the index manifest: %w", err)
	}
	d, err := idx.Digest()
	if err != nil {
		return fmt.Errorf("the index digest: %w", err)
	}
	top, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIImageIndex,
			Size:        int64(len(rawIdx)),
			Digest:      d,
			Annotations: annotations,
		}},
	})
	if err != nil {
		return fmt.Errorf("encoding index.json: %w", err)
	}

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("creating the archive's directory: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*")
	if err != nil {
		return fmt.Errorf("creating the archive: %w", err)
	}
	defer func() { _ = os.Remove(f.Name()) }() // after the rename, a no-op
	if err := writeLayoutTar(f, top, blobs); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if err := f.Chmod(0o644); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Rename(f.Name(), out); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return nil
}

// collectBlobs returns every blob idx refers to (the index itself, each image's manifest,
// config and layers), sorted by digest, each once.
func collectBlobs(idx v1.ImageIndex) ([]blob, error) {
	byDigest := map[v1.Hash]blob{}
	addBytes := func(b []byte) {
		h := sha256Hash(b)
		byDigest[h] = blob{digest: h, size: int64(len(b)), open: bytesOpener(b)}
	}
	raw, err := idx.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("the index manifest: %w", err)
	}
	addBytes(raw)
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("the index manifest: %w", err)
	}
	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", desc.Digest, err)
		}
		raw, err := img.RawManifest()
		if err != nil {
			return nil, fmt.Errorf("image %s's manifest: %w", desc.Digest, err)
		}
		addBytes(raw)
		cfg, err := img.RawConfigFile()
		if err != nil {
			return nil, fmt.Errorf("image %s's config: %w", desc.Digest, err)
		}
		addBytes(cfg)
		layers, err := img.Layers()
		if err != nil {
			return nil, fmt.Errorf("image %s's layers: %w", desc.Digest, err)
		}
		for _, l := range layers {
			h, err := l.Digest()
			if err != nil {
				return nil, fmt.Errorf("image %s: a layer's digest: %w", desc.Digest, err)
			}
			size, err := l.Size()
			if err != nil {
				return nil, fmt.Errorf("image %s: layer %s's size: %w", desc.Digest, h, err)
			}
			byDigest[h] = blob{digest: h, size: size, open: l.Compressed}
		}
	}
	blobs := make([]blob, 0, len(byDigest))
	for _, b := range byDigest {
		blobs = append(blobs, b)
	}
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].digest.String() < blobs[j].digest.String() })
	return blobs, nil
}

// bytesOpener opens b.
func bytesOpener(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// writeLayoutTar writes the layout's entries: oci-layout, index.json, blobs/, blobs/sha256/,
// then the blobs in digest order.
func writeLayoutTar(w io.Writer, indexJSON []byte, blobs []blob) error {
	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0).UTC()
	file := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{
			Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: epoch, Format: tar.FormatUSTAR,
		}); err != nil {
			return fmt.Errorf("tar header of %s: %w", name, err)
		}
		n, err := io.Copy(tw, r)
		if err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
		if n != size {
			return fmt.Errorf("writing %s: %d bytes, want %d", name, n, size)
		}
		return nil
	}
	dir := func(name string) error {
		if err := tw.WriteHeader(&tar.Header{
			Name: name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch, Format: tar.FormatUSTAR,
		}); err != nil {
			return fmt.Errorf("tar header of %s: %w", name, err)
		}
		return nil
	}
	if err := file("oci-layout", int64(len(ociLayout)), bytes.NewReader([]byte(ociLayout))); err != nil {
		return err
	}
	if err := file("index.json", int64(len(indexJSON)), bytes.NewReader(indexJSON)); err != nil {
		return err
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	for _, b := range blobs {
		if b.digest.Algorithm != "sha256" {
			return fmt.Errorf("blob %s: only sha256 blobs are written", b.digest)
		}
		rc, err := b.open()
		if err != nil {
			return fmt.Errorf("opening blob %s: %w", b.digest, err)
		}
		err = file("blobs/sha256/"+b.digest.Hex, b.size, rc)
		_ = rc.Close()
		if err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("closing the archive: %w", err)
	}
	return nil
}
