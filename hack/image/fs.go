package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// The owners of the image's files: root, and the non-root user the renderqueue image runs as
// (65532, "nonroot", as in distroless static:nonroot).
const (
	rootID    = 0
	nonrootID = 65532
)

// entry is one file or directory of a layer.
type entry struct {
	// Path is the slash-separated path inside the image, without a leading slash
	// ("etc/passwd"); a directory's has no trailing slash either.
	Path string
	// Mode is the type (fs.ModeDir, or 0 for a regular file) and permission bits, with
	// fs.ModeSticky / fs.ModeSetuid / fs.ModeSetgid where set.
	Mode     fs.FileMode
	UID, GID int
	// Data is a regular file's content.
	Data []byte
}

// passwd and group hold root, nobody and nonroot, as distroless static:nonroot does; none of
// them has a login shell (the image has no shell).
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"nonroot:x:65532:\n"
)

// caPath is where the CA certificates go: the first file Go's crypto/x509 looks for on Linux,
// and the path Debian and distroless use.
const caPath = "etc/ssl/certs/ca-certificates.crt"

// baseEntries is the base layer shared by every image built with a base (-base): /etc/passwd,
// /etc/group, the CA certificates, /tmp (1777) and the non-root user's home (/home/nonroot,
// 0700, 65532:65532), and nothing else: no shell, no package database, no time zones.
func baseEntries() ([]entry, error) {
	ca, err := caBundle()
	if err != nil {
		return nil, err
	}
	return []entry{
		{Path: "etc", Mode: fs.ModeDir | 0o755},
		{Path: "etc/group", Mode: 0o644, Data: []byte(group)},
		{Path: "etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Path: "etc/ssl", Mode: fs.ModeDir | 0o755},
		{Path: "etc/ssl/certs", Mode: fs.ModeDir | 0o755},
		{Path: caPath, Mode: 0o644, Data: ca},
		{Path: "home", Mode: fs.ModeDir | 0o755},
		{Path: "home/nonroot", Mode: fs.ModeDir | 0o700, UID: nonrootID, GID: nonrootID},
		{Path: "tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
	}, nil
}

// tarMode converts a FileMode's permission and special bits to the octal mode of a tar header.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// fileMode is tarMode's inverse (type bits from the header's type flag).
func fileMode(h *tar.Header) fs.FileMode {
	m := fs.FileMode(h.Mode & 0o777)
	if h.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if h.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if h.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch h.Typeflag {
	case tar.TypeDir:
		m |= fs.ModeDir
	case tar.TypeSymlink:
		m |= fs.ModeSymlink
	}
	return m
}

// layerTar writes entries as an uncompressed tar, reproducibly: sorted by path (a directory
// before its contents), every entry with mtime mtime, numeric owners only (no user or group
// names), USTAR headers (no PAX records with access or change times).
func layerTar(entries []entry, mtime time.Time) ([]byte, error) {
	sorted := append([]entry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, e := range sorted {
		if e.Path == "" || strings.HasPrefix(e.Path, "/") || path.Clean(e.Path) != e.Path || e.Path == "." {
			return nil, fmt.Errorf("layer entry %q: want a clean relative path", e.Path)
		}
		if seen[e.Path] {
			return nil, fmt.Errorf("layer entry %q appears twice", e.Path)
		}
		seen[e.Path] = true
		if dir := path.Dir(e.Path); dir != "." && !seen[dir] {
			return nil, fmt.Errorf("layer entry %q: its directory %q is not in the layer", e.Path, dir)
		}
		h := &tar.Header{
			Name:    e.Path,
			Mode:    tarMode(e.Mode),
			Uid:     e.UID,
			Gid:     e.GID,
			ModTime: mtime.UTC().Truncate(time.Second),
			Format:  tar.FormatUSTAR,
		}
		switch {
		case e.Mode.IsDir():
			h.Typeflag = tar.TypeDir
			h.Name += "/"
		case e.Mode.IsRegular():
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.Data))
		default:
			return nil, fmt.Errorf("layer entry %q: unsupported file type %v", e.Path, e.Mode.Type())
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing the tar header of %s: %w", e.Path, err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, fmt.Errorf("writing %s into the layer: %w", e.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer's tar: %w", err)
	}
	return buf.Bytes(), nil
}

// gzipBytes compresses b with a gzip header that carries no name and no time, so that the same
// bytes (and Go version) give the same result.
func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, fmt.Errorf("starting gzip: %w", err)
	}
	if _, err := zw.Write(b); err != nil {
		return nil, fmt.Errorf("compressing a layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("compressing a layer: %w", err)
	}
	return buf.Bytes(), nil
}

// The two directories writeRootfs fills under its out directory.
const (
	// rootfsDir holds every base entry owned by root, laid out as in the image.
	rootfsDir = "rootfs"
	// homeDir holds the non-root user's home (nonroot/), the one base entry owned by 65532:65532.
	homeDir = "home"
)

// writeRootfs writes the base entries into out as files, for the Dockerfile: out/rootfs holds
// those owned by root and out/home the non-root user's home directory (nonroot, 0700), so that
// `COPY out/rootfs/ /` and `COPY --chown=65532:65532 out/home/ /home/` give the base layer's
// files, modes and owners (COPY keeps modes, not owners). Modes are set with chmod, so the umask
// does not matter; owners are left to COPY.
func writeRootfs(out string) error {
	entries, err := baseEntries()
	if err != nil {
		return err
	}
	for _, e := range entries {
		var dst string
		switch {
		case e.UID == rootID && e.GID == rootID:
			dst = filepath.Join(out, rootfsDir, filepath.FromSlash(e.Path))
		case e.UID == nonrootID && e.GID == nonrootID && path.Dir(e.Path) == "home":
			dst = filepath.Join(out, homeDir, path.Base(e.Path))
		default:
			return fmt.Errorf("base entry %s is owned by %d:%d, which writeRootfs cannot lay out for COPY", e.Path, e.UID, e.GID)
		}
		if e.Mode.IsDir() {
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return fmt.Errorf("writing the rootfs: %w", err)
			}
		} else {
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return fmt.Errorf("writing the rootfs: %w", err)
			}
			if err := os.WriteFile(dst, e.Data, 0o644); err != nil {
				return fmt.Errorf("writing the rootfs: %w", err)
			}
		}
		if err := os.Chmod(dst, e.Mode); err != nil {
			return fmt.Errorf("writing the rootfs: %w", err)
		}
	}
	return nil
}
