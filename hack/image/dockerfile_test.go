package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The Dockerfile is the documented path for users with Docker; it must describe the image make
// image builds. checkDockerfile reads it, works out the file system its final stage's COPY
// instructions give (with BuildKit's COPY rules, from the files hack/image's rootfs subcommand
// writes, as the Dockerfile's build stage runs it), and compares that, its ENTRYPOINT, USER and
// LABEL keys with an image the builder produced.

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY, ...
	args string
	line int
}

// parseDockerfile splits a Dockerfile into instructions: comments and blank lines dropped,
// lines ending in a backslash joined with the next.
func parseDockerfile(b []byte) ([]instruction, error) {
	var out []instruction
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start})
		cur.Reset()
	}
	if cur.Len() != 0 {
		return nil, fmt.Errorf("the Dockerfile ends in a continuation line")
	}
	return out, nil
}

// dockerfile is what checkDockerfile needs of the Dockerfile.
type dockerfile struct {
	// rootfsOut is where the build stage runs `rootfs -out`; binary is its go build's -o.
	rootfsOut, binary string
	// goBuild is the build stage's go build command.
	goBuild string
	// final is the final stage's instructions after FROM.
	final []instruction
	// finalFrom is the final stage's FROM argument.
	finalFrom string
}

var (
	rootfsRun = regexp.MustCompile(`go -C hack/image run \. rootfs -out (\S+)`)
	goBuildO  = regexp.MustCompile(`go build .* -o (\S+) \./cmd/renderqueue$`)
)

// readDockerfile reads the Dockerfile at file.
func readDockerfile(file string) (dockerfile, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return dockerfile{}, err
	}
	ins, err := parseDockerfile(b)
	if err != nil {
		return dockerfile{}, err
	}
	var stages [][]instruction
	for _, in := range ins {
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], in)
		}
	}
	if len(stages) < 2 {
		return dockerfile{}, fmt.Errorf("the Dockerfile has %d stages, want a build stage and the image's", len(stages))
	}
	var d dockerfile
	final := stages[len(stages)-1]
	d.finalFrom, d.final = final[0].args, final[1:]
	for _, stage := range stages[:len(stages)-1] {
		for _, in := range stage {
			if in.cmd != "RUN" {
				continue
			}
			if m := rootfsRun.FindStringSubmatch(in.args); m != nil {
				d.rootfsOut = m[1]
			}
			if m := goBuildO.FindStringSubmatch(in.args); m != nil {
				d.binary, d.goBuild = m[1], in.args
			}
		}
	}
	if d.rootfsOut == "" || d.binary == "" {
		return dockerfile{}, fmt.Errorf("the Dockerfile's build stage runs no `go -C hack/image run . rootfs -out DIR` (%q) or no `go build ... -o FILE ./cmd/renderqueue` (%q)", d.rootfsOut, d.binary)
	}
	return d, nil
}

// modelFile is a file or directory of the file system a Dockerfile's COPY instructions give.
type modelFile struct {
	mode     fs.FileMode
	uid, gid int
	data     []byte
	// binary marks the renderqueue binary (its content differs between the two builds).
	binary bool
}

// copyModel applies one COPY of the final stage to files, as BuildKit does: a directory source
// copies its contents (the destination directory, if missing, is created 0755 and owned by the
// --chown user or root; an existing one is left alone); a file source is copied to the
// destination (into it, if it ends with a slash); every copied entry keeps its mode and is owned
// by the --chown user, or by root (who wrote it in the build stage); missing parents are created
// 0755. resolve maps a build-stage path to this machine's.
func copyModel(files map[string]modelFile, args string, resolve func(string) (string, bool, error)) error {
	fields := strings.Fields(args)
	uid, gid := 0, 0
	var rest []string
	from := ""
	for _, f := range fields {
		switch {
		case strings.HasPrefix(f, "--from="):
			from = strings.TrimPrefix(f, "--from=")
		case strings.HasPrefix(f, "--chown="):
			if _, err := fmt.Sscanf(strings.TrimPrefix(f, "--chown="), "%d:%d", &uid, &gid); err != nil {
				return fmt.Errorf("COPY %s: --chown wants numeric uid:gid", args)
			}
		case strings.HasPrefix(f, "--"):
			return fmt.Errorf("COPY %s: flag %s is not modelled", args, f)
		default:
			rest = append(rest, f)
		}
	}
	if from != "build" || len(rest) != 2 {
		return fmt.Errorf("COPY %s: want --from=build SRC DEST", args)
	}
	src, dest := rest[0], rest[1]
	host, isBinary, err := resolve(src)
	if err != nil {
		return err
	}
	mkdirs := func(dir string) {
		for p := strings.Trim(path.Clean(dir), "/"); p != "" && p != "."; p = path.Dir(p) {
			if _, ok := files[p]; !ok {
				files[p] = modelFile{mode: fs.ModeDir | 0o755, uid: uid, gid: gid}
			}
			if path.Dir(p) == "." {
				break
			}
		}
	}
	fi, err := os.Lstat(host)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		target := strings.TrimPrefix(dest, "/")
		if strings.HasSuffix(dest, "/") {
			target = path.Join(target, path.Base(src))
		}
		mkdirs(path.Dir(target))
		data, err := os.ReadFile(host)
		if err != nil {
			return err
		}
		files[target] = modelFile{mode: fi.Mode(), uid: uid, gid: gid, data: data, binary: isBinary}
		return nil
	}
	mkdirs(dest)
	return filepath.WalkDir(host, func(p string, de fs.DirEntry, err error) error {
		if err != nil || p == host {
			return err
		}
		rel, err := filepath.Rel(host, p)
		if err != nil {
			return err
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		f := modelFile{mode: info.Mode(), uid: uid, gid: gid}
		if info.Mode().IsRegular() {
			if f.data, err = os.ReadFile(p); err != nil {
				return err
			}
		}
		files[strings.TrimPrefix(path.Join(dest, filepath.ToSlash(rel)), "/")] = f
		return nil
	})
}

// labelPairs parses a LABEL instruction's key=value pairs (values plain or double-quoted).
func labelPairs(args string) (map[string]string, error) {
	out := map[string]string{}
	s := strings.TrimSpace(args)
	for s != "" {
		k, rest, ok := strings.Cut(s, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return nil, fmt.Errorf("LABEL %s: want key=value pairs", args)
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				return nil, fmt.Errorf("LABEL %s: unterminated quote", args)
			}
			v, rest = rest[1:1+end], rest[2+end:]
		} else {
			v, rest, _ = strings.Cut(rest, " ")
		}
		out[k] = v
		s = strings.TrimSpace(rest)
	}
	return out, nil
}

// checkDockerfile compares the Dockerfile at file with img, an image of renderqueue the builder
// produced, and fails t for each difference; makefile is the Makefile, whose image target's go
// build must use the Dockerfile's flags.
func checkDockerfile(t *testing.T, file, makefile string, img *ociImage) {
	t.Helper()
	problems, err := dockerfileProblems(t, file, makefile, img)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// dockerfileProblems lists the differences between the Dockerfile at file and img.
func dockerfileProblems(t *testing.T, file, makefile string, img *ociImage) ([]string, error) {
	t.Helper()
	var problems []string
	problem := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	d, err := readDockerfile(file)
	if err != nil {
		return nil, err
	}
	if d.finalFrom != "scratch" {
		problem("the final stage is FROM %s, want scratch (the base's files come from hack/image)", d.finalFrom)
	}

	// The binary: built the same way as by make image.
	mk, err := os.ReadFile(makefile)
	if err != nil {
		return nil, err
	}
	_, recipe, _ := strings.Cut(string(mk), "\nimage:")
	recipe, _, _ = strings.Cut(recipe, "\n\n")
	for _, flag := range []string{"CGO_ENABLED=0", "-trimpath", "-buildvcs=false", `-ldflags "-s -w -X main.version=`} {
		if !strings.Contains(d.goBuild, flag) {
			problem("the Dockerfile's go build lacks %s: %s", flag, d.goBuild)
		}
		if !strings.Contains(recipe, flag) {
			problem("make image's go build lacks %s", flag)
		}
	}

	// The files the final stage's COPY instructions give, from what rootfs writes.
	tmp := t.TempDir()
	var stderr bytes.Buffer
	if err := run([]string{"rootfs", "-out", filepath.Join(tmp, "base")}, &stderr, &stderr); err != nil {
		return nil, fmt.Errorf("rootfs: %w\n%s", err, stderr.String())
	}
	fakeBin := filepath.Join(tmp, "renderqueue")
	if err := os.WriteFile(fakeBin, []byte("binary"), 0o755); err != nil {
		return nil, err
	}
	// go build writes its output 0755 under the build stage's umask (022).
	if err := os.Chmod(fakeBin, 0o755); err != nil {
		return nil, err
	}
	resolve := func(src string) (string, bool, error) {
		if src == d.binary {
			return fakeBin, true, nil
		}
		if rel, ok := strings.CutPrefix(src, d.rootfsOut); ok {
			return filepath.Join(tmp, "base", filepath.FromSlash(rel)), false, nil
		}
		return "", false, fmt.Errorf("COPY source %s is neither the rootfs output %s nor the binary %s", src, d.rootfsOut, d.binary)
	}
	files := map[string]modelFile{}
	labels := map[string]string{}
	var entrypoint []string
	// BuildKit gives an image FROM scratch the default PATH; ENV adds to it.
	env := []string{defaultPath}
	user := ""
	for _, in := range d.final {
		switch in.cmd {
		case "ARG":
		case "COPY":
			if err := copyModel(files, in.args, resolve); err != nil {
				return nil, fmt.Errorf("Dockerfile line %d: %w", in.line, err)
			}
		case "LABEL":
			pairs, err := labelPairs(in.args)
			if err != nil {
				return nil, fmt.Errorf("Dockerfile line %d: %w", in.line, err)
			}
			for k, v := range pairs {
				labels[k] = v
			}
		case "USER":
			user = in.args
		case "ENV":
			k, v, ok := strings.Cut(in.args, "=")
			if !ok || strings.ContainsAny(in.args, " \t\"") {
				return nil, fmt.Errorf("Dockerfile line %d: want ENV KEY=value, one per instruction, unquoted", in.line)
			}
			env = append(env, k+"="+v)
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &entrypoint); err != nil {
				problem("Dockerfile line %d: ENTRYPOINT is not in exec (JSON) form: %v", in.line, err)
			}
		default:
			// CMD, WORKDIR, RUN, ... would give the image something make image's has not.
			problem("Dockerfile line %d: %s in the final stage is not compared with the image; add it to both or neither", in.line, in.cmd)
		}
	}

	cfg := img.config.Config
	if !reflect.DeepEqual(entrypoint, cfg.Entrypoint) {
		problem("Dockerfile ENTRYPOINT %q, the image's %q", entrypoint, cfg.Entrypoint)
	}
	if !reflect.DeepEqual(env, cfg.Env) {
		problem("Dockerfile environment %q, the image's %q", env, cfg.Env)
	}
	if user != cfg.User {
		problem("Dockerfile USER %q, the image's %q", user, cfg.User)
	}
	var dkeys, ikeys []string
	for k, v := range labels {
		dkeys = append(dkeys, k)
		if !strings.Contains(v, "$") && cfg.Labels[k] != v {
			problem("Dockerfile LABEL %s=%q, the image's %q", k, v, cfg.Labels[k])
		}
	}
	for k := range cfg.Labels {
		ikeys = append(ikeys, k)
	}
	sort.Strings(dkeys)
	sort.Strings(ikeys)
	if !reflect.DeepEqual(dkeys, ikeys) {
		problem("Dockerfile labels %v, the image's %v", dkeys, ikeys)
	}

	for name, f := range files {
		e, ok := img.files[name]
		if !ok {
			problem("the Dockerfile gives /%s, the image has no such file", name)
			continue
		}
		if got := fileMode(e.hdr); got != f.mode || e.hdr.Uid != f.uid || e.hdr.Gid != f.gid {
			problem("/%s: the Dockerfile gives %v %d:%d, the image has %v %d:%d", name, f.mode, f.uid, f.gid, got, e.hdr.Uid, e.hdr.Gid)
		}
		if f.mode.IsRegular() && !f.binary && !bytes.Equal(f.data, e.data) {
			problem("/%s: the Dockerfile's content differs from the image's", name)
		}
		if f.binary && "/"+name != cfg.Entrypoint[0] {
			problem("the Dockerfile puts the binary at /%s, the image's entrypoint is %s", name, cfg.Entrypoint[0])
		}
	}
	for name := range img.files {
		if _, ok := files[name]; !ok {
			problem("the image has /%s, the Dockerfile does not give it", name)
		}
	}
	return problems, nil
}

// TestDockerfile checks the Dockerfile against an image built here with a stand-in binary and
// make image's settings (TestMakeImage checks it against make image's own output).
func TestDockerfile(t *testing.T) {
	dir := t.TempDir()
	s := fakeSpec(t, dir)
	s.Labels["org.opencontainers.image.source"] = "https://github.com/renderqueue/renderqueue"
	buildInto(t, s, dir)
	a := readArchive(t, filepath.Join(dir, "out", "image.oci.tar"))
	checkDockerfile(t, "../../Dockerfile", "../../Makefile", a.images["linux/amd64"])
}

// TestDockerfileDisagreements shows that checkDockerfile notices a Dockerfile that differs from
// the image: each edit of the real Dockerfile below must give at least one problem.
func TestDockerfileDisagreements(t *testing.T) {
	dir := t.TempDir()
	s := fakeSpec(t, dir)
	s.Labels["org.opencontainers.image.source"] = "https://github.com/renderqueue/renderqueue"
	buildInto(t, s, dir)
	img := readArchive(t, filepath.Join(dir, "out", "image.oci.tar")).images["linux/amd64"]
	orig, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	edits := map[string][2]string{
		"home without --chown": {"--chown=65532:65532 ", ""},
		"another user":         {"USER 65532:65532", "USER 65534:65534"},
		"another entrypoint":   {`ENTRYPOINT ["/renderqueue"]`, `ENTRYPOINT ["/renderqueue", "operator"]`},
		"an ENV":               {"USER 65532:65532", "ENV GODEBUG=x509sha1=1\nUSER 65532:65532"},
		"no SSL_CERT_FILE":     {"ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt", ""},
		"a WORKDIR":            {"USER 65532:65532", "WORKDIR /home/nonroot\nUSER 65532:65532"},
		"a label less":         {`      org.opencontainers.image.created="${CREATED}"`, `      org.opencontainers.image.url="x"`},
		"a distroless base":    {"\nFROM scratch\n", "\nFROM gcr.io/distroless/static:nonroot\n"},
		"the binary elsewhere": {"/out/renderqueue /renderqueue", "/out/renderqueue /usr/bin/renderqueue"},
		"cgo":                  {"CGO_ENABLED=0 ", ""},
	}
	for name, e := range edits {
		t.Run(name, func(t *testing.T) {
			if !bytes.Contains(orig, []byte(e[0])) {
				t.Fatalf("the Dockerfile has no %q to edit", e[0])
			}
			edited := bytes.Replace(orig, []byte(e[0]), []byte(e[1]), 1)
			file := filepath.Join(t.TempDir(), "Dockerfile")
			if err := os.WriteFile(file, edited, 0o644); err != nil {
				t.Fatal(err)
			}
			problems, err := dockerfileProblems(t, file, "../../Makefile", img)
			if err == nil && len(problems) == 0 {
				t.Error("checkDockerfile found nothing wrong")
			}
		})
	}
	if got, _ := labelPairs(`a="b c" d=e`); !reflect.DeepEqual(got, map[string]string{"a": "b c", "d": "e"}) {
		t.Errorf("labelPairs = %v", got)
	}
}
