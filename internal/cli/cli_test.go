package cli

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
)

func TestParseShapes(t *testing.T) {
	got, err := parseShapes("8x100, 16x100,8x500")
	if err != nil || len(got) != 3 || got[1].Workers != 16 || got[2].Batch != 500 {
		t.Fatalf("parseShapes = %v, %v", got, err)
	}
	for _, bad := range []string{"", "8", "8x", "x100", "8*100", "8x100,"} {
		if _, err := parseShapes(bad); err == nil {
			t.Errorf("parseShapes(%q): no error", bad)
		}
	}
}

func TestWorkerServerName(t *testing.T) {
	for _, c := range []struct {
		flag, dns, rq, ns, want string
	}{
		{"given.example", "web-shards.team-a.svc:8080", "web", "team-a", "given.example"},
		{"", "", "web", "team-a", "web-shards.team-a.svc"},
		{"", "web-shards.team-a.svc.cluster.local.:8080", "", "", "web-shards.team-a.svc.cluster.local"},
		{"", "", "", "", ""},
	} {
		if got := workerServerName(c.flag, c.dns, c.rq, c.ns); got != c.want {
			t.Errorf("workerServerName(%q, %q, %q, %q) = %q, want %q", c.flag, c.dns, c.rq, c.ns, got, c.want)
		}
	}
}

func TestFloorAndRescheduleFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var floors FloorFlags
	fs.Var(&floors, "floor", "")
	resched := RescheduleFlag{Policy: policy.KeepPhase}
	fs.Var(&resched, "reschedule", "")
	if err := fs.Parse([]string{"--floor", "96h/discovered=0.05, 24h/submitted=0.1", "--floor", "1h/discovered=0.2", "--reschedule", "AfterRender"}); err != nil {
		t.Fatal(err)
	}
	if len(floors) != 3 || resched.Policy != policy.AfterRender {
		t.Fatalf("floors %v, reschedule %v", floors, resched.Policy)
	}
	if got := floors.String(); strings.Count(got, ",") != 2 || !strings.Contains(got, "0.05") {
		t.Errorf("floors.String() = %q", got)
	}
	for _, bad := range [][]string{{"--floor", "96h=0.05"}, {"--reschedule", "Never"}} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(&bytes.Buffer{})
		fs.Var(&FloorFlags{}, "floor", "")
		fs.Var(&RescheduleFlag{}, "reschedule", "")
		if err := fs.Parse(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestReadToken(t *testing.T) {
	t.Setenv("RENDERQUEUE_TOKEN", "  from-env\n")
	if tok, err := ReadToken(""); err != nil || tok != "from-env" {
		t.Errorf("ReadToken(\"\") = %q, %v", tok, err)
	}
	dir := t.TempDir()
	file, empty := filepath.Join(dir, "token"), filepath.Join(dir, "empty")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := ReadToken(file); err != nil || tok != "from-file" {
		t.Errorf("ReadToken(file) = %q, %v", tok, err)
	}
	for _, f := range []string{empty, filepath.Join(dir, "missing")} {
		if _, err := ReadToken(f); err == nil {
			t.Errorf("ReadToken(%s): no error", f)
		}
	}
}

func TestRESTConfigMissingFile(t *testing.T) {
	if _, err := RESTConfig(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "loading kubeconfig") {
		t.Errorf("RESTConfig(missing) = %v", err)
	}
}

func TestSimulateCapacityFlags(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		{},
		{"--load", "0.8", "--capacity", "100"},
		{"--workers", "3"},
		{"--load", "0"},
		{"--fleet", "f.yaml", "--rows", "10", "--load", "1"},
		{"--load", "1", "--order", "fifo"},
	} {
		var out, errb bytes.Buffer
		if err := Simulate(ctx, args, &out, &errb); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	var out, errb bytes.Buffer
	if err := Simulate(ctx, []string{"--rows", "1000", "--homepages", "10", "--workers", "2", "--render-time", "10s", "--duration", "6h", "--order", "keeper,oldest-due"}, &out, &errb); err != nil {
		t.Fatalf("simulate: %v (%s)", err, errb.String())
	}
	if !strings.Contains(out.String(), "comparison:") {
		t.Errorf("two orders without a comparison:\n%s", out.String())
	}
}

// TestBenchRoundsFlag: a round count outside 1..100 is refused before anything is started (the
// DSN names no server: a run would fail on connecting, with another error).
func TestBenchRoundsFlag(t *testing.T) {
	for _, n := range []string{"0", "-1", "101"} {
		var out, errb bytes.Buffer
		err := Bench(context.Background(), []string{"--dsn", "host=/nonexistent", "--rounds", n}, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), "--rounds "+n) {
			t.Errorf("--rounds %s: %v, want the flag refused", n, err)
		}
	}
}

// TestStartKeeperProcess starts a stand-in for the binary (a shell script that prints its
// arguments and waits) and stops it: the arguments and environment are the keeper's, Stop
// ends the process with SIGTERM, and Exited reports its end.
func TestStartKeeperProcess(t *testing.T) {
	self := filepath.Join(t.TempDir(), "renderqueue")
	if err := os.WriteFile(self, []byte("#!/bin/sh\necho \"$@ $RENDERQUEUE_TOKEN\"\nexec sleep 60\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	k, err := startKeeperProcess(context.Background(), self, "postgres://db", "tok", true, pw)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(k.URL, "http://127.0.0.1:") || k.PID == 0 {
		t.Errorf("keeper %+v", k)
	}
	got, err := bufio.NewReader(pr).ReadString('\n') // the script's first line: verbose passes its output on
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	want := "keeper --dsn postgres://db --listen " + strings.TrimPrefix(k.URL, "http://") + " --window 0 --name bench tok\n"
	if got != want {
		t.Errorf("arguments %q, want %q", got, want)
	}
	if err := k.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case err := <-k.Exited:
		if err == nil {
			t.Error("Exited = nil, want the SIGTERM exit")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Exited did not report")
	}
}
