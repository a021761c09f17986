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
// where it has any.
func TestHelp(t *testing.T) {
	for name := range commands() {
		for _, h := range []string{"-h", "--help"} {
			var out, errb bytes.Buffer
			code := run([]string{name, h}, &out, &errb)
			help := out.String() + errb.String()
			if code != 0 {
				t.Errorf("renderqueue %s %s: exit %d, want 0; output:\n%s", name, h, code, help)
			}
			if !strings.Contains(strings.ToLower(help), "usage") || strings.Contains(help, "help requested") {
				t.Errorf("renderqueue %s %s printed no usage:\n%s", name, h, help)
			}
		}
	}
	// schema's subcommand has flags of its own
	var out, errb bytes.Buffer
	if code := run([]string{"schema", "migrate", "--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "-dsn") {
		t.Errorf("renderqueue schema migrate --help: exit %d, output:\n%s", code, errb.String())
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
