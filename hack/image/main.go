// Command image builds container images without a Docker daemon or a registry: each one a single
// static binary per platform on a small fixed base (passwd, group, CA certificates, /tmp,
// /home/nonroot, no shell), written as an OCI image layout in a tar archive that
// `ctr images import`, `skopeo copy oci-archive:...` and `crane push` take. The same inputs give
// the same bytes: see docs/image.md.
//
// Usage:
//
//	image build -out FILE -name HOST/REPO:TAG -binary OS/ARCH=FILE... -path /BIN -user UID:GID
//	      [-entrypoint ARG]... [-cmd ARG]... [-env KEY=VALUE]... [-label KEY=VALUE]...
//	      [-epoch SECONDS] [-base=false]
//	image rootfs -out DIR
//
// build writes the archive to FILE and its index digest ("sha256:...") to FILE.digest and to
// stdout. rootfs writes the base's files into DIR for the Dockerfile (DIR/rootfs, DIR/home).
//
// It is a module of its own (github.com/renderqueue/renderqueue/hack/image) so that
// go-containerregistry stays out of the main module's dependencies; `make image` and
// `make pause-image` run it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			_, _ = fmt.Fprintln(os.Stderr, "image:", err)
		}
		os.Exit(2)
	}
}

// usage is printed for a missing or unknown subcommand.
const usage = `usage:
  image build -out FILE -name HOST/REPO:TAG -binary OS/ARCH=FILE... -path /BIN -user UID:GID
        [-entrypoint ARG]... [-cmd ARG]... [-env KEY=VALUE]... [-label KEY=VALUE]...
        [-epoch SECONDS] [-base=false]
  image rootfs -out DIR`

// run runs one subcommand.
func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		_, _ = fmt.Fprintln(stderr, usage)
		return errors.New("no subcommand")
	}
	switch args[0] {
	case "build":
		return runBuild(args[1:], stdout, stderr)
	case "rootfs":
		return runRootfs(args[1:], stderr)
	default:
		_, _ = fmt.Fprintln(stderr, usage)
		return fmt.Errorf("unknown subcommand %q", args[0])
	}
}

// listFlag is a flag that may be given several times.
type listFlag []string

// String joins the values.
func (l *listFlag) String() string { return strings.Join(*l, " ") }

// Set appends a value.
func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// runBuild parses build's flags, builds the image and writes the archive and its digest.
func runBuild(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var binaries, entrypoint, cmd, env, labels listFlag
	out := fs.String("out", "", "the archive to write (an OCI image layout in a tar); its digest goes to `FILE`.digest")
	name := fs.String("name", "", "the image's full name with a tag (io.containerd.image.name; the tag is org.opencontainers.image.ref.name)")
	fs.Var(&binaries, "binary", "`os/arch=file`: the binary of one platform (repeat per platform)")
	binPath := fs.String("path", "", "where the binary goes in the image (`/name`)")
	fs.Var(&entrypoint, "entrypoint", "one argument of the ENTRYPOINT (repeat; default: the binary's -path)")
	fs.Var(&cmd, "cmd", "one argument of the CMD (repeat; default none)")
	user := fs.String("user", "", "the image's USER (`uid:gid`)")
	fs.Var(&env, "env", "`KEY=value` in the image's environment, after PATH (repeat)")
	fs.Var(&labels, "label", "`key=value`: a label of the config, and an annotation of the manifests and the index (repeat)")
	epoch := fs.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), "the image's time in `seconds` since the Unix epoch (default $SOURCE_DATE_EPOCH, else 0)")
	base := fs.Bool("base", true, "put the base layer (passwd, group, CA certificates, /tmp, /home/nonroot) under the binary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("build: unexpected arguments %q", fs.Args())
	}
	if *out == "" {
		return errors.New("build: -out is required")
	}
	spec := Spec{
		Name:       *name,
		Binaries:   map[string]string{},
		Path:       *binPath,
		Entrypoint: entrypoint,
		Cmd:        cmd,
		Env:        env,
		User:       *user,
		Labels:     map[string]string{},
		Base:       *base,
	}
	for _, b := range binaries {
		p, file, ok := strings.Cut(b, "=")
		if !ok || file == "" {
			return fmt.Errorf("build: -binary %q: want os/arch=file", b)
		}
		if _, dup := spec.Binaries[p]; dup {
			return fmt.Errorf("build: -binary: platform %s given twice", p)
		}
		spec.Binaries[p] = file
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("build: -label %q: want key=value", l)
		}
		spec.Labels[k] = v
	}
	secs := int64(0)
	if *epoch != "" {
		var err error
		if secs, err = strconv.ParseInt(*epoch, 10, 64); err != nil || secs < 0 {
			return fmt.Errorf("build: -epoch %q: want seconds since the Unix epoch", *epoch)
		}
	}
	spec.Created = time.Unix(secs, 0).UTC()

	res, err := Build(spec, *out)
	if err != nil {
		return fmt.Errorf("build %s: %w", spec.Name, err)
	}
	if err := os.WriteFile(*out+".digest", []byte(res.Digest.String()+"\n"), 0o644); err != nil {
		return fmt.Errorf("build: writing the digest: %w", err)
	}
	_, err = fmt.Fprintln(stdout, res.Digest)
	return err
}

// runRootfs writes the base's files into -out, for the Dockerfile.
func runRootfs(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("rootfs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "the `directory` to write rootfs/ and home/ into")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || fs.NArg() > 0 {
		return errors.New("rootfs: want -out DIR and nothing else")
	}
	if err := writeRootfs(*out); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	return nil
}
