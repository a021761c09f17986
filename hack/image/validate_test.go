package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestLayoutValidates unpacks an archive Build wrote and reads it back as crane and ko read an
// OCI layout (go-containerregistry's layout package), then validates the index deeply (every
// manifest, config, layer digest, diff ID and size) with its validate package.
func TestLayoutValidates(t *testing.T) {
	dir := t.TempDir()
	s := fakeSpec(t, dir)
	res, _ := buildInto(t, s, dir)
	unpacked := filepath.Join(dir, "layout")
	untar(t, filepath.Join(dir, "out", "image.oci.tar"), unpacked)

	l, err := layout.ImageIndexFromPath(unpacked)
	if err != nil {
		t.Fatal(err)
	}
	m, err := l.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Digest != res.Digest {
		t.Fatalf("index.json: %+v, want one descriptor of %s", m.Manifests, res.Digest)
	}
	idx, err := l.ImageIndex(res.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Errorf("validate.Index: %v", err)
	}
}

// untar unpacks the archive file into dir (regular files and directories only).
func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := os.Create(dst)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, tr); err != nil {
				t.Fatal(err)
			}
			if err := out.Close(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected entry %s (type %c) in the archive", h.Name, h.Typeflag)
		}
	}
}
