package buildinfo

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCollector(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector("keeper", Info{Version: "v1.2.3", Revision: "abc", GoVersion: "go1.26"}))
	want := `# HELP renderqueue_build_info A constant 1 labelled with the running build: component (operator, keeper), version, revision, goversion.
# TYPE renderqueue_build_info gauge
renderqueue_build_info{component="keeper",goversion="go1.26",revision="abc",version="v1.2.3"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), MetricName); err != nil {
		t.Fatal(err)
	}
}

func TestRead(t *testing.T) {
	info := Read("dev")
	if info.Version != "dev" || info.Revision == "" || !strings.HasPrefix(info.GoVersion, "go") {
		t.Fatalf("Read: %+v", info)
	}
}
