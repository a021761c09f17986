package wait

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPollSaysWhatAndWhy(t *testing.T) {
	calls := 0
	err := Poll(context.Background(), 50*time.Millisecond, 5*time.Millisecond, "the thing", func(context.Context) (bool, string, error) {
		calls++
		return false, "not yet", nil
	})
	if err == nil || !strings.Contains(err.Error(), "waiting for the thing: not after 50ms (not yet)") || calls < 2 {
		t.Errorf("after %d calls: %v", calls, err)
	}
	if err := Poll(context.Background(), time.Minute, time.Millisecond, "x", func(context.Context) (bool, string, error) { return true, "", nil }); err != nil {
		t.Errorf("a condition that holds: %v", err)
	}
	boom := errors.New("boom")
	if err := Poll(context.Background(), time.Minute, time.Millisecond, "x", func(context.Context) (bool, string, error) { return false, "", boom }); !errors.Is(err, boom) {
		t.Errorf("a failing condition: %v", err)
	}
}

func TestSleep(t *testing.T) {
	kick := make(chan struct{})
	close(kick)
	if !Sleep(context.Background(), time.Hour, kick) {
		t.Error("a kick ended the sleep as if ctx had ended")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour, nil) {
		t.Error("an ended ctx did not end the sleep with false")
	}
	if !Sleep(context.Background(), time.Millisecond, nil) {
		t.Error("a sleep that ran its time returned false")
	}
}
