package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

func TestSchemaMigrate(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	v := postgres.SchemaVersion()
	for i, want := range []string{fmt.Sprintf("schema migrated from version 0 to %d", v), fmt.Sprintf("schema is up to date (version %d)", v)} {
		var out, errb bytes.Buffer
		if code := run([]string{"schema", "migrate", "--dsn", dsn}, &out, &errb); code != 0 || !strings.Contains(out.String(), want) {
			t.Fatalf("run %d: code %d, out %q, err %q; want %q", i+1, code, out.String(), errb.String(), want)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"schema", "migrate"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "--dsn") {
		t.Errorf("without --dsn: code %d, err %q", code, errb.String())
	}
}
