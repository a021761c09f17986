package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/simulate"
)

func TestSimulate(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"simulate", "--rows", "2000", "--homepages", "10", "--load", "0.8", "--duration", "24h",
		"--order", "all", "--floor", "96h/discovered=0.05", "--reschedule", "AfterRender"}
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("simulate: code %d, stderr %q", code, errb.String())
	}
	for _, want := range []string{
		"order keeper; submittedBoost 2, urgentMaxShare 0.2, reschedule AfterRender, floors 96h/discovered=0.05, starvation bound 0.5 cadence",
		"order oldest-due (baseline, not the keeper); reschedule AfterRender",
		"order class-priority (baseline, not the keeper)",
		"fleet: 2,000 rows in 6 classes", "(load 80%)",
		"p99 rel", "longest wait", "not rendered in last cadence", "due over time", "comparison:",
		"1h/submitted", "96h/discovered",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	fleet := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(fleet, []byte("classes:\n  - {name: home, rows: 100, cadence: 1h, source: submitted}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"simulate", "--fleet", fleet, "--workers", "2", "--render-time", "30s", "--duration", "3h"}, &out, &errb); code != 0 {
		t.Fatalf("simulate --fleet: code %d, stderr %q", code, errb.String())
	}
	if !strings.Contains(out.String(), "capacity 240 renders/h") || !strings.Contains(out.String(), "home") ||
		!strings.Contains(out.String(), "reschedule Adaptive, floors none, starvation bound 0.5 cadence") {
		t.Errorf("simulate --fleet output:\n%s", out.String())
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "give the render capacity one way"},
		{[]string{"--load", "1", "--capacity", "100"}, "give the render capacity one way"},
		{[]string{"--workers", "3"}, "--workers and --render-time go together"},
		{[]string{"--load", "0"}, "--load 0 must be > 0"},
		{[]string{"--load", "1", "--floor", "96h/sitemap=0.1"}, `unknown source "sitemap"`},
		{[]string{"--load", "1", "--floor", "96h/discovered=0.7,24h/discovered=0.7"}, "must not sum past 1"},
		{[]string{"--load", "1", "--reschedule", "keep-phase"}, "unknown reschedule policy"},
		{[]string{"--load", "1", "--starvation-bound", "-1"}, "starvationBound -1"},
		{[]string{"--load", "1", "--order", "fifo"}, `unknown order "fifo"`},
		{[]string{"--load", "1", "--fleet", fleet, "--rows", "10"}, "--rows describes the seed mix"},
		{[]string{"--load", "1", "--fleet", "/nonexistent.yaml"}, "reading the fleet"},
		{[]string{"--load", "1", "--duration", "0s"}, "duration 0s"},
		{[]string{"--load", "1", "--max-workers", "5"}, "--max-workers bounds the search of --objectives"},
		{[]string{"--load", "1", "--objectives", "/nonexistent.yaml"}, "reading the objectives"},
		{[]string{"--load", "1", "--objectives", fleet}, "no objectives"},
	} {
		errb.Reset()
		out.Reset()
		if code := run(append([]string{"simulate"}, c.args...), &out, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("simulate %v: code %d, stderr %q, want %q", c.args, code, errb.String(), c.want)
		}
	}
}

// TestSimulateDefaultsAreTheKeepers: `renderqueue simulate` with no policy flag runs the policy a
// keeper runs with when nothing is set — the RenderQueue API's defaults, which the standalone
// keeper's flags take too — and the starvation bound every keeper has.
func TestSimulateDefaultsAreTheKeepers(t *testing.T) {
	boost, share, resched, err := apiPolicyDefaults()
	if err != nil {
		t.Fatal(err)
	}
	d := simulate.DefaultKeeper()
	if d.SubmittedBoost != boost || d.UrgentMaxShare != share || d.Reschedule != resched || len(d.Floors) != 0 ||
		d.Reschedule != policy.Adaptive || d.StarvationBound != policy.DefaultStarvationBound {
		t.Errorf("simulate.DefaultKeeper() = %+v; the API's defaults are submittedBoost %v, urgentMaxShare %v, reschedule %v", d, boost, share, resched)
	}
}

// TestSimulateObjectives: `renderqueue simulate --objectives` prints how the run keeps each
// objective, then searches the fewest workers that keep them all, and the count it prints keeps
// them in a run of its own while one worker fewer does not.
func TestSimulateObjectives(t *testing.T) {
	dir := t.TempDir()
	objs := filepath.Join(dir, "objectives.yaml")
	if err := os.WriteFile(objs, []byte(`objectives:
  - {name: hourly, class: {maxCadence: 1h}, percentile: "99", maxLateness: 10m}
  - {name: slow, class: {minCadence: 24h}, percentile: "95", maxLateness: 12h}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"simulate", "--rows", "5000", "--homepages", "10", "--backlog", "0.2", "--duration", "48h", "--measure-from", "24h",
		"--render-time", "1m", "--objectives", objs}
	var out, errb bytes.Buffer
	if code := run(append(common, "--workers", "1"), &out, &errb); code != 0 {
		t.Fatalf("simulate --objectives: code %d, stderr %q", code, errb.String())
	}
	text := out.String()
	for _, want := range []string{"objectives:", "attainment", "budget left", "hourly", "cadence ≤ 1h", "search (order keeper)", "workers needed: "} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	var n int
	if _, err := fmt.Sscanf(text[strings.Index(text, "workers needed: "):], "workers needed: %d", &n); err != nil || n < 2 {
		t.Fatalf("workers needed: %d, %v\n%s", n, err, text)
	}
	// the count, and one fewer, run on their own
	for workers, kept := range map[int]bool{n: true, n - 1: false} {
		out.Reset()
		if code := run(append(common, "--workers", strconv.Itoa(workers)), &out, &errb); code != 0 {
			t.Fatalf("simulate --workers %d: code %d, stderr %q", workers, code, errb.String())
		}
		run := out.String()[:strings.Index(out.String(), "search (order keeper)")]
		if got := !strings.Contains(run, " NO\n"); got != kept {
			t.Errorf("%d workers keep every objective: %v, want %v:\n%s", workers, got, kept, run)
		}
	}
}
