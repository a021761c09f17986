package runtime

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/process"
)

// containerScript is run by bash as root in the container's new mount, UTS and IPC namespaces.
// It builds the container's root filesystem — an overlay of this machine's root filesystem
// (read-only lower layer) with a fresh tmpfs as the writable layer, so nothing a container
// writes or mounts touches the machine's filesystem — pivots into it, mounts /proc, /sys, a
// private /dev (tmpfs with the standard devices and /dev/shm) and the bind mounts, sets the
// hostname, remounts / read-only for readOnlyRootFilesystem and execs the rest of its arguments
// (setpriv ... -- env -i ... ENTRYPOINT ARGS), which keeps the pid. Everything comes in as
// positional parameters, never interpolated into the script:
//
//	$1 root mount point   $2 writable layer mount point   $3 hostname   $4 working directory
//	then operations:  bind SRC DST dir|file ro|rw|rox  ...  [rofs]  exec COMMAND...
//
// SRC is a path of this machine; DST a path in the container. Setup errors are written to fd 3
// (and the script exits 1); "ok" is written there right before the exec.
const containerScript = `set -u
fail() { printf '%s\n' "$*" >&3; exit 1; }
run() { local out; out=$("$@" 2>&1) || fail "$*: $out"; }
root=$1 layer=$2 host=$3 workdir=$4
shift 4
run mount --make-rprivate /
run mount -t tmpfs -o mode=0755 container-layer "$layer"
run mkdir "$layer/upper" "$layer/work"
run mount -t overlay container-root -o "lowerdir=/,upperdir=$layer/upper,workdir=$layer/work" "$root"
run mkdir -p "$root/.oldroot"
cd "$root" || fail "cd $root"
run pivot_root . .oldroot
cd / || fail "cd /"
run mount -t proc proc /proc
run mount -t sysfs -o ro,nosuid,nodev,noexec sysfs /sys
run mount -t tmpfs -o mode=0755,nosuid,size=65536k dev /dev
run mknod -m 0666 /dev/null c 1 3
run mknod -m 0666 /dev/zero c 1 5
run mknod -m 0666 /dev/full c 1 7
run mknod -m 0666 /dev/random c 1 8
run mknod -m 0666 /dev/urandom c 1 9
run mknod -m 0666 /dev/tty c 5 0
run ln -s /proc/self/fd /dev/fd
run ln -s /proc/self/fd/0 /dev/stdin
run ln -s /proc/self/fd/1 /dev/stdout
run ln -s /proc/self/fd/2 /dev/stderr
run mkdir -m 1777 /dev/shm
run mount -t tmpfs -o mode=1777,nosuid,nodev,noexec,size=65536k shm /dev/shm
rofs=0
while [ $# -gt 0 ]; do
  op=$1
  shift
  case $op in
  bind)
    src=$1 dst=$2 kind=$3 mode=$4
    shift 4
    if [ "$kind" = dir ]; then
      run mkdir -p -- "$dst"
    else
      run mkdir -p -- "$(dirname -- "$dst")"
      [ -e "$dst" ] || run touch -- "$dst"
    fi
    run mount --bind -- "/.oldroot$src" "$dst"
    case $mode in
    ro) run mount --options-mode=ignore -o remount,bind,ro,nosuid,nodev -- "$dst" ;;
    rox) run mount --options-mode=ignore -o remount,bind,ro,nosuid,nodev,exec -- "$dst" ;;
    esac
    ;;
  rofs) rofs=1 ;;
  exec) break ;;
  *) fail "unknown operation $op" ;;
  esac
done
run umount -l /.oldroot
run rmdir /.oldroot
printf '%s' "$host" >/proc/sys/kernel/hostname || fail "setting the hostname to $host"
run mkdir -p -- "$workdir"
cd -- "$workdir" || fail "cd $workdir"
if [ "$rofs" = 1 ]; then run mount --options-mode=ignore -o remount,bind,ro /; fi
echo ok >&3
exec 3>&-
exec "$@"
`

// Mount modes of a BindMount.
const (
	// ReadWrite mounts read-write.
	ReadWrite = "rw"
	// ReadOnly mounts read-only, nosuid, nodev.
	ReadOnly = "ro"
	// ReadOnlyExec mounts read-only, nosuid, nodev, but executable (the image's program).
	ReadOnlyExec = "rox"
)

// BindMount is a bind mount into a container.
type BindMount struct {
	// Src is a path of this machine; Dst the path in the container.
	Src, Dst string
	// File is true when Src is a file (Dst is then created as an empty file, else as a
	// directory).
	File bool
	// Mode is ReadWrite, ReadOnly or ReadOnlyExec.
	Mode string
}

// ContainerConfig is everything a container instance is started with. The root filesystem is
// always this machine's (see the package documentation).
type ContainerConfig struct {
	// Argv is the command line; Argv[0] is the entrypoint path in the container, where Binary is
	// mounted (by a BindMount of the caller's).
	Argv []string
	// Binary is the local program that runs; BinaryArgs go between Argv[0] and Argv[1:] (see
	// Image).
	Binary     string
	BinaryArgs []string
	// Env is the whole environment (NAME=value): nothing of this process's is passed on.
	Env []string
	// UID, GID and Groups are the credentials the entrypoint runs with.
	UID, GID int64
	Groups   []int64
	// NoNewPrivs sets no_new_privs (allowPrivilegeEscalation: false).
	NoNewPrivs bool
	// Bounding is setpriv's --bounding-set value; "" keeps every capability (privileged).
	Bounding string
	// ReadOnlyRoot remounts / read-only (readOnlyRootFilesystem).
	ReadOnlyRoot bool
	// HostIPC keeps this machine's IPC namespace.
	HostIPC bool
	// Hostname is set in the container's UTS namespace.
	Hostname string
	// WorkingDir is created if missing and the entrypoint's working directory.
	WorkingDir string
	// Mounts are bind-mounted after the root filesystem is set up, parents before children.
	Mounts []BindMount
}

// command is the bash command line that runs cfg in a new container; rootDir and layerDir are
// empty directories of the container's own.
func (cfg *ContainerConfig) command(rootDir, layerDir string) []string {
	args := []string{"-c", containerScript, "container-init", rootDir, layerDir, cfg.Hostname, cfg.WorkingDir}
	mounts := append([]BindMount(nil), cfg.Mounts...)
	// Parents before children (as container runtimes sort them).
	sort.SliceStable(mounts, func(i, j int) bool {
		return strings.Count(path.Clean(mounts[i].Dst), "/") < strings.Count(path.Clean(mounts[j].Dst), "/")
	})
	for _, m := range mounts {
		kind := "dir"
		if m.File {
			kind = "file"
		}
		args = append(args, "bind", m.Src, m.Dst, kind, m.Mode)
	}
	if cfg.ReadOnlyRoot {
		args = append(args, "rofs")
	}
	args = append(args, "exec", "setpriv",
		"--reuid="+strconv.FormatInt(cfg.UID, 10), "--regid="+strconv.FormatInt(cfg.GID, 10))
	if len(cfg.Groups) > 0 {
		gs := make([]string, len(cfg.Groups))
		for i, g := range cfg.Groups {
			gs[i] = strconv.FormatInt(g, 10)
		}
		args = append(args, "--groups="+strings.Join(gs, ","))
	} else {
		args = append(args, "--clear-groups")
	}
	if cfg.NoNewPrivs {
		args = append(args, "--no-new-privs")
	}
	args = append(args, "--inh-caps=-all")
	if cfg.Bounding != "" {
		args = append(args, "--bounding-set="+cfg.Bounding)
	}
	// setpriv re-arms the parent-death signal after changing the credentials (which clears
	// it), so the container dies with the runner.
	args = append(args, "--pdeathsig=KILL", "--", "env", "-i", "--")
	args = append(args, cfg.Env...)
	args = append(args, cfg.Argv[0])
	args = append(args, cfg.BinaryArgs...)
	args = append(args, cfg.Argv[1:]...)
	return args
}

// startError is a container that could not be started (the runtime's StartError).
type startError struct{ msg string }

func (e *startError) Error() string { return e.msg }

// StartContainer starts cfg as a new container instance, called name in logs and errors, logging
// to logPath (and to tee, line-prefixed, when not nil), and waits until its setup is done and the
// entrypoint is being exec'd. rootDir and layerDir are directories of the instance's own (created
// if missing): the mount points of its root filesystem and of its writable layer. A setup that
// fails is an error whose message says why (kubelet's StartError); the process is then gone.
func StartContainer(name string, cfg *ContainerConfig, rootDir, layerDir, logPath string, tee io.Writer) (*process.Process, error) {
	for _, d := range []string{rootDir, layerDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating a pipe: %w", err)
	}
	defer func() { _ = pr.Close() }()
	cmd := exec.Command("/bin/bash", cfg.command(rootDir, layerDir)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	cmd.ExtraFiles = []*os.File{pw}
	flags := uintptr(syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC)
	if cfg.HostIPC {
		flags &^= syscall.CLONE_NEWIPC
	}
	p, err := process.StartCmd(name, cmd, logPath, tee, flags)
	_ = pw.Close()
	if err != nil {
		return nil, err
	}
	line, rerr := bufio.NewReader(pr).ReadString('\n')
	line = strings.TrimSpace(line)
	if line == "ok" {
		return p, nil
	}
	p.Stop(time.Second)
	if line == "" {
		line = fmt.Sprintf("container setup ended without a word (%v); see %s", rerr, logPath)
	}
	return nil, &startError{msg: "starting the container: " + line}
}

// ExitCode is the exit code in a Wait error (0 for nil, 128+signal for a signalled process as
// container runtimes report it, -1 when unknown).
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1
}
