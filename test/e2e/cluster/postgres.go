package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Postgres is a throwaway PostgreSQL cluster started by hack/postgres.sh, which this type can
// also pause (stop the server, keep the data) and resume on the same port and socket.
type Postgres struct {
	// DSN is the connection string (unix socket of the cluster's directory).
	DSN string
	// PodDSN is the same database over TCP at the node's address: what the Pods use (from their
	// network namespaces, through the bridge).
	PodDSN string

	repo   string
	dir    string
	port   string
	bindir string
}

var dsnHost = regexp.MustCompile(`(?:^|\s)host=(\S+)`)
var dsnPort = regexp.MustCompile(`(?:^|\s)port=(\S+)`)

// StartPostgres starts a throwaway cluster with repo/hack/postgres.sh, listening on listen (an
// address of this machine) as well as on loopback, and trusting TCP clients from clients (a
// CIDR).
func StartPostgres(ctx context.Context, repo, listen, clients string) (*Postgres, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "hack", "postgres.sh"), "start")
	cmd.Env = append(os.Environ(), "RENDERQUEUE_PG_LISTEN="+listen, "RENDERQUEUE_PG_CLIENTS="+clients)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("hack/postgres.sh start: %w\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	dsn := strings.TrimSpace(lines[len(lines)-1])
	pg := &Postgres{DSN: dsn, repo: repo}
	if m := dsnHost.FindStringSubmatch(dsn); m != nil {
		pg.dir = m[1]
	}
	if m := dsnPort.FindStringSubmatch(dsn); m != nil {
		pg.port = m[1]
	}
	if pg.dir == "" || pg.port == "" {
		_ = pg.Stop(ctx)
		return nil, fmt.Errorf("hack/postgres.sh printed an unexpected DSN %q", dsn)
	}
	b, err := os.ReadFile(filepath.Join(pg.dir, "bindir"))
	if err != nil {
		_ = pg.Stop(ctx)
		return nil, fmt.Errorf("reading the cluster's bindir: %w", err)
	}
	pg.bindir = strings.TrimSpace(string(b))
	pg.PodDSN = dsnHost.ReplaceAllStringFunc(dsn, func(m string) string {
		return strings.Replace(m, "host="+pg.dir, "host="+listen, 1)
	})
	return pg, nil
}

// pgCtl runs pg_ctl as the cluster's owner (the postgres user when we are root).
func (pg *Postgres) pgCtl(ctx context.Context, args ...string) error {
	argv := append([]string{filepath.Join(pg.bindir, "pg_ctl"), "-D", filepath.Join(pg.dir, "data")}, args...)
	if os.Geteuid() == 0 {
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Port is the server's TCP port.
func (pg *Postgres) Port() string { return pg.port }

// Pause stops the server (fast shutdown: connections are cut) and keeps its data.
func (pg *Postgres) Pause(ctx context.Context) error {
	return pg.pgCtl(ctx, "-m", "fast", "-w", "-t", "60", "stop")
}

// Resume starts a paused server again on the same port and socket.
func (pg *Postgres) Resume(ctx context.Context) error {
	return pg.pgCtl(ctx, "-l", filepath.Join(pg.dir, "server.log"), "-o", "-p "+pg.port, "-w", "-t", "60", "start")
}

// Stop stops the server and removes the cluster (hack/postgres.sh stop).
func (pg *Postgres) Stop(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(pg.repo, "hack", "postgres.sh"), "stop", pg.DSN)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/postgres.sh stop: %w\n%s", err, out)
	}
	return nil
}
