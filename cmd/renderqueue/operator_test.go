package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestOperatorFlagErrors(t *testing.T) {
	t.Setenv("RENDERQUEUE_IMAGE", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--keeper-image (or RENDERQUEUE_IMAGE) is required"},
		{[]string{"--keeper-image", "img:v1", "--shard-poll-interval", "0s"}, "must be positive"},
		{[]string{"--keeper-image", "img:v1", "extra"}, "unexpected arguments"},
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
	} {
		var stderr bytes.Buffer
		err := runOperator(context.Background(), tc.args, &bytes.Buffer{}, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("runOperator(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
