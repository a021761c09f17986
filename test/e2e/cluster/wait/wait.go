// Package wait has the two ways the local cluster waits: Poll, for a condition to hold (a process
// to answer, an object to reach a state) within a timeout, with an error that says what was
// awaited and why it did not happen; and Sleep, for a period that something may cut short.
package wait

import (
	"context"
	"fmt"
	"time"
)

// Poll calls cond every interval until it returns true or an error, or until timeout; the error
// then says what was awaited and the last reason cond gave.
func Poll(ctx context.Context, timeout, interval time.Duration, what string, cond func(context.Context) (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		ok, why, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if why != "" {
			last = why
		}
		select {
		case <-ctx.Done():
			if last == "" {
				last = ctx.Err().Error()
			}
			return fmt.Errorf("waiting for %s: not after %s (%s)", what, timeout, last)
		case <-time.After(interval):
		}
	}
}

// Sleep blocks for d, or until ctx ends or kick fires (a nil kick never does); false when ctx
// ended.
func Sleep(ctx context.Context, d time.Duration, kick <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-kick:
	}
	return true
}
