package statusview

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// canned is a complete example status.
const canned = `{
  "shard": "web-shard-1", "asOf": "2026-11-29T12:00:00.000Z",
  "status": "queued", "complete": true, "exact": true,
  "window": 86400, "verifyInterval": 3600, "verifyWalkRate": 100000,
  "edge": "2026-11-30T11:20:00Z", "edgeAheadSeconds": 84000,
  "gap": null,
  "membership": {"epoch": 7, "owned": "0-340", "incoming": "", "preparedEpoch": 7},
  "rows": {"held": 181234, "invalid": 3, "ownedNotHeld": 512998, "ownedNotHeldAsOf": "2026-11-29T11:40:00Z"},
  "due": 4211, "leased": 120, "duePerSlot": {"0": 12, "1": 9},
  "lateness": {"maxSeconds": 5400, "p50Seconds": 600, "p99Seconds": 4800,
               "maxRelative": 1.5, "p50Relative": 0.1, "p99Relative": 0.9},
  "oldest": {"due": "2026-11-29T10:30:00Z"},
  "byRoute": {"product": 3900, "home": 11, "category": 300},
  "classes": [{"cadence": 345600, "source": "submitted", "due": 2100, "held": 90000,
               "maxLateSeconds": 5400, "lateBy": [2100, 0, 0, 0, 0], "waitingSince": "2026-11-29T11:00:00Z"},
              {"cadence": 3600, "source": "discovered", "due": 11, "held": 150,
               "maxLateSeconds": 5400, "lateBy": [2, 3, 1, 5, 0], "waitingSince": "2026-11-29T10:30:00Z"},
              {"cadence": 345600, "source": "discovered", "due": 1800, "held": 88000}],
  "coming": {"next15m": 80, "next60m": 310, "next24h": 7100, "byHour": [310, 290], "cutAtWindow": false},
  "lastWalk": {"startedAt": "2026-11-29T11:40:00Z", "finishedAt": "2026-11-29T11:40:02.5Z", "partial": false, "failed": false,
               "scanned": 694232, "admitted": 1180, "repaired": 0, "invalid": 3, "unreadSegments": 0},
  "walkingSince": null
}`

const want = `shard web-shard-1 — status QUEUED, exact yes, complete yes (as of 2026-11-29 12:00:00.000Z)
  window 24h, verify interval 1h (walks at 100,000 rows/s); membership epoch 7, owned 0-340
  edge      2026-11-30 11:20:00.000Z (23h20m ahead)
  rows      held 181,234, owned not held 512,998 (as of 2026-11-29 11:40:00.000Z), invalid 3
  due       4,211 (leased 120)
  lateness  p50 10m, p99 1h20m, max 1h30m (relative to cadence: p50 0.10, p99 0.90, max 1.50)
  oldest    due 2026-11-29 10:30:00.000Z (1h30m ago)
  due by class (≤0.1c … >2c: due rows by how many cadences late):
    cadence      source    due    held  max late  ≤0.1c  ≤0.5c  ≤1c  ≤2c  >2c
         1h  discovered     11     150     1h30m      2      3    1    5    0
         4d  discovered  1,800  88,000         –      –      –    –    –    –
         4d   submitted  2,100  90,000     1h30m  2,100      0    0    0    0
  STARVING  1h/discovered: due rows and no render for 1h30m (since 2026-11-29 10:30:00.000Z), longer than its cadence
  due by route: product 3,900, category 300, home 11
  coming    next 15m 80, next 60m 310, next 24h 7,100
  last walk finished, started 2026-11-29 11:40:00.000Z, took 2.5s: scanned 694,232, admitted 1,180, repaired 0, invalid 3, unread segments 0
`

func TestWriteCanned(t *testing.T) {
	var st shardapi.Status
	if err := json.Unmarshal([]byte(canned), &st); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := Write(&b, st); err != nil {
		t.Fatal(err)
	}
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestWriteTroubles(t *testing.T) {
	var st shardapi.Status
	if err := json.Unmarshal([]byte(canned), &st); err != nil {
		t.Fatal(err)
	}
	st.Status, st.Exact, st.Complete = shardapi.StatusUnready, false, false
	behind := -90.0
	st.EdgeAheadSeconds = &behind
	st.Gap = &shardapi.Gap{Since: st.AsOf.Add(-30e9), Reason: "listener connection lost"}
	st.LastWalk.Partial, st.LastWalk.UnreadSegments, st.LastWalk.Error = true, 2, "segment 3: timeout"
	st.WalkingSince = &st.AsOf
	st.Error = "walk failed"
	var b strings.Builder
	if err := Write(&b, st); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"status UNREADY, exact NO, complete NO",
		"ERROR: walk failed",
		"(LAGGING: 1m30s behind now)",
		"gap       since 2026-11-29 11:59:30.000Z, not resumed: listener connection lost",
		"last walk PARTIAL",
		"unread segments 2",
		"error: segment 3: timeout",
		"walking   since 2026-11-29 12:00:00.000Z",
	} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("missing %q in:\n%s", s, b.String())
		}
	}
	// Before the first walk: no edge, no walk.
	var b2 strings.Builder
	if err := Write(&b2, shardapi.Status{Shard: "s", Status: "unready", Window: 86400}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"edge      none yet", "last walk none yet"} {
		if !strings.Contains(b2.String(), s) {
			t.Errorf("missing %q in:\n%s", s, b2.String())
		}
	}
}

// TestWriteWalkRate: the verification walk rate beside the verify interval, "unpaced" at 0, and
// nothing from a keeper that does not report it.
func TestWriteWalkRate(t *testing.T) {
	for _, c := range []struct {
		rate *int
		want string
	}{
		{ptr.To(2_500_000), "verify interval 1h (walks at 2,500,000 rows/s); membership"},
		{ptr.To(0), "verify interval 1h (walks unpaced); membership"},
		{nil, "verify interval 1h; membership"},
	} {
		var b strings.Builder
		if err := Write(&b, shardapi.Status{Shard: "s", Status: "unready", VerifyInterval: 3600, VerifyWalkRate: c.rate}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("missing %q in:\n%s", c.want, b.String())
		}
	}
}

func TestSeconds(t *testing.T) {
	for in, want := range map[float64]string{0: "0s", 0.25: "250ms", 1: "1s", 42.5: "42.5s", 725: "12m5s", 3600: "1h", 600: "10m", 367200: "4d6h",
		12000: "3h20m", 345600: "4d", -90: "-1m30s"} {
		if got := Seconds(in); got != want {
			t.Errorf("Seconds(%v) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4200: "-4,200"} {
		if got := num(in); got != want {
			t.Errorf("num(%d) = %q, want %q", in, got, want)
		}
	}
}
