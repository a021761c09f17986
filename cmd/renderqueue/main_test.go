package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunDispatch(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "renderqueue ") {
		t.Fatalf("version: code %d, out %q, err %q", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run([]string{"no-such-command"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unknown command") {
		t.Fatalf("unknown command: code %d, err %q", code, errb.String())
	}
	if code := run(nil, &out, &errb); code != 2 {
		t.Fatalf("no command: code %d", code)
	}
}

// TestHelp asks every subcommand for help (-h and --help): exit 0 and its usage, naming a flag
// where it has any, on stdout (the answer to a question), nothing on stderr; the long-running
// commands list the logging flags. A flag error goes to stderr, with nothing on stdout.
func TestHelp(t *testing.T) {
	for name := range commands() {
		for _, h := range []string{"-h", "--help"} {
			var out, errb bytes.Buffer
			code := run([]string{name, h}, &out, &errb)
			help := out.String()
			if code != 0 {
				t.Errorf("renderqueue %s %s: exit %d, want 0; output:\n%s%s", name, h, code, help, errb.String())
			}
			if !strings.Contains(strings.ToLower(help), "usage") || strings.Contains(help, "help requested") {
				t.Errorf("renderqueue %s %s printed no usage on stdout:\n%s", name, h, help)
			}
			if errb.Len() > 0 {
				t.Errorf("renderqueue %s %s wrote to stderr:\n%s", name, h, errb.String())
			}
		}
	}
	for _, name := range []string{"operator", "keeper", "worker-sim"} {
		var out, errb bytes.Buffer
		run([]string{name, "--help"}, &out, &errb)
		for _, flag := range []string{"-log-format", "-log-level"} {
			if !strings.Contains(out.String(), flag) {
				t.Errorf("renderqueue %s --help does not list %s:\n%s", name, flag, out.String())
			}
		}
	}
	// schema's subcommand has flags of its own
	var out, errb bytes.Buffer
	if code := run([]string{"schema", "migrate", "--help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "-dsn") {
		t.Errorf("renderqueue schema migrate --help: exit %d, output:\n%s%s", code, out.String(), errb.String())
	}
	// the binary's own usage
	out.Reset()
	errb.Reset()
	if code := run([]string{"--help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "usage: renderqueue") || errb.Len() > 0 {
		t.Errorf("renderqueue --help: exit %d, stdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	// an error is not an answer
	for _, args := range [][]string{{"operator", "--no-such-flag"}, {"status", "--no-such-flag"}, {"keeper", "--log-level", "loud", "--dsn", "x", "--insecure-no-auth"}} {
		out.Reset()
		errb.Reset()
		if code := run(args, &out, &errb); code == 0 || out.Len() > 0 || errb.Len() == 0 {
			t.Errorf("renderqueue %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out.String(), errb.String())
		}
	}
}

func TestWriteTerminationMessage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "termination-log")
	if err := os.WriteFile(path, []byte("an older, longer message\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeTerminationMessage(path, "renderqueue keeper: bad flag")
	if b, err := os.ReadFile(path); err != nil || string(b) != "renderqueue keeper: bad flag\n" {
		t.Errorf("termination log %q, %v", b, err)
	}
	absent := filepath.Join(dir, "absent")
	writeTerminationMessage(absent, "x")
	if _, err := os.Stat(absent); !os.IsNotExist(err) {
		t.Errorf("a termination log was created outside Kubernetes: %v", err)
	}
}
