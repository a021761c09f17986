package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestKeeperPolicyFlags: bad floors, reschedule policies and walk rates stop the standalone keeper
// before it connects to anything.
func TestKeeperPolicyFlags(t *testing.T) {
	base := []string{"keeper", "--dsn", "host=/nonexistent", "--insecure-no-auth"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--floor", "96h/crawler=0.1"}, `unknown source "crawler"`},
		{[]string{"--floor", "96h/discovered"}, "want CADENCE/SOURCE=SHARE"},
		{[]string{"--floor", "96h/discovered=0"}, "share must be within (0, 1]"},
		{[]string{"--floor", "1h/submitted=0.6", "--floor", "24h/submitted=0.6"}, "must not sum past 1"},
		{[]string{"--floor", "1h/submitted=0.1,60m/submitted=0.1"}, "more than one floor"},
		{[]string{"--reschedule", "phase"}, "unknown reschedule policy"},
		{[]string{"--verify-walk-rate", "-1"}, "--verify-walk-rate -1 is negative"},
	} {
		var out, errb bytes.Buffer
		if code := run(append(append([]string{}, base...), c.args...), &out, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("keeper %v: code %d, stderr %q, want %q", c.args, code, errb.String(), c.want)
		}
		if strings.Contains(errb.String(), "opening the store") {
			t.Errorf("keeper %v: reached the store before rejecting the policy", c.args)
		}
	}
}

// TestKeeperHTTPLimitFlags: negative HTTP limits stop the keeper before it connects to anything.
func TestKeeperHTTPLimitFlags(t *testing.T) {
	base := []string{"keeper", "--dsn", "host=/nonexistent", "--insecure-no-auth"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--http-read-timeout", "-1s"}, "read timeout -1s is negative"},
		{[]string{"--http-idle-timeout", "-5s"}, "idle timeout -5s is negative"},
		{[]string{"--max-in-flight", "-1"}, "max in-flight requests -1 is negative"},
		{[]string{"--max-in-flight-bytes", "-1"}, "max in-flight bytes -1 is negative"},
	} {
		var out, errb bytes.Buffer
		if code := run(append(append([]string{}, base...), c.args...), &out, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("keeper %v: code %d, stderr %q, want %q", c.args, code, errb.String(), c.want)
		}
	}
}
