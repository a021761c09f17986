// Command renderqueue is the one binary of the project: the operator, the keeper shard, database
// migrations and the tools users run (seed, worker-sim). Each subcommand lives in its own file here,
// or for the tools bench, simulate and worker-sim in internal/cli, and only parses flags and wires
// packages together; the logic lives under pkg/ and controllers/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/renderqueue/renderqueue/internal/cli"
)

// command is one subcommand: a one-line summary and its entry point, which gets the arguments
// after the subcommand's name.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands lists the subcommands. New subcommands add themselves here.
func commands() map[string]command {
	return map[string]command{
		"explain":    {summary: "what the shards know of one row: held or why not, lease, rank, estimated claim (explain NAME KEY -n NS, or --url URL KEY)", run: runExplain},
		"bench":      {summary: "end-to-end throughput: a keeper over HTTP against a SKIP LOCKED queue (bench --dsn ...)", run: cli.Bench},
		"keeper":     {summary: "run one keeper shard (standalone: all slots, flags)", run: runKeeper},
		"operator":   {summary: "run the RenderQueue operator (controller-runtime manager)", run: runOperator},
		"schema":     {summary: "migrate the database schema (schema migrate --dsn ...)", run: runSchema},
		"seed":       {summary: "write synthetic schedule rows (seed --dsn ... --rows N)", run: runSeed},
		"worker-sim": {summary: "simulated render workers claiming from keeper shards (worker-sim --shard URL)", run: cli.WorkerSim},
		"status":     {summary: "print a RenderQueue's shards (status NAME -n NS) or shards' /v1/status (status --url URL)", run: runStatus},
		"simulate":   {summary: "the keeper core on virtual time: how late each class renders with N workers (simulate --load 0.8)", run: cli.Simulate},
		"upsert":     {summary: "add or change schedule rows given as NDJSON on stdin (upsert --dsn ...)", run: runUpsert},
		"version":    {summary: "print the version", run: runVersion},
	}
}

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.Usage = func() { _, _ = fmt.Fprintln(fs.Output(), "usage: renderqueue version") }
	if err := cli.ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	_, err := fmt.Fprintln(stdout, "renderqueue", version)
	return err
}

func usage(w io.Writer, cmds map[string]command) {
	_, _ = fmt.Fprintln(w, "usage: renderqueue <command> [flags]")
	_, _ = fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		_, _ = fmt.Fprintf(w, "  %-12s %s\n", n, cmds[n].summary)
	}
}

func main() {
	if strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe") == completeName {
		runComplete(context.Background(), os.Args[1:], os.Stdout) // linked as the plugin's completion
		return
	}
	os.Exit(run(pluginArgs(os.Args), os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 {
		usage(stderr, cmds)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout, cmds) // asked for: the answer, on stdout
		return 0
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		_, _ = fmt.Fprintf(stderr, "renderqueue: unknown command %q\n\n", args[0])
		usage(stderr, cmds)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h or --help: the flag set has printed the usage
			return 0
		}
		msg := fmt.Sprintf("renderqueue %s: %v", args[0], err)
		cli.ReportError(stderr, msg) // a JSON line when the command logs JSON
		writeTerminationMessage(terminationMessagePath, msg)
		return 1
	}
	return 0
}

// terminationMessagePath is where Kubernetes reads a container's termination message from (the
// default terminationMessagePath); the kubelet mounts it into every container.
const terminationMessagePath = "/dev/termination-log"

// writeTerminationMessage writes msg to the termination message file at path when it exists, so
// that the Pod's status (lastState.terminated.message) and the operator's shard status say why
// the process exited. Outside Kubernetes the file does not exist and nothing is written: it is
// never created.
func writeTerminationMessage(path, msg string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return
	}
	_, _ = f.WriteString(msg + "\n")
	_ = f.Close()
}
